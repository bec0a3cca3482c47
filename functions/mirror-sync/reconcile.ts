/**
 * SPEC §4: reconcile one mirror key — observe → decide → act. At most one write to the
 * mirror, with the resourceVersion it was read at; a 409 observes the key again (the whole
 * key, listed) and decides again, a bounded number of times (with a jittered pause). After creating a mirror, the
 * identity and namespace are read again so a revocation that raced the create is undone.
 * Then only the consumers whose conditions changed get a status write. One JSON log line
 * per key; nothing is thrown (API failures become `retry: true`).
 */
import type { KubeConfig, V1Secret } from '@kubernetes/client-node';
import pLimit from 'p-limit';
import type { Consumer, ConsumerKind } from '../lib/api.ts';
import { isCurrent, isOurs, mirrorName, type SecretLike } from '../lib/mirror.ts';
import { mirrorWriteOf } from './writes.ts';
import { findConsumerKind } from '../lib/consumers.ts';
import {
  apiStatus,
  deleteSecretIfUnchanged,
  describeError,
  isConflict,
  isInvalidField,
  makeClients,
  redactApiError,
  RedactedApiError,
  retryAfterOf,
  retryOnConflict,
  STRATEGIC_MERGE,
  type CallCounter,
  type Clients,
} from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import {
  decide,
  keyString,
  mayHoldMirror,
  type ConsumerPlan,
  type MirrorKey,
  type NamespaceState,
  namespaceTerminatingMessage,
  type ConsumerOutcome,
  failedPlan,
  keylessPlan,
  writeOf,
  type KeyPlan,
  type Snapshot,
} from './decide.ts';
import { EXISTS, listNamespaces, observe, readIdentity, readNamespace, type Seed } from './observe.ts';
import { writeConditions, type WriteContext } from './status.ts';

/** What a reconcile needs from its caller. */
export interface ReconcileDeps {
  kc: KubeConfig;
  kinds: readonly ConsumerKind[];
  logger: Logger;
  /** Clock for lastTransitionTime and Events (tests may fix it). */
  now?: () => Date;
}

/**
 * What one reconcile, pass or event works with, passed as one value: the API clients (their
 * counter is the work's request bill), the configured consumer kinds, the logger, the clock.
 */
export interface ReconcileContext {
  clients: Clients;
  kinds: readonly ConsumerKind[];
  logger: Logger;
  /** Clock for lastTransitionTime and Events. */
  now: () => Date;
}

/** A context for one piece of work, its API calls counted on `counter`. */
export const contextOf = (deps: ReconcileDeps, counter?: CallCounter): ReconcileContext => ({
  clients: makeClients(deps.kc, counter, deps.logger),
  kinds: deps.kinds,
  logger: deps.logger,
  now: deps.now ?? (() => new Date()),
});

/** One consumer's result, for answers and logs. */
export interface ConsumerResult {
  /** `<namespace>/<name>` */
  object: string;
  kind: string;
  /** The identity it names (absent when it names none). */
  identity?: string | undefined;
  /** Decided outcomes (decide.ts), or: it names no identity / it no longer exists. */
  outcome: ConsumerOutcome | 'gone';
  reason: string;
  message: string;
  retry: boolean;
  /** Whether its conditions were written. */
  changed?: boolean;
}

/** What a key's reconcile did. */
export interface KeyResult {
  key: MirrorKey;
  /** What happened to the mirror Secret. */
  mirrorAction: 'created' | 'updated' | 'deleted' | 'unchanged' | 'blocked';
  consumers: ConsumerResult[];
  /** Source hash when the mirror is current (prepare answers it). */
  sourceHash?: string | undefined;
  /** True when the caller should retry (CloudEvent → 5xx). */
  retry: boolean;
  /** Set when an API call failed (safe text: no Secret data). */
  error?: string | undefined;
  /**
   * With `error`: the wait, in seconds, the failed call's answer asked for with `Retry-After`
   * (a throttled API server; lib/api-errors.ts `retryAfterOf`, not capped here).
   */
  retryAfterSeconds?: number | undefined;
  /** Set when a write was refused for good: logged as a warning, not retried (safe text). */
  warning?: string | undefined;
  durationMs: number;
  apiCalls: number;
}

/** Attempts of observe → decide → act when the mirror write conflicts. */
const ATTEMPTS = 10;
/** Condition writes in flight at once for one key. */
const STATUS_CONCURRENCY = 8;

/**
 * The one shape of "observe again": the mirror changed since it was read (a 409 on the
 * write, an update answered 404), or a create raced a revocation. `code` 409, so
 * `retryOnConflict` (lib/kube.ts) runs observe → decide → act again.
 */
export class MirrorChanged extends Error {
  readonly code = 409;
  /** @param why what changed (for the log of a key that gave up). */
  constructor(why: string) {
    super(why);
    this.name = 'MirrorChanged';
  }
}

/** A key's result without its timing: what acting on a plan returns. */
export type KeyOutcome = Omit<KeyResult, 'durationMs' | 'apiCalls'>;

/**
 * Sends the mirror part of a plan: the one request writes.ts {@link mirrorWriteOf} describes.
 * @returns what happened. @throws MirrorChanged when the mirror changed since it was read (409,
 *   or a merge's UID guard met another mirror), redacted API errors otherwise.
 */
async function writeMirror(clients: Clients, plan: KeyPlan): Promise<{ action: Written['action']; stored?: V1Secret }> {
  const w = mirrorWriteOf(plan);
  if (!w) return { action: plan.mirror.action === 'blocked' ? 'blocked' : 'unchanged' };
  const { namespace, name } = w;
  try {
    switch (w.verb) {
      case 'create':
        return { action: 'created', stored: await clients.core.createNamespacedSecret({ namespace, body: w.body }) };
      case 'update':
        // The body carries the resourceVersion it was read at: the precondition.
        return {
          action: 'updated',
          stored: await clients.core.replaceNamespacedSecret({ name, namespace, body: w.body as V1Secret }),
        };
      case 'patch':
        // No resourceVersion: the API server merges the references into whatever is stored,
        // so instances adding consumers to one mirror at once never conflict (SPEC §4).
        return {
          action: 'updated',
          stored: await clients.core.patchNamespacedSecret({ name, namespace, body: w.body }, STRATEGIC_MERGE),
        };
      case 'delete':
        // Already gone (another writer, the garbage collector): nothing was deleted here.
        return {
          action: (await deleteSecretIfUnchanged(clients, { metadata: { name, namespace, ...w.precondition } }))
            ? 'deleted'
            : 'unchanged',
        };
    }
  } catch (err) {
    if (isConflict(err)) throw new MirrorChanged(`the mirror changed since it was read (409 on ${w.verb})`);
    if (w.verb === 'patch' && isInvalidField(err, 'metadata.uid'))
      throw new MirrorChanged('the mirror was replaced since it was read (its UID changed)');
    // Bodies carry Secret data, and a webhook on DELETE sees it too: its message may echo it.
    throw redactApiError(err);
  }
}

/** A plan whose mirror write went through (or needed none), and what it did. */
export interface Written {
  plan: KeyPlan;
  action: KeyResult['mirrorAction'];
}

/**
 * Did the API server store the mirror as written? A mutating webhook or policy may change
 * it on the way (e.g. the hash annotation or the data): then it is not current, and no
 * retry will make it so.
 */
function storedAsWritten(plan: KeyPlan, stored: V1Secret | undefined): boolean {
  // A merge writes no data: what another writer stored meanwhile is that writer's to check.
  if (!stored || plan.sourceHash === undefined || plan.mirror.action === 'merge') return true;
  const s = stored as SecretLike;
  // Stored as written means our labels and annotation kept and the data current; a mirror is
  // only ever written for an identity whose source is not a mirror, so no source can match.
  return isOurs(s, plan.key.identity, undefined) && isCurrent(s, plan.sourceHash);
}

/**
 * SPEC §4 step 3: after creating mirrors, one re-read of the identities and namespaces
 * serves every key created: is each still allowed (SPEC §2)? A revocation may have landed
 * after the pass's reads and found no mirror to delete. Namespaces are read only for
 * identities that select by label (a listed name needs none: a namespace gone takes its
 * mirror with it), one GET each for a few, one list for more.
 * @returns the keys no longer allowed (their creates must be undone). @throws API errors.
 */
export async function revokedMeanwhile(clients: Clients, keys: readonly MirrorKey[]): Promise<Set<string>> {
  const names = [...new Set(keys.map((k) => k.identity))];
  const limit = pLimit(STATUS_CONCURRENCY);
  const identities = new Map(
    await Promise.all(names.map((n) => limit(async () => [n, await readIdentity(clients, n)] as const))),
  );
  const selecting = keys.filter((k) => identities.get(k.identity)?.spec?.allowedNamespaces?.selector);
  const namespaces = await readNamespaces(clients, [...new Set(selecting.map((k) => k.namespace))]);
  const revoked = new Set<string>();
  for (const k of keys) {
    const ns = namespaces.has(k.namespace) ? namespaces.get(k.namespace) : EXISTS;
    if (!mayHoldMirror(identities.get(k.identity), k, ns)) revoked.add(keyString(k));
  }
  return revoked;
}

/** Namespaces by name: a GET each for a few, else one list; absent ones map to undefined. */
async function readNamespaces(
  clients: Clients,
  names: readonly string[],
): Promise<Map<string, NamespaceState | undefined>> {
  if (names.length <= FEW_NAMESPACES)
    return new Map(await Promise.all(names.map(async (n) => [n, await readNamespace(clients, n)] as const)));
  const all = await listNamespaces(clients);
  return new Map(names.map((n) => [n, all.get(n)]));
}

/** Up to this many namespaces are read one by one; more cost one list. */
const FEW_NAMESPACES = 4;

/** A consumer's result before (or without) its status write. */
const resultOf = (key: MirrorKey, p: ConsumerPlan): ConsumerResult => ({
  object: `${key.namespace}/${p.consumer.metadata.name}`,
  kind: p.consumer.kind ?? '',
  identity: key.identity,
  outcome: p.outcome,
  reason: p.reason,
  message: p.message,
  retry: p.retry,
  changed: false,
});

/** Writes one consumer's conditions when they changed; false for a kind this instance does not know. */
async function writeFor(
  ctx: ReconcileContext,
  p: Pick<ConsumerPlan, 'consumer' | 'conditions'>,
  now: Date,
): Promise<boolean> {
  const kind = findConsumerKind(ctx.kinds, p.consumer.apiVersion!, p.consumer.kind!);
  const write: WriteContext = { now, logger: ctx.logger };
  return kind ? writeConditions(ctx.clients, { kind, consumer: p.consumer }, p.conditions, write) : false;
}

/** Writes each consumer's conditions where they changed (a few at a time); returns the results. */
async function writeAllConditions(
  ctx: ReconcileContext,
  key: MirrorKey,
  consumers: readonly ConsumerPlan[],
): Promise<ConsumerResult[]> {
  const now = ctx.now();
  const limit = pLimit(STATUS_CONCURRENCY);
  return Promise.all(
    consumers.map((p) =>
      limit(async (): Promise<ConsumerResult> => ({
        ...resultOf(key, p),
        changed: await writeFor(ctx, p, now),
      })),
    ),
  );
}

/** A failure a retry can fix: throttling, a server error, or no answer (SPEC §4, §16). */
const isTransient = (status: number | undefined): boolean => status === undefined || status === 429 || status >= 500;

/**
 * Why the API server refused a mirror write for good: a namespace being deleted, or the
 * refusal as api-errors.ts describes it — from what was asked and by whom, with the
 * server's sentence only when it is exactly kube-apiserver's RBAC denial for that request
 * (anything else refused it: a policy or webhook, whose text may echo the Secret data).
 */
function refusedWriteMessage(plan: KeyPlan, err: unknown): string {
  const { verb, name } = writeOf(plan);
  const { namespace } = plan.key;
  const what = `${verb} mirror Secret ${namespace}/${name}`;
  const causes = err instanceof RedactedApiError ? err.causes : [];
  if (causes.includes('NamespaceTerminating')) return namespaceTerminatingMessage(verb, namespace, name);
  return `the API server refused to ${what}: ${describeError(err)}`;
}

/**
 * What a failed mirror write leads to: a retry without touching conditions, or `MirrorFailed`.
 * @throws MirrorChanged when the mirror changed since it was read (409, or an update's 404).
 */
async function onWriteFailed(ctx: ReconcileContext, plan: KeyPlan, err: unknown): Promise<KeyOutcome> {
  const status = apiStatus(err);
  if (err instanceof MirrorChanged) throw err;
  if (status === 404) throw new MirrorChanged(`the mirror went away since it was read (404 on ${writeOf(plan).verb})`);
  if (isTransient(status)) {
    // A retry can fix it: no condition, no Event; the caller answers 5xx and the delivery retries.
    const { verb, name } = writeOf(plan);
    return {
      key: plan.key,
      mirrorAction: 'unchanged',
      consumers: plan.consumers.map((p) => ({ ...resultOf(plan.key, p), retry: true })),
      retry: true,
      error: `${verb} of mirror ${plan.key.namespace}/${name} failed: ${describeError(err)}`,
      retryAfterSeconds: retryAfterOf(err),
    };
  }
  // Refused for good: it waits for a person, so the conditions say why and nothing retries.
  return mirrorFailed(ctx, plan, refusedWriteMessage(plan, err));
}

/** The result of a write that cannot succeed without a person: `MirrorFailed`, logged as a warning, not retried. */
async function mirrorFailed(ctx: ReconcileContext, plan: KeyPlan, message: string): Promise<KeyOutcome> {
  const results = await writeAllConditions(ctx, plan.key, failedPlan(plan, message));
  return { key: plan.key, mirrorAction: 'unchanged', consumers: results, retry: false, warning: message };
}

/**
 * SPEC §4 step 3, first part: the plan's mirror write, with the resourceVersion it was read at.
 * @returns what was written, or the key's finished outcome when the write failed (to retry)
 *   or was refused for good (`MirrorFailed` written).
 * @throws MirrorChanged when the mirror changed since it was read; API errors (safe text) of
 *   the condition writes after a refusal.
 */
export async function writeStep(ctx: ReconcileContext, plan: KeyPlan): Promise<Written | KeyOutcome> {
  let written: Awaited<ReturnType<typeof writeMirror>>;
  try {
    written = await writeMirror(ctx.clients, plan);
  } catch (err) {
    return onWriteFailed(ctx, plan, err);
  }
  if (!storedAsWritten(plan, written.stored)) {
    const name = `${plan.key.namespace}/${mirrorName(plan.key.identity)}`;
    return mirrorFailed(
      ctx,
      plan,
      `the API server stored mirror Secret ${name} differently from what was written (an admission webhook or policy changed it), so it is not current; exempt the mirror from that mutation`,
    );
  }
  return { plan, action: written.action };
}

/**
 * SPEC §4 step 3, last part: the conditions of the consumers whose conditions changed.
 * @throws API errors (safe text) of the condition writes.
 */
export async function conditionsStep(ctx: ReconcileContext, w: Written): Promise<KeyOutcome> {
  const results = await writeAllConditions(ctx, w.plan.key, w.plan.consumers);
  return {
    key: w.plan.key,
    mirrorAction: w.action,
    consumers: results,
    sourceHash: w.plan.sourceHash,
    retry: results.some((r) => r.retry),
  };
}

/** Whether a step ended with a write to follow up (not a finished outcome). */
export const isWritten = (s: Written | KeyOutcome): s is Written => 'plan' in s;

/**
 * Acts on one key's plan: the mirror write, the re-check after a create, the conditions.
 * @throws MirrorChanged when the mirror changed since it was read, or a create raced a
 *   revocation (observing again decides the delete); API errors (safe text) of the re-check
 *   and the condition writes.
 */
export async function act(ctx: ReconcileContext, plan: KeyPlan): Promise<KeyOutcome> {
  const w = await writeStep(ctx, plan);
  if (!isWritten(w)) return w;
  if (w.action === 'created' && (await revokedMeanwhile(ctx.clients, [plan.key])).size)
    throw new MirrorChanged('a revocation landed while the mirror was created');
  return conditionsStep(ctx, w);
}

/**
 * Reconciles one key: observe (with `scope` and `seed` the first time, the whole key after the
 * mirror changed), decide, act — again while the mirror keeps changing, a bounded number of
 * times. Logs what it did ({@link logKey}).
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
    result = await retryOnConflict(async (attempt) => {
      const first = attempt === 1;
      const work = { key, scope: first ? scope : ('all' as const), seed: first ? seed : undefined };
      return act(ctx, decide(await observe(ctx.clients, ctx.kinds, work), ctx.kinds));
    }, ATTEMPTS);
  } catch (err) {
    result =
      err instanceof MirrorChanged
        ? { ...failedKey(key, err), error: `the mirror kept changing; gave up after ${ATTEMPTS} attempts` }
        : failedKey(key, err);
  }
  const done: KeyResult = {
    ...result,
    durationMs: Math.round((performance.now() - started) * 10) / 10,
    apiCalls: counter.calls,
  };
  logKey(deps.logger, done, scope);
  return done;
}

/** The result of a key whose reconcile failed on `err` (an API error): retried, with the wait its answer asked for. */
export const failedKey = (key: MirrorKey, err: unknown): KeyOutcome => ({
  key,
  mirrorAction: 'unchanged',
  consumers: [],
  retry: true,
  error: describeError(err),
  retryAfterSeconds: retryAfterOf(err),
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

/**
 * A consumer that has no key (SPEC §4): without `identityRef` its owned conditions are
 * cleared; with a name that cannot be an identity it is `IdentityAllowed=False/IdentityNotFound`;
 * a cluster-scoped one is `IdentityAllowed=False/NamespaceNotAllowed` (SPEC §2). Writes only
 * when that changes something.
 * @returns its result (never retried: it waits for a person). @throws API errors of the write.
 */
export async function settleWithoutKey(ctx: ReconcileContext, consumer: Consumer): Promise<ConsumerResult> {
  const plan = keylessPlan(consumer);
  const changed = await writeFor(ctx, plan, ctx.now());
  return {
    object: `${consumer.metadata.namespace ?? ''}/${consumer.metadata.name}`,
    kind: consumer.kind ?? '',
    identity: consumer.spec?.identityRef?.name,
    outcome: plan.outcome,
    reason: plan.reason,
    message: plan.message,
    retry: false,
    changed,
  };
}
