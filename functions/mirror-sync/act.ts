/**
 * SPEC §4 step 3, §7: the one writer. A key's reconcile, an identity's or a namespace's pass and
 * the resync all hand their plans (decide.ts) to {@link act}, which writes exactly what they say:
 * 1. each plan's one mirror request (writes.ts), revocations before every other (SPEC §7): an
 *    added owner reference a merge without a resourceVersion, everything else (a removed
 *    reference included) with its precondition;
 * 2. one re-read of the identities and namespaces after all creates (a revocation that landed
 *    meanwhile found no mirror to delete: such a create is decided again);
 * 3. the conditions of the consumers whose conditions changed (status.ts), one Event each.
 * Every failure is classified once (errors.ts): a conflict sends the plan back to be decided
 * again, a failure a retry can fix answers 5xx and changes no condition, a refusal for good is
 * `MirrorFailed`. Nothing is thrown for one plan's failure.
 */
import type { KubeConfig, V1Secret } from '@kubernetes/client-node';
import pLimit, { type LimitFunction } from 'p-limit';
import type { Consumer, ConsumerKind } from '../lib/api.ts';
import { findConsumerKind } from '../lib/consumers.ts';
import {
  deleteSecretIfUnchanged,
  describeError,
  makeClients,
  redactApiError,
  RedactedApiError,
  retryAfterOf,
  STRATEGIC_MERGE,
  type CallCounter,
  type Clients,
} from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import { telemetry, type MirrorWriteKind } from '../lib/telemetry.ts';
import { isCurrent, isOurs, mirrorName, type SecretLike } from '../lib/mirror.ts';
import {
  failedPlan,
  keylessPlan,
  keyString,
  mayHoldMirror,
  namespaceTerminatingMessage,
  writeOf,
  type ConsumerOutcome,
  type ConsumerPlan,
  type KeyPlan,
  type MirrorKey,
  type NamespaceState,
} from './decide.ts';
import { classify, Conflict } from './errors.ts';
import { EXISTS, listNamespaces, readIdentity, readNamespace } from './observe.ts';
import { conditionPlan, writeConditions } from './status.ts';
import { mirrorWriteOf } from './writes.ts';

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

/** What acting on one key's plan did. */
export interface KeyOutcome {
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
}

/** How one plan ended: its outcome, or a conflict (decide it again from fresh reads). */
export type Acted = { plan: KeyPlan; outcome: KeyOutcome } | { plan: KeyPlan; conflict: Conflict };

/** How {@link act} treats the plans' conditions. */
export interface ActOptions {
  /** Plans acted on at once. */
  limit: LimitFunction;
  /**
   * `write`: the plans were decided from reads made for this request (a key's observe, an event's
   * lists), so their conditions are written. `decide-again`: they were decided from lists that may
   * be minutes old (the resync), so a plan whose conditions would change is a conflict instead,
   * and is decided again from fresh reads before any condition is written.
   */
  conditions: 'write' | 'decide-again';
}

/** Condition writes in flight at once for one key. */
const STATUS_CONCURRENCY = 8;

/**
 * Acts on plans (module comment): mirror writes (revocations first), one re-check after the
 * creates, then conditions.
 * @returns one {@link Acted} per plan, in the order given. Never throws for a plan's failure.
 */
export async function act(ctx: ReconcileContext, plans: readonly KeyPlan[], opts: ActOptions): Promise<Acted[]> {
  const revocations = plans.filter(isRevocation);
  const rest = plans.filter((p) => !isRevocation(p));
  const write = (plan: KeyPlan) => opts.limit(() => writeStep(ctx, plan));
  // Revocations first (SPEC §7): credentials leave before anything else is written.
  const steps = new Map<KeyPlan, Step>();
  for (const [i, s] of (await Promise.all(revocations.map(write))).entries()) steps.set(revocations[i]!, s);
  for (const [i, s] of (await Promise.all(rest.map(write))).entries()) steps.set(rest[i]!, s);
  const created = plans.filter(
    (p) => steps.get(p)!.step === 'written' && (steps.get(p) as Written).action === 'created',
  );
  const revoked = await recheck(ctx, created);
  return Promise.all(plans.map((p) => opts.limit(() => finish(ctx, steps.get(p)!, revoked, opts))));
}

/** The kind of mirror request a plan sends, as counted (lib/telemetry.ts); undefined when it sends none. */
function writeKindOf(plan: KeyPlan): MirrorWriteKind | undefined {
  const action = plan.mirror.action;
  if (action === 'delete') return isRevocation(plan) ? 'revoke' : 'delete';
  return action === 'create' || action === 'update' || action === 'merge' ? action : undefined;
}

/** A plan that takes credentials away (SPEC §7). */
const isRevocation = (p: KeyPlan): boolean => p.mirror.action === 'delete' && p.mirror.why !== 'unused';

/** A plan whose mirror request went through (or needed none), and what it did. */
interface Written {
  step: 'written';
  plan: KeyPlan;
  action: KeyOutcome['mirrorAction'];
}

/** Where a plan stands after its mirror request. */
type Step = Written | ({ step: 'ended' } & Acted);

/** One plan's mirror request, and what follows from how it ended. */
async function writeStep(ctx: ReconcileContext, plan: KeyPlan): Promise<Step> {
  const kind = writeKindOf(plan);
  let written: Awaited<ReturnType<typeof writeMirror>>;
  try {
    written = await writeMirror(ctx.clients, plan);
  } catch (err) {
    if (kind) telemetry().mirrorWrite(kind, classify(err));
    return { step: 'ended', ...(await failedWrite(ctx, plan, err)) };
  }
  if (kind) telemetry().mirrorWrite(kind, 'ok');
  if (!storedAsWritten(plan, written.stored)) {
    const name = `${plan.key.namespace}/${mirrorName(plan.key.identity)}`;
    const message = `the API server stored mirror Secret ${name} differently from what was written (an admission webhook or policy changed it), so it is not current; exempt the mirror from that mutation`;
    return { step: 'ended', ...(await mirrorFailed(ctx, plan, message)) };
  }
  return { step: 'written', plan, action: written.action };
}

/**
 * Sends the mirror part of a plan: the one request writes.ts {@link mirrorWriteOf} describes.
 * @returns what happened, and the mirror as stored. @throws the request's error, unredacted
 *   (the caller classifies it, then redacts it).
 */
async function writeMirror(clients: Clients, plan: KeyPlan): Promise<{ action: Written['action']; stored?: V1Secret }> {
  const w = mirrorWriteOf(plan);
  if (!w) return { action: plan.mirror.action === 'blocked' ? 'blocked' : 'unchanged' };
  const { namespace, name } = w;
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
      // An add carries no resourceVersion: the API server merges the reference into whatever is
      // stored, so instances adding consumers to one mirror at once never conflict (SPEC §4). A
      // removal carries the one it was decided from (writes.ts).
      return {
        action: 'updated',
        stored: await clients.core.patchNamespacedSecret({ name, namespace, body: w.body }, STRATEGIC_MERGE),
      };
    case 'delete': {
      const gone = await deleteSecretIfUnchanged(clients, { metadata: { name, namespace, ...w.precondition } });
      // Already gone (another writer, the garbage collector): nothing was deleted here.
      return { action: gone ? 'deleted' : 'unchanged' };
    }
  }
}

/**
 * Did the API server store the mirror as written? A mutating webhook or policy may change it on
 * the way (the hash annotation, the data): then it is not current, and no retry makes it so.
 */
function storedAsWritten(plan: KeyPlan, stored: V1Secret | undefined): boolean {
  // A merge writes no data: what another writer stored meanwhile is that writer's to check.
  if (!stored || plan.sourceHash === undefined || plan.mirror.action === 'merge') return true;
  const s = stored as SecretLike;
  // Stored as written means our labels and annotation kept and the data current; a mirror is
  // only ever written for an identity whose source is not a mirror, so no source can match.
  return isOurs(s, plan.key.identity, undefined) && isCurrent(s, plan.sourceHash);
}

/** What a failed mirror request leads to, by its kind (errors.ts). */
async function failedWrite(ctx: ReconcileContext, plan: KeyPlan, err: unknown): Promise<Acted> {
  const { verb, name } = writeOf(plan);
  switch (classify(err)) {
    case 'conflict':
      return { plan, conflict: new Conflict(`the mirror changed since it was read (${verb} refused)`) };
    case 'retry':
      // A retry can fix it: no condition, no Event; the caller answers 5xx and the delivery retries.
      return {
        plan,
        outcome: {
          ...unwritten(plan, true),
          error: `${verb} of mirror ${plan.key.namespace}/${name} failed: ${describeError(err)}`,
          retryAfterSeconds: retryAfterOf(err),
        },
      };
    default:
      // Refused for good: it waits for a person, so the conditions say why and nothing retries.
      return mirrorFailed(ctx, plan, refusedWriteMessage(plan, err));
  }
}

/**
 * Why the API server refused a mirror write for good: a namespace being deleted, or the refusal
 * as api-errors.ts describes it — from what was asked and by whom, with the server's sentence only
 * when it is exactly kube-apiserver's RBAC denial for that request (anything else refused it: a
 * policy or webhook, whose text may echo the Secret data, so the error is redacted first).
 */
function refusedWriteMessage(plan: KeyPlan, err: unknown): string {
  const { verb, name } = writeOf(plan);
  const { namespace } = plan.key;
  const redacted = redactApiError(err);
  const causes = redacted instanceof RedactedApiError ? redacted.causes : [];
  if (causes.includes('NamespaceTerminating')) return namespaceTerminatingMessage(verb, namespace, name);
  return `the API server refused to ${verb} mirror Secret ${namespace}/${name}: ${describeError(redacted)}`;
}

/** The outcome of a write that cannot succeed without a person: `MirrorFailed` written, a warning, not retried. */
async function mirrorFailed(ctx: ReconcileContext, plan: KeyPlan, message: string): Promise<Acted> {
  const failed = { ...plan, consumers: failedPlan(plan, message) };
  try {
    const consumers = await writeAllConditions(ctx, failed);
    return { plan, outcome: { ...unwritten(plan, false), consumers, warning: message } };
  } catch (err) {
    return conditionsFailed(plan, err);
  }
}

/**
 * SPEC §4 step 3: after creating mirrors, one re-read of the identities and namespaces serves
 * every key created: is each still allowed (SPEC §2)? Namespaces are read only for identities
 * that select by label (a listed name needs none: a namespace gone takes its mirror with it), one
 * GET each for a few, one list for more.
 * @returns the keys no longer allowed, or the error of the re-read (those creates then end in a retry).
 */
async function recheck(ctx: ReconcileContext, created: readonly KeyPlan[]): Promise<Set<string> | Error> {
  if (!created.length) return new Set();
  try {
    return await revokedMeanwhile(
      ctx.clients,
      created.map((p) => p.key),
    );
  } catch (err) {
    return err instanceof Error ? err : new Error(describeError(err));
  }
}

/** The keys of `keys` their identity or namespace no longer allows (SPEC §2, §3). @throws API errors. */
async function revokedMeanwhile(clients: Clients, keys: readonly MirrorKey[]): Promise<Set<string>> {
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

/** Up to this many namespaces are read one by one; more cost one list. */
const FEW_NAMESPACES = 4;

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

/** A plan after its mirror request and the re-check: its conditions, a conflict, or how it ended. */
async function finish(
  ctx: ReconcileContext,
  step: Step,
  revoked: Set<string> | Error,
  opts: ActOptions,
): Promise<Acted> {
  if (step.step === 'ended') return step;
  const { plan } = step;
  if (step.action === 'created') {
    if (revoked instanceof Error) return { plan, outcome: { ...unwritten(plan, true), ...failure(revoked) } };
    // A revocation landed meanwhile: deciding again deletes what was just created.
    if (revoked.has(keyString(plan.key)))
      return { plan, conflict: new Conflict('a revocation landed while the mirror was created') };
  }
  if (opts.conditions === 'decide-again' && conditionsChange(ctx, plan))
    return { plan, conflict: new Conflict('conditions decided from aged lists are decided again from fresh reads') };
  try {
    const consumers = await writeAllConditions(ctx, plan);
    const outcome = { key: plan.key, mirrorAction: step.action, consumers, sourceHash: plan.sourceHash };
    return { plan, outcome: { ...outcome, retry: consumers.some((r) => r.retry) } };
  } catch (err) {
    return conditionsFailed(plan, err);
  }
}

/** Whether acting on a plan would write any consumer's conditions. */
export const conditionsChange = (ctx: ReconcileContext, plan: KeyPlan): boolean => {
  const now = ctx.now();
  return plan.consumers.some((p) => conditionPlan(p.consumer, p.conditions, now).changed);
};

/** A condition write failed: a consumer changed under it (decide again), or a failure to retry. */
function conditionsFailed(plan: KeyPlan, err: unknown): Acted {
  if (classify(err) === 'conflict')
    return { plan, conflict: err instanceof Conflict ? err : new Conflict('a consumer changed since it was read') };
  return { plan, outcome: { ...unwritten(plan, true), ...failure(err) } };
}

/** A key's outcome with nothing (more) written: its consumers as decided, retried or not. */
const unwritten = (plan: KeyPlan, retry: boolean): KeyOutcome => ({
  key: plan.key,
  mirrorAction: 'unchanged',
  consumers: plan.consumers.map((p) => ({ ...resultOf(plan.key, p), retry })),
  retry,
});

/** The error fields of an outcome that failed on `err`: safe text, and the wait a throttled API server asked for. */
export const failure = (err: unknown): Pick<KeyOutcome, 'error' | 'retryAfterSeconds'> => ({
  error: describeError(err),
  retryAfterSeconds: retryAfterOf(err),
});

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

/**
 * Writes one consumer's conditions when they changed, counting the outcome written
 * (lib/telemetry.ts); false for a kind this instance does not know.
 */
async function writeFor(
  ctx: ReconcileContext,
  p: Pick<ConsumerPlan, 'consumer' | 'conditions' | 'outcome'>,
  now: Date,
): Promise<boolean> {
  const kind = findConsumerKind(ctx.kinds, p.consumer.apiVersion!, p.consumer.kind!);
  if (!kind) return false;
  const wrote = await writeConditions(ctx.clients, { kind, consumer: p.consumer }, p.conditions, {
    now,
    logger: ctx.logger,
  });
  if (wrote) telemetry().consumerStatus(p.outcome);
  return wrote;
}

/**
 * Writes each consumer's conditions where they changed (a few at a time).
 * @returns the results. @throws the first failed write's error (a status.ts {@link Conflict}, API errors).
 */
async function writeAllConditions(ctx: ReconcileContext, plan: KeyPlan): Promise<ConsumerResult[]> {
  const now = ctx.now();
  const limit = pLimit(STATUS_CONCURRENCY);
  return Promise.all(
    plan.consumers.map((p) =>
      limit(async (): Promise<ConsumerResult> => ({ ...resultOf(plan.key, p), changed: await writeFor(ctx, p, now) })),
    ),
  );
}

/**
 * A consumer that has no key (SPEC §4): without `identityRef` its owned conditions are cleared;
 * with a name that cannot be an identity it is `IdentityAllowed=False/IdentityNotFound`; a
 * cluster-scoped one is `IdentityAllowed=False/NamespaceNotAllowed` (SPEC §2). Writes only when
 * that changes something.
 * @returns its result (never retried: it waits for a person). @throws the write's error.
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
