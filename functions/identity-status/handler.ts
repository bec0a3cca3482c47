/**
 * HTTP adapter of identity-status (SPEC §9, §12): CloudEvents in, refreshes out.
 * - `dev.knative.sources.ping` → refresh every identity in scope;
 * - an ApiServerSource event (Resource or Reference mode, add/update/delete) about a
 *   TerraformClusterIdentity → refresh that one (re-read; the payload only names it);
 * - anything else → 4xx with a JSON message saying why.
 * Answers 200 when every refresh settled, 503 when an API call failed (so Knative retries).
 */
import type { KubeConfig } from '@kubernetes/client-node';
import type { RequestHandler } from 'express';
import pLimit from 'p-limit';
import type { ConsumerKind } from '../lib/api.ts';
import { BadEventError, PING_EVENT_TYPE, readEventRequests, type EventRequest } from '../lib/cloudevents.ts';
import { sendEventOutcome, type Outcome } from '../lib/http.ts';
import { describeError, makeClients } from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import { telemetry } from '../lib/telemetry.ts';
import { READY_REASONS } from './decide.ts';
import { refreshAll, refreshNamed, type RefreshDeps, type RefreshResult } from './refresh.ts';

/** Configuration of the handler (from the environment, see index.ts). */
export interface HandlerConfig {
  kc: KubeConfig;
  consumerKinds: readonly ConsumerKind[];
  concurrency: number;
  identitySelector: string | undefined;
  logger: Logger;
}

/** What one request asks for: a full refresh, or the named identities. */
export type RefreshPlan = { kind: 'all' } | { kind: 'named'; names: string[] };

/**
 * Why an event is not for identity-status (a mirror key, an object of another kind: each
 * belongs to mirror-sync), or undefined for a ping or an event about an identity. The
 * answer's 422 (nothing else in the request) or 400 (beside other unusable events) carries it.
 */
export function unsupported(r: EventRequest): string | undefined {
  if (r.type === 'ping' || (r.type === 'object' && r.target === 'identity')) return undefined;
  if (r.type === 'key')
    return `identity-status does not handle mirror key events (${r.namespace}/${r.identity}); route them to mirror-sync`;
  return `identity-status handles ${PING_EVENT_TYPE} and events about TerraformClusterIdentity objects; this event is about ${r.ref.apiVersion} ${r.ref.kind} ${r.ref.namespace ? `${r.ref.namespace}/` : ''}${r.ref.name} (route it to mirror-sync)`;
}

/**
 * Turns the usable events of a request into one plan: any ping makes it a full refresh (which
 * covers every named identity too); otherwise the distinct identity names, in order. Events
 * that are {@link unsupported} are left out.
 */
export function planFor(requests: readonly EventRequest[]): RefreshPlan {
  if (requests.some((r) => r.type === 'ping')) return { kind: 'all' };
  const names: string[] = [];
  for (const r of requests)
    if (r.type === 'object' && r.target === 'identity' && !names.includes(r.ref.name)) names.push(r.ref.name);
  return { kind: 'named', names };
}

/**
 * `POST /` handler: CloudEvents in, the refresh's {@link Outcome} out (lib/http.ts maps it to an
 * answer that names nothing, and logs the detail under the answer's request id).
 * Detail of a done or retried refresh:
 * `{ trigger, refreshed, written, gone, failed: [{identity, error}], identities?: RefreshResult[], apiCalls, durationMs }`
 * (`identities` only for identity events, to keep a ping's answer small).
 */
export function handleEvents(cfg: HandlerConfig): RequestHandler {
  return async (req, res) =>
    sendEventOutcome(res, await refreshFor(cfg, req.headers, typeof req.body === 'string' ? req.body : ''), cfg.logger);
}

/** The events of one request split into those to refresh and the reasons the others are unusable. */
interface Sorted {
  usable: EventRequest[];
  bad: string[];
  others: string[];
}

/** Reads and sorts a request's events; an Outcome when nothing can be refreshed. */
function sortEvents(
  cfg: HandlerConfig,
  headers: Record<string, string | string[] | undefined>,
  body: string,
): Sorted | Outcome {
  let read: ReturnType<typeof readEventRequests>;
  try {
    read = readEventRequests(headers, body, cfg.consumerKinds);
  } catch (err) {
    if (!(err instanceof BadEventError)) throw err;
    cfg.logger.warn('bad event', { error: err.message });
    return { kind: 'bad-input', error: err.message, reason: 'BadEvent' };
  }
  const others = read.requests.map(unsupported).filter((m): m is string => m !== undefined);
  const usable = read.requests.filter((r) => unsupported(r) === undefined);
  if (usable.length > 0) return { usable, bad: read.bad, others };
  const errors = [...read.bad, ...others];
  cfg.logger.warn('bad event', { errors });
  const error = errors.join('; ') || 'no event to handle';
  return others.length && !read.bad.length
    ? { kind: 'unprocessable', error, reason: 'UnsupportedObject' }
    : { kind: 'bad-input', error, reason: 'BadEvent' };
}

/** Runs the plan; a `retry` Outcome when the full refresh's lists failed. */
async function runPlan(
  cfg: HandlerConfig,
  plan: RefreshPlan,
  counter: { calls: number },
): Promise<RefreshResult[] | Outcome> {
  const deps: RefreshDeps = {
    clients: makeClients(cfg.kc, counter, cfg.logger),
    consumerKinds: cfg.consumerKinds,
    concurrency: cfg.concurrency,
    identitySelector: cfg.identitySelector,
    logger: cfg.logger,
  };
  if (plan.kind === 'named') return pLimit(cfg.concurrency).map(plan.names, (name) => refreshNamed(deps, name));
  try {
    return await refreshAll(deps);
  } catch (err) {
    const error = describeError(err);
    cfg.logger.warn('refresh of all identities failed', { error, apiCalls: counter.calls });
    return { kind: 'retry', error: `listing identities, consumers or mirrors failed: ${error}`, reason: 'ListFailed' };
  }
}

/** The answer's counts (see {@link handleEvents}). */
function summarise(plan: RefreshPlan, results: RefreshResult[], apiCalls: number, t0: number) {
  return {
    trigger: plan.kind === 'all' ? 'ping' : 'identity',
    refreshed: results.filter((r) => r.outcome === 'refreshed').length,
    written: results.filter((r) => (r.changed?.length ?? 0) > 0).length,
    gone: results.filter((r) => r.outcome === 'gone').length,
    failed: results.filter((r) => r.outcome === 'failed').map((r) => ({ identity: r.identity, error: r.error })),
    apiCalls,
    durationMs: Math.round(performance.now() - t0),
  };
}

/**
 * Records what a refresh found (lib/telemetry.ts): each refreshed identity's readiness and
 * namespaces in use, the ones found gone, and after a full refresh how many identities carry
 * each `Ready` reason (every reason, 0 when none has it, so an alert's series always exists).
 */
function recordIdentities(plan: RefreshPlan, results: readonly RefreshResult[]): void {
  const refreshed = results.filter((r) => r.outcome === 'refreshed');
  const byReason = new Map(READY_REASONS.map((r) => [r, 0]));
  for (const r of refreshed) if (r.reason) byReason.set(r.reason, (byReason.get(r.reason) ?? 0) + 1);
  telemetry().identities({
    refreshed: refreshed.map((r) => ({
      name: r.identity,
      ready: r.ready === 'True',
      namespaces: r.namespaces?.length ?? 0,
    })),
    gone: results.filter((r) => r.outcome === 'gone').map((r) => r.identity),
    ...(plan.kind === 'all' ? { full: { byReason } } : {}),
  });
}

/**
 * Decides and runs one request. SPEC §12 batch policy: each event is judged on its own — the
 * good ones of a batch are refreshed even when others are malformed or about other kinds —
 * and the answer is `retry` when a refresh failed, else `bad-input` (400) or `unprocessable`
 * (422, nothing but events about other kinds) when some events were unusable, else `done`.
 */
export async function refreshFor(
  cfg: HandlerConfig,
  headers: Record<string, string | string[] | undefined>,
  body: string,
): Promise<Outcome> {
  const t0 = performance.now();
  const sorted = sortEvents(cfg, headers, body);
  if ('kind' in sorted) return sorted;
  const plan = planFor(sorted.usable);
  const counter = { calls: 0 };
  const results = await runPlan(cfg, plan, counter);
  if (!Array.isArray(results)) return results;
  const summary = summarise(plan, results, counter.calls, t0);
  recordIdentities(plan, results);
  const { failed } = summary;
  cfg.logger.info('refresh done', { ...summary, failed: failed.length });
  const answer = { ...summary, ...(plan.kind === 'named' ? { identities: results } : {}) };
  if (failed.length > 0)
    return {
      kind: 'retry',
      error: `${failed.length} identit${failed.length === 1 ? 'y' : 'ies'} could not be refreshed`,
      body: answer,
    };
  const unusable = [...sorted.bad, ...sorted.others];
  if (unusable.length > 0) {
    cfg.logger.warn('bad event', { errors: unusable });
    return { kind: 'bad-input', error: unusable.join('; '), reason: 'BadEvent', body: answer };
  }
  return { kind: 'done', body: answer };
}
