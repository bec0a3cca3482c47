/**
 * The three functions as fuzz targets (issue 16 item 4): started in-process on 127.0.0.1
 * against a control plane, each with the arbitraries and checks that fit it. admission serves
 * plain HTTP here (`CAPTF_ADMISSION_PLAIN_HTTP=true`; TLS is the same express app behind
 * `https.createServer`); identity-status is scoped by a label no identity carries, so a fuzzed
 * ping refreshes nothing of anyone else's; mirror-sync is never sent a ping (it would resync
 * the whole shared control plane), every other kind of event it is.
 */
import { randomBytes } from 'node:crypto';
import { PassThrough } from 'node:stream';
import type { KubeConfig } from '@kubernetes/client-node';
import fc from 'fast-check';
import { ADMISSION_BODY_LIMIT, start as startAdmission } from '../../functions/admission/index.ts';
import { start as startIdentityStatus } from '../../functions/identity-status/index.ts';
import { start as startMirrorSync } from '../../functions/mirror-sync/index.ts';
import { DEFAULT_BODY_LIMIT, type FunctionHandle } from '../../functions/lib/http.ts';
import { createLogger } from '../../functions/lib/log.ts';
import { prepareCaller } from '../lib/serviceaccount.ts';
import { parse, type Answer, type FuzzTarget } from './fuzz.ts';
import { hostileReview, knownGoodReview, type FuzzCase } from './hostile.ts';
import { hostileEvents, hostilePrepare, knownGoodEvent, wellFormedEvents } from './hostile-events.ts';

/** A running function's log, kept only as counts by level and the error messages. */
export interface LogTally {
  levels: Record<string, number>;
  errors: string[];
}

/** A logger that tallies its lines instead of printing them. */
function tallyLogger(component: string): { logger: ReturnType<typeof createLogger>; tally: LogTally } {
  const tally: LogTally = { levels: {}, errors: [] };
  const stream = new PassThrough();
  let partial = '';
  stream.on('data', (d: Buffer) => {
    const lines = (partial + d.toString()).split('\n');
    partial = lines.pop() ?? '';
    for (const line of lines.filter(Boolean)) {
      const e = parse(line) as { level?: string; message?: string; error?: unknown } | undefined;
      const level = e?.level ?? 'unparsed';
      tally.levels[level] = (tally.levels[level] ?? 0) + 1;
      if (level === 'error') tally.errors.push(`${e?.message}: ${String(e?.error).slice(0, 200)}`);
    }
  });
  return { logger: createLogger(component, { stream, level: 'info' }), tally };
}

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

/** The three functions running, as fuzz targets, with their log tallies. */
export interface RunningTargets {
  targets: FuzzTarget[];
  logs: Record<string, LogTally>;
  handles: FunctionHandle[];
  close(): Promise<void>;
}

/**
 * Starts admission, mirror-sync and identity-status in-process against `kubeconfig`, and a
 * caller allowed to prepare (a ServiceAccount in `default` with the shipped prepare role and
 * an audience-bound token), removed again by `close()`.
 */
export async function startTargets(kubeconfig: KubeConfig): Promise<RunningTargets> {
  const base = { port: 0, host: '127.0.0.1', kubeconfig };
  const [adm, ms, st] = [tallyLogger('admission'), tallyLogger('mirror-sync'), tallyLogger('identity-status')];
  const id = randomBytes(4).toString('hex');
  const scope = `captf-fuzz/scope=nothing-${id}`;
  const caller = await prepareCaller(kubeconfig, {
    namespace: 'default',
    name: `captf-fuzz-manager-${id}`,
    suffix: id,
  });
  const handles = await Promise.all([
    startAdmission({ ...base, logger: adm.logger, env: { CAPTF_ADMISSION_PLAIN_HTTP: 'true' } }),
    startMirrorSync({ ...base, logger: ms.logger, env: {} }),
    startIdentityStatus({ ...base, logger: st.logger, env: { CAPTF_STATUS_IDENTITY_SELECTOR: scope } }),
  ]);
  const url = (h: FunctionHandle) => `http://127.0.0.1:${h.port}`;
  const targets: FuzzTarget[] = [
    {
      name: 'admission',
      url: url(handles[0]),
      bodyLimit: ADMISSION_BODY_LIMIT,
      cases: hostileReview,
      knownGood: (i) => knownGoodReview(`good-${i}`),
      checkKnownGood: expectAllowed,
      checkAnswer: checkReviewAnswer,
    },
    {
      name: 'mirror-sync',
      url: url(handles[1]),
      bodyLimit: DEFAULT_BODY_LIMIT,
      cases: fc.oneof(
        { arbitrary: hostileEvents('mirror-sync'), weight: 6 },
        { arbitrary: wellFormedEvents('mirror-sync'), weight: 3 },
        { arbitrary: hostilePrepare(caller.authorization), weight: 1 },
      ),
      knownGood: (i) => knownGoodEvent('mirror-sync', `good-${i}`),
      checkKnownGood: expect2xx,
    },
    {
      name: 'identity-status',
      url: url(handles[2]),
      bodyLimit: DEFAULT_BODY_LIMIT,
      cases: fc.oneof(
        { arbitrary: hostileEvents('identity-status'), weight: 6 },
        { arbitrary: wellFormedEvents('identity-status'), weight: 3 },
      ),
      knownGood: (i) => knownGoodEvent('identity-status', `good-${i}`),
      checkKnownGood: expect2xx,
    },
  ];
  return {
    targets,
    logs: { admission: adm.tally, 'mirror-sync': ms.tally, 'identity-status': st.tally },
    handles,
    close: async () => {
      await Promise.all(handles.map((h) => h.close()));
      await caller.cleanup();
    },
  };
}
