/**
 * `POST /` of mirror-sync: CloudEvents in, reconciles out. Turns each event into consumer
 * reconciles (directly, by fan-out, or by resync) and the results into one HTTP answer:
 * 200 when everything is done, 503 when something should be retried (Knative delivery
 * retries), 400 for events this function cannot use (with a JSON body saying why).
 */
import type { Request, Response } from 'express';
import { BadEventError, classifyEvent, readCloudEvents, type EventRequest } from '../lib/cloudevents.ts';
import { describeError, makeClients } from '../lib/kube.ts';
import { consumersFor, reconcileAll, type ObjectEvent } from './fanout.ts';
import type { ReconcileDeps, ReconcileResult } from './reconcile.ts';
import { resync, type ResyncSummary } from './resync.ts';

/** Handler configuration (from the environment, see index.ts). */
export interface EventConfig {
  /** Reconciles in flight per request (fan-out, resync). */
  concurrency: number;
  /** `K_SINK`: resync fans out to it instead of reconciling in-process. */
  sink?: string | undefined;
  /** SPEC §8 fast path: react to labelled source-Secret events. */
  sourceSecretEvents: boolean;
}

type Done = { id: string; results?: Pick<ReconcileResult, 'object' | 'outcome' | 'reason' | 'retry'>[]; resync?: ResyncSummary; ignored?: string };

// One resync at a time per instance: a ping that arrives while one runs joins it, so a
// flood of pings (or a batch of them) costs one resync, not one each.
let running: Promise<ResyncSummary> | undefined;
function resyncOnce(deps: ReconcileDeps, cfg: EventConfig): Promise<ResyncSummary> {
  running ??= resync(deps, { sink: cfg.sink, concurrency: cfg.concurrency }).finally(() => {
    running = undefined;
  });
  return running;
}

/**
 * Drops repeated work from one request: pings beyond the first, and object events naming the
 * same object as an earlier one (each reconcile re-reads everything, so once is enough).
 */
export function coalesce(requests: readonly EventRequest[]): EventRequest[] {
  const seen = new Set<string>();
  return requests.filter((r) => {
    const key = r.type === 'ping' ? 'ping' : JSON.stringify([r.target, r.ref.apiVersion, r.ref.kind, r.ref.namespace ?? '', r.ref.name]);
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

async function handleOne(deps: ReconcileDeps, cfg: EventConfig, ev: EventRequest): Promise<Done> {
  if (ev.type === 'ping') return { id: ev.id, resync: await resyncOnce(deps, cfg) };
  if (ev.target === 'other') throw new BadEventError(`event ${ev.id} is about ${ev.ref.apiVersion} ${ev.ref.kind}, which mirror-sync does not handle`);
  if (ev.target === 'secret' && !cfg.sourceSecretEvents) {
    throw new BadEventError(`event ${ev.id} is about a Secret, but the source-Secret fast path is off (set CAPTF_SOURCE_SECRET_EVENTS=true)`);
  }
  const requests = await consumersFor(makeClients(deps.kc), deps.kinds, ev as ObjectEvent, { sourceSecretEvents: cfg.sourceSecretEvents });
  const results = await reconcileAll(deps, requests, cfg.concurrency);
  return { id: ev.id, results: results.map(({ object, outcome, reason, retry }) => ({ object, outcome, reason, retry })) };
}

/**
 * Express handler for `POST /`.
 * Answers: 200 `{events: [...]}`; 400 `{error}` for a malformed or unusable event (valid
 * events of a batch are still processed) or a batch over `MAX_BATCH`; 503 `{error, events}`
 * when a reconcile asks for a retry or an API call failed. Pings in one request, and pings
 * arriving while a resync runs, share that one resync.
 */
export function eventsHandler(deps: ReconcileDeps, cfg: EventConfig) {
  return async (req: Request, res: Response): Promise<void> => {
    const body = typeof req.body === 'string' ? req.body : '';
    let requests: EventRequest[] = [];
    const bad: string[] = [];
    try {
      const read = readCloudEvents(req.headers, body);
      bad.push(...read.errors);
      for (const e of read.events) {
        try {
          requests.push(classifyEvent(e, deps.kinds));
        } catch (err) {
          if (err instanceof BadEventError) bad.push(err.message);
          else throw err;
        }
      }
    } catch (err) {
      if (err instanceof BadEventError) {
        deps.logger.warn('bad event', { error: err.message });
        res.status(400).json({ error: err.message });
        return;
      }
      throw err;
    }
    const done: Done[] = [];
    let retry = false;
    for (const r of coalesce(requests)) {
      try {
        const d = await handleOne(deps, cfg, r);
        if (d.results?.some((x) => x.retry)) retry = true;
        done.push(d);
      } catch (err) {
        if (err instanceof BadEventError) {
          bad.push(err.message);
          continue;
        }
        retry = true;
        deps.logger.warn('event failed', { id: r.id, error: describeError(err) });
        done.push({ id: r.id, ignored: `failed: ${describeError(err)}` });
      }
    }
    if (bad.length) deps.logger.warn('bad event', { errors: bad });
    if (retry) res.status(503).json({ error: 'some reconciles must be retried', events: done, ...(bad.length ? { badEvents: bad } : {}) });
    else if (bad.length) res.status(400).json({ error: bad.join('; '), events: done });
    else res.status(200).json({ events: done });
  };
}
