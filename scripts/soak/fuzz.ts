/**
 * Runs the hostile-input property against a running function: each case
 * from an arbitrary of ./hostile.ts or ./hostile-events.ts is posted, then a known-good
 * request, and both answers are checked:
 * - no 5xx and no dropped connection, ever (a body over the size limit may be cut short
 *   after its 413);
 * - a case expecting `ok` (a well-formed event about an object that does not exist) gets a 2xx;
 * - a 4xx from the function carries a JSON `{error}`; an AdmissionReview answer echoes the
 *   uid and a denial has a message (admission's own check);
 * - the known-good request after it succeeds, so the process kept serving.
 * fast-check reports the seed and the path of a failure, so it replays with
 * `{ seed, path }` (the test file keeps such a replay as a regression case).
 */
import { Agent as HttpAgent, request as httpRequest } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import fc from 'fast-check';
import { encode, type FuzzCase, type HostileRequest } from './hostile.ts';

/** One answer, or the connection error that replaced it. */
export interface Answer {
  status: number;
  contentType: string;
  text: string;
  /** Set when no answer came (the connection was reset or closed). */
  error?: string;
  /** Bytes of the request body sent. */
  sent: number;
}

/** A function under test. */
export interface FuzzTarget {
  name: string;
  /** Base URL, e.g. `http://127.0.0.1:1234`. */
  url: string;
  /** PEM to trust for HTTPS. */
  ca?: string;
  /** Largest body the function accepts (bigger ones get 413). */
  bodyLimit: number;
  cases: fc.Arbitrary<FuzzCase>;
  /** The known-good request sent after case `i`. */
  knownGood(i: number): HostileRequest;
  /** Why a known-good answer is wrong, or undefined. */
  checkKnownGood(a: Answer, i: number): string | undefined;
  /** A target's own check of a case's answer (e.g. the AdmissionReview shape), or undefined. */
  checkAnswer?(c: FuzzCase, a: Answer): string | undefined;
}

/** Figures of one run. */
export interface FuzzFigures {
  target: string;
  /** Property runs (cases), shrinking excluded. */
  cases: number;
  /** Requests sent, known-good ones and shrinking included. */
  requests: number;
  byStatus: Record<string, number>;
  byKind: Record<string, number>;
  ms: number;
  seed: number;
  /** fast-check's report of the first failure (seed, path, counterexample), when one failed. */
  failure?: string;
}

/** Sends one request; resolves with the answer or the connection error (never rejects). */
export function send(target: Pick<FuzzTarget, 'url' | 'ca'>, req: HostileRequest, agent?: HttpAgent): Promise<Answer> {
  const body = encode(req.body);
  const url = new URL(req.path, target.url);
  const https = url.protocol === 'https:';
  return new Promise((resolve) => {
    let settled = false;
    const done = (a: Omit<Answer, 'sent'>) => {
      if (!settled) resolve({ ...a, sent: body.length });
      settled = true;
    };
    const r = (https ? httpsRequest : httpRequest)(
      url,
      {
        method: req.method,
        ...(agent ? { agent } : {}),
        ...(target.ca ? { ca: target.ca } : {}),
        headers: { ...req.headers, 'content-length': String(body.length) },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          done({
            status: res.statusCode ?? 0,
            contentType: String(res.headers['content-type'] ?? ''),
            text: Buffer.concat(chunks).toString('utf8'),
          }),
        );
        res.on('error', (e) => done({ status: res.statusCode ?? 0, contentType: '', text: '', error: e.message }));
      },
    );
    r.on('error', (e: NodeJS.ErrnoException) =>
      done({ status: 0, contentType: '', text: '', error: e.code ?? e.message }),
    );
    r.end(body);
  });
}

/** The generic check of one answer; undefined when it is fine. */
export function checkAnswer(c: FuzzCase, a: Answer, bodyLimit: number): string | undefined {
  if (a.error) {
    // The server may answer 413 and close before an oversized body is written: not a failure.
    const oversized = a.sent > bodyLimit && (a.status === 413 || a.status === 0);
    return oversized ? undefined : `no answer (${a.error}) to a ${c.kind} case`;
  }
  if (a.status >= 500) return `HTTP ${a.status} to a ${c.kind} case: ${a.text.slice(0, 300)}`;
  if (c.expect === 'ok' && Math.floor(a.status / 100) !== 2)
    return `HTTP ${a.status} to a well-formed request (${c.kind}); expected 2xx: ${a.text.slice(0, 300)}`;
  return a.status >= 400 && a.contentType.includes('json') ? checkErrorBody(a) : undefined;
}

/** A function's 4xx JSON carries a non-empty `error`. */
function checkErrorBody(a: Answer): string | undefined {
  const body = parse(a.text) as { error?: unknown } | undefined;
  return typeof body?.error === 'string' && body.error !== ''
    ? undefined
    : `HTTP ${a.status} without a JSON {error}: ${a.text.slice(0, 300)}`;
}

/** JSON.parse, or undefined. */
export function parse(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

const bump = (m: Record<string, number>, k: string) => (m[k] = (m[k] ?? 0) + 1);

/**
 * Runs the property against one target.
 * @param opts.numRuns cases; `seed`/`path` replay a reported failure.
 * @returns the figures; `failure` set when a case failed (after shrinking).
 */
export async function fuzz(
  target: FuzzTarget,
  opts: { numRuns: number; seed?: number | undefined; path?: string | undefined },
): Promise<FuzzFigures> {
  const t0 = performance.now();
  const Agent = target.url.startsWith('https:') ? HttpsAgent : HttpAgent;
  const agent = new Agent({ keepAlive: true, maxSockets: 4 });
  const figures: FuzzFigures = { target: target.name, cases: 0, requests: 0, byStatus: {}, byKind: {}, ms: 0, seed: 0 };
  let i = 0;
  // A well-formed request may meet a transient API failure (a 503 asking for a retry: the
  // function did its job); it is sent again, as Knative's delivery would, at most twice.
  const sendAsKnative = async (request: FuzzCase['request'], wellFormed: boolean): Promise<Answer> => {
    let a = await send(target, request, agent);
    for (let retry = 0; wellFormed && retry < 2 && a.status === 503; retry++) {
      await new Promise((r) => setTimeout(r, 250));
      a = await send(target, request, agent);
    }
    return a;
  };
  const property = fc.asyncProperty(target.cases, async (c) => {
    const a = await sendAsKnative(c.request, c.expect === 'ok');
    figures.requests += 2;
    bump(figures.byStatus, a.error ? `closed (${a.error})` : String(a.status));
    bump(figures.byKind, c.kind.split(' (')[0]!);
    const bad = checkAnswer(c, a, target.bodyLimit) ?? target.checkAnswer?.(c, a);
    if (bad) throw new Error(bad);
    const n = i++;
    const good = await sendAsKnative(target.knownGood(n), true);
    const wrong = target.checkKnownGood(good, n);
    if (wrong) throw new Error(`the known-good request after a ${c.kind} case failed: ${wrong}`);
  });
  const details = await fc.check(property, {
    numRuns: opts.numRuns,
    ...(opts.seed !== undefined ? { seed: opts.seed } : {}),
    ...(opts.path !== undefined ? { path: opts.path } : {}),
  });
  agent.destroy();
  figures.cases = details.numRuns;
  figures.seed = details.seed;
  figures.ms = Math.round(performance.now() - t0);
  if (details.failed) figures.failure = failureReport(details);
  return figures;
}

/** fast-check's report (seed, path, counterexample) and the error, kept short. */
function failureReport(details: fc.RunDetails<[FuzzCase]>): string {
  const error = details.errorInstance instanceof Error ? details.errorInstance.message : String(details.errorInstance);
  return `${error.slice(0, 1_000)}\n${(fc.defaultReportMessage(details) ?? 'failed').slice(0, 5_000)}`;
}

/** One line of figures, e.g. `admission: 300 cases (600 requests) in 4.1 s; 200×212 400×88`. */
export function describeFigures(f: FuzzFigures): string {
  const statuses = Object.entries(f.byStatus)
    .sort()
    .map(([s, n]) => `${s}×${n}`)
    .join(' ');
  const kinds = Object.entries(f.byKind)
    .sort((x, y) => y[1] - x[1])
    .map(([k, n]) => `${k} ${n}`)
    .join(', ');
  return `${f.target}: ${f.cases} cases (${f.requests} requests) in ${(f.ms / 1000).toFixed(1)} s, seed ${f.seed}; answers ${statuses}; cases ${kinds}`;
}
