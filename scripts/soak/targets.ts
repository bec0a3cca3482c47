/**
 * The functions as fuzz targets: each with the arbitraries and checks that fit it, and
 * what each prints tallied. The soak and the hostile-input test start the functions with the
 * one system starter (scripts/system/system.ts) and {@link FUZZ_ENV}: admission serves plain
 * HTTP (TLS is the same express app behind `https.createServer`); identity-status is scoped by
 * a label no identity carries, so a fuzzed ping refreshes nothing of anyone else's;
 * mirror-sync is never sent a ping (it would resync the whole shared control plane), every
 * other kind of event it is. The event functions take unsigned events, as
 * components/unsigned-events ships them: the fuzz is aimed at what reads a delivery's body,
 * which the sender check (test/integration/senders.test.ts) would stop first.
 */
import { randomBytes } from 'node:crypto';
import fc from 'fast-check';
import { ADMISSION_BODY_LIMIT } from '../../functions/admission/index.ts';
import { DEFAULT_BODY_LIMIT } from '../../functions/lib/http.ts';
import { EVENT_AUTH_ENV } from '../../functions/lib/senders.ts';
import type { FunctionName } from '../system/functions.ts';
import { parse, type Answer, type FuzzTarget } from './fuzz.ts';
import { hostileReview, knownGoodReview, type FuzzCase } from './hostile.ts';
import { hostileEvents, hostilePrepare, knownGoodEvent, wellFormedEvents } from './hostile-events.ts';

/** A running function's log, kept only as counts by level and the error messages. */
export interface LogTally {
  levels: Record<string, number>;
  errors: string[];
}

/** Empty tallies, one per function. */
export function newTallies(): Record<FunctionName, LogTally> {
  const tally = () => ({ levels: {}, errors: [] });
  return { admission: tally(), 'mirror-sync': tally(), 'identity-status': tally(), 'dead-letters': tally() };
}

/** Counts one output line of a function by level, keeping error messages. */
export function tallyLine(tally: LogTally, line: string): void {
  if (!line) return;
  const e = parse(line) as { level?: string; message?: string; error?: unknown } | undefined;
  const level = e?.level ?? 'unparsed';
  tally.levels[level] = (tally.levels[level] ?? 0) + 1;
  if (level === 'error') tally.errors.push(`${e?.message}: ${String(e?.error).slice(0, 200)}`);
}

/** A scope label no identity carries (identity-status refreshes only what it selects). */
const SCOPE = `captf-fuzz/scope=nothing-${randomBytes(4).toString('hex')}`;

/** The environment each function is fuzzed with (see the file comment). */
export const FUZZ_ENV: Partial<Record<FunctionName, Record<string, string>>> = {
  admission: { CAPTF_ADMISSION_PLAIN_HTTP: 'true', LOG_LEVEL: 'info' },
  'mirror-sync': { [EVENT_AUTH_ENV]: 'off', LOG_LEVEL: 'info' },
  'identity-status': { [EVENT_AUTH_ENV]: 'off', CAPTF_STATUS_IDENTITY_SELECTOR: SCOPE, LOG_LEVEL: 'info' },
  'dead-letters': { [EVENT_AUTH_ENV]: 'off', LOG_LEVEL: 'info' },
};

/** The uid an AdmissionReview body asks to be echoed, when it is a usable one. */
function requestUid(c: FuzzCase): string | undefined {
  const body = c.request.body as { request?: { uid?: unknown } } | undefined;
  const uid = typeof body === 'object' && body !== null ? body.request?.uid : undefined;
  return typeof uid === 'string' && uid !== '' ? uid : undefined;
}

/** admission's own check: a 200 to a POST is an AdmissionReview echoing the uid; a denial has a message. */
export function checkReviewAnswer(c: FuzzCase, a: Answer): string | undefined {
  if (a.status !== 200 || c.request.method !== 'POST') return undefined;
  const r = (parse(a.text) as { apiVersion?: unknown; kind?: unknown; response?: Record<string, unknown> }) ?? {};
  if (r.apiVersion !== 'admission.k8s.io/v1' || r.kind !== 'AdmissionReview' || !r.response)
    return `200 that is not an AdmissionReview: ${a.text.slice(0, 300)}`;
  return checkReviewResponse(r.response, requestUid(c), a.text);
}

/** `response`: the uid echoed, `allowed` a boolean, a denial with a code and a message. */
function checkReviewResponse(resp: Record<string, unknown>, uid: string | undefined, text: string): string | undefined {
  if (uid !== undefined && resp.uid !== uid) return `the answer's uid ${String(resp.uid)} is not the request's ${uid}`;
  if (typeof resp.allowed !== 'boolean') return 'response.allowed is not a boolean';
  if (resp.allowed) return undefined;
  const status = resp.status as { message?: unknown; code?: unknown } | undefined;
  const explained = typeof status?.message === 'string' && status.message !== '' && typeof status.code === 'number';
  return explained ? undefined : `a denial without a message and code: ${text.slice(0, 300)}`;
}

const expectAllowed = (a: Answer, i: number): string | undefined => {
  const resp = (parse(a.text) as { response?: { uid?: string; allowed?: boolean } } | undefined)?.response;
  return a.status === 200 && resp?.allowed === true && resp.uid === `good-${i}`
    ? undefined
    : `HTTP ${a.status} ${a.error ?? ''} ${a.text.slice(0, 200)}`;
};
const expect2xx = (a: Answer): string | undefined =>
  a.status >= 200 && a.status < 300 ? undefined : `HTTP ${a.status} ${a.error ?? ''} ${a.text.slice(0, 200)}`;

/** An event function that takes what `as` would be sent, hostile or well formed; never a 5xx, and a known good event 2xx. */
const eventTarget = (name: FunctionName, url: string, as: 'mirror-sync' | 'identity-status'): FuzzTarget => ({
  name,
  url,
  bodyLimit: DEFAULT_BODY_LIMIT,
  cases: fc.oneof({ arbitrary: hostileEvents(as), weight: 6 }, { arbitrary: wellFormedEvents(as), weight: 3 }),
  knownGood: (i) => knownGoodEvent(as, `good-${i}`),
  checkKnownGood: expect2xx,
});

/**
 * The fuzz targets of the running functions. dead-letters takes whatever mirror-sync would be
 * sent (a dead letter is such an event): anything readable is 202, nothing is a 5xx.
 * @param urls each function's base URL (admission's plain HTTP, {@link FUZZ_ENV}).
 * @param authorization `Bearer <token>` of a caller allowed to prepare.
 */
export function fuzzTargets(urls: Record<FunctionName, string>, authorization: string): FuzzTarget[] {
  return [
    {
      name: 'admission',
      url: urls.admission,
      bodyLimit: ADMISSION_BODY_LIMIT,
      cases: hostileReview,
      knownGood: (i) => knownGoodReview(`good-${i}`),
      checkKnownGood: expectAllowed,
      checkAnswer: checkReviewAnswer,
    },
    {
      name: 'mirror-sync',
      url: urls['mirror-sync'],
      bodyLimit: DEFAULT_BODY_LIMIT,
      cases: fc.oneof(
        { arbitrary: hostileEvents('mirror-sync'), weight: 6 },
        { arbitrary: wellFormedEvents('mirror-sync'), weight: 3 },
        { arbitrary: hostilePrepare(authorization), weight: 1 },
      ),
      knownGood: (i) => knownGoodEvent('mirror-sync', `good-${i}`),
      checkKnownGood: expect2xx,
    },
    eventTarget('identity-status', urls['identity-status'], 'identity-status'),
    eventTarget('dead-letters', urls['dead-letters'], 'mirror-sync'),
  ];
}
