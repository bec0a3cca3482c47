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
import { BadEventError, PING_EVENT_TYPE, classifyEvent, parseCloudEvents, type EventRequest } from '../lib/cloudevents.ts';
import { HttpError } from '../lib/http.ts';
import { describeError, makeClients } from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
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
 * Turns classified events into one plan: any ping makes it a full refresh (which covers
 * every named identity too); otherwise the distinct identity names, in order.
 * @throws HttpError 422 for an event about an object that is not an identity.
 */
export function planFor(requests: readonly EventRequest[]): RefreshPlan {
  const names: string[] = [];
  for (const r of requests) {
    if (r.type === 'ping') continue;
    if (r.type === 'key') {
      throw new HttpError(422, `identity-status does not handle mirror key events (${r.namespace}/${r.identity}); route them to mirror-sync`, 'UnsupportedObject');
    }
    if (r.target !== 'identity') {
      throw new HttpError(
        422,
        `identity-status handles ${PING_EVENT_TYPE} and events about TerraformClusterIdentity objects; this event is about ${r.ref.apiVersion} ${r.ref.kind} ${r.ref.namespace ? `${r.ref.namespace}/` : ''}${r.ref.name} (route it to mirror-sync)`,
        'UnsupportedObject',
      );
    }
    if (!names.includes(r.ref.name)) names.push(r.ref.name);
  }
  return requests.some((r) => r.type === 'ping') ? { kind: 'all' } : { kind: 'named', names };
}

/**
 * `POST /` handler. Response body:
 * `{ trigger, refreshed, written, gone, failed: [{identity, error}], identities?: RefreshResult[], apiCalls, durationMs }`
 * (`identities` only for identity events, to keep a ping's answer small).
 */
export function handleEvents(cfg: HandlerConfig): RequestHandler {
  return async (req, res) => {
    const t0 = performance.now();
    let plan: RefreshPlan;
    try {
      const events = parseCloudEvents(req.headers, typeof req.body === 'string' ? req.body : '');
      plan = planFor(events.map((e) => classifyEvent(e, cfg.consumerKinds)));
    } catch (err) {
      if (err instanceof BadEventError) throw new HttpError(400, err.message, 'BadEvent');
      throw err;
    }
    const counter = { calls: 0 };
    const deps: RefreshDeps = {
      clients: makeClients(cfg.kc, counter),
      consumerKinds: cfg.consumerKinds,
      concurrency: cfg.concurrency,
      identitySelector: cfg.identitySelector,
      logger: cfg.logger,
    };
    let results: RefreshResult[];
    if (plan.kind === 'all') {
      try {
        results = await refreshAll(deps);
      } catch (err) {
        const error = describeError(err);
        cfg.logger.warn('refresh of all identities failed', { error, apiCalls: counter.calls });
        throw new HttpError(503, `listing identities, consumers or mirrors failed: ${error}`, 'ListFailed');
      }
    } else {
      const limit = pLimit(cfg.concurrency);
      results = await limit.map(plan.names, (name) => refreshNamed(deps, name));
    }
    const failed = results.filter((r) => r.outcome === 'failed').map((r) => ({ identity: r.identity, error: r.error }));
    const summary = {
      trigger: plan.kind === 'all' ? 'ping' : 'identity',
      refreshed: results.filter((r) => r.outcome === 'refreshed').length,
      written: results.filter((r) => (r.changed?.length ?? 0) > 0).length,
      gone: results.filter((r) => r.outcome === 'gone').length,
      failed,
      apiCalls: counter.calls,
      durationMs: Math.round(performance.now() - t0),
    };
    cfg.logger.info('refresh done', { ...summary, failed: failed.length });
    res.status(failed.length > 0 ? 503 : 200).json({ ...summary, ...(plan.kind === 'named' ? { identities: results } : {}) });
  };
}
