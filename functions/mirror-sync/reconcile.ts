/**
 * SPEC §4: reconcile one mirror key — observe (observe.ts) → decide (decide.ts) → act (act.ts,
 * the one writer). A conflict observes the same consumers again, afresh, and decides again, a
 * bounded number of times with a jittered pause. One JSON log line per key; nothing is thrown (API failures become
 * `retry: true`).
 */
import pLimit from 'p-limit';
import { retryOnConflict } from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import { telemetry, type ReconcileResult } from '../lib/telemetry.ts';
import { mirrorName } from '../lib/mirror.ts';
import { act, contextOf, failure, type ConsumerResult, type KeyOutcome, type ReconcileDeps } from './act.ts';
import { decide, keyString, type MirrorKey, type Snapshot } from './decide.ts';
import { Conflict } from './errors.ts';
import { observe, type Seed } from './observe.ts';

/** What a key's reconcile did, with its cost. */
export interface KeyResult extends KeyOutcome {
  durationMs: number;
  apiCalls: number;
}

/** Attempts of observe → decide → act when the write conflicts. */
const ATTEMPTS = 10;

/**
 * Reconciles one key: observe (`scope`, with `seed` the first time, all read afresh after a
 * conflict), decide, act — again while writes keep conflicting, a bounded number of times. Logs
 * what it did ({@link logKey}).
 * @param seed reads made for this key after the request arrived (observe.ts {@link Seed}).
 * @returns the result; never throws (API errors give `retry: true` and `error`).
 */
export async function reconcileKey(
  deps: ReconcileDeps,
  key: MirrorKey,
  scope: Snapshot['scope'],
  seed?: Seed,
): Promise<KeyResult> {
  const started = performance.now();
  const counter = { calls: 0 };
  let result: KeyOutcome;
  try {
    const ctx = contextOf(deps, counter);
    const opts = { limit: pLimit(1), conditions: 'write' } as const;
    result = await retryOnConflict(async (attempt) => {
      // Again after a conflict: the same consumers, read afresh. Widening to the whole key would
      // write the conditions of consumers another pod is handling, and race it.
      const work = { key, scope, seed: attempt === 1 ? seed : undefined };
      const [acted] = await act(ctx, [decide(await observe(ctx.clients, ctx.kinds, work), ctx.kinds)], opts);
      if ('conflict' in acted!) throw acted.conflict;
      return acted!.outcome;
    }, ATTEMPTS);
  } catch (err) {
    result =
      err instanceof Conflict
        ? { ...failedKey(key, err), error: `the mirror kept changing; gave up after ${ATTEMPTS} attempts` }
        : failedKey(key, err);
  }
  const done: KeyResult = {
    ...result,
    durationMs: Math.round((performance.now() - started) * 10) / 10,
    apiCalls: counter.calls,
  };
  logKey(deps.logger, done, scope);
  telemetry().reconcile(reconcileResult(done), done.durationMs / 1000);
  return done;
}

/** How a key's reconcile ended, as counted (lib/telemetry.ts): retried, refused for good, or done. */
export const reconcileResult = (r: KeyOutcome): ReconcileResult => {
  if (r.retry) return 'retry';
  return r.warning ? 'refused' : 'done';
};

/** The result of a key whose reconcile failed on `err` (an API error): retried, with the wait its answer asked for. */
export const failedKey = (key: MirrorKey, err: unknown): KeyOutcome => ({
  key,
  mirrorAction: 'unchanged',
  consumers: [],
  retry: true,
  ...failure(err),
});

/**
 * Logs a key's reconcile: one `reconcile` line per consumer the request named or whose
 * conditions changed (a big key that changed nothing stays quiet), and one line for the key
 * when no consumer line says what happened to the mirror.
 */
export function logKey(logger: Logger, r: KeyResult, scope: Snapshot['scope'] = 'all'): void {
  const named = new Set(scope === 'all' ? [] : scope.map((n) => `${n.kind}/${n.name}`));
  const common = {
    identity: r.key.identity,
    mirror: mirrorName(r.key.identity),
    mirrorAction: r.mirrorAction,
    durationMs: r.durationMs,
    apiCalls: r.apiCalls,
  };
  const worth = (c: ConsumerResult) =>
    c.changed || c.outcome !== 'mirrored' || named.has(`${c.kind}/${c.object.split('/')[1]}`);
  const lines = r.consumers.filter(worth);
  // `message` would be merged into winston's own message field, so it is logged as `detail`.
  for (const c of lines) logger.log('info', 'reconcile', { ...consumerFields(c), ...common, detail: c.message });
  const problem = r.error ?? r.warning;
  const untold = lines.length === 0 && (r.mirrorAction !== 'unchanged' || named.size > 0);
  if (problem || untold) logKeyLine(logger, r, { ...common, ...(problem ? { detail: problem } : {}) });
}

/** The key's own line: a warning when something failed or was refused, else info. */
function logKeyLine(logger: Logger, r: KeyResult, fields: Record<string, unknown>): void {
  logger.log(r.error || r.warning ? 'warn' : 'info', 'reconcile key', {
    key: keyString(r.key),
    namespace: r.key.namespace,
    consumers: r.consumers.length,
    retry: r.retry,
    ...fields,
  });
}

/** A consumer result's log fields (without its message). */
export const consumerFields = (c: ConsumerResult) => ({
  object: c.object,
  kind: c.kind,
  outcome: c.outcome,
  reason: c.reason,
  retry: c.retry,
});
