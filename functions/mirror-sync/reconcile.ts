/**
 * SPEC §4: reconcile one mirror key — observe → decide → act. At most one write to the
 * mirror, with the resourceVersion it was read at; a 409 observes the key again (the whole
 * key, listed) and decides again, a bounded number of times (with a jittered pause). After creating a mirror, the
 * identity and namespace are read again so a revocation that raced the create is undone.
 * Then only the consumers whose conditions changed get a status write. One JSON log line
 * per key; nothing is thrown (API failures become `retry: true`).
 */
import type { KubeConfig, V1Secret } from '@kubernetes/client-node';
import { isNamespaceAllowed } from '../lib/allowed-namespaces.ts';
import pLimit from 'p-limit';
import type { Consumer, ConsumerKind } from '../lib/api.ts';
import type { ConditionInput } from '../lib/conditions.ts';
import { mirrorName } from '../lib/mirror.ts';
import { findConsumerKind } from '../lib/consumers.ts';
import {
  apiStatus,
  deleteSecretIfUnchanged,
  describeError,
  isConflict,
  makeClients,
  redactApiError,
  type Clients,
} from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import {
  decide,
  keyString,
  type ConsumerPlan,
  type MirrorKey,
  type Outcome,
  type Plan,
  type Snapshot,
} from './decide.ts';
import { observe, readIdentity, readNamespace, type Seed } from './observe.ts';
import { writeConditions } from './status.ts';

/** What a reconcile needs from its caller. */
export interface ReconcileDeps {
  kc: KubeConfig;
  kinds: readonly ConsumerKind[];
  logger: Logger;
  /** Clock for lastTransitionTime and Events (tests may fix it). */
  now?: () => Date;
}

/** One consumer's result, for answers and logs. */
export interface ConsumerResult {
  /** `<namespace>/<name>` */
  object: string;
  kind: string;
  /** The identity it names (absent when it names none). */
  identity?: string | undefined;
  /** Decided outcomes (decide.ts), or: it names no identity / it no longer exists. */
  outcome: Outcome | 'no-identity-ref' | 'gone';
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
  durationMs: number;
  apiCalls: number;
}

/** Attempts of observe → decide → act when the mirror write conflicts. */
const ATTEMPTS = 10;
/** Condition writes in flight at once for one key. */
const STATUS_CONCURRENCY = 8;

class Conflict extends Error {}

/**
 * Carries out the mirror part of a plan.
 * @returns what happened. @throws Conflict on 409 (observe again), redacted API errors otherwise.
 */
async function writeMirror(clients: Clients, plan: Plan): Promise<KeyResult['mirrorAction']> {
  const m = plan.mirror;
  const { namespace } = plan.key;
  try {
    switch (m.action) {
      case 'create':
        await clients.core.createNamespacedSecret({ namespace, body: m.body as V1Secret });
        return 'created';
      case 'update':
        // The body carries the resourceVersion it was read at: the precondition.
        await clients.core.replaceNamespacedSecret({
          name: m.body.metadata!.name!,
          namespace,
          body: m.body as V1Secret,
        });
        return 'updated';
      case 'delete':
        await deleteSecretIfUnchanged(clients, m.secret);
        return 'deleted';
      case 'blocked':
        return 'blocked';
      default:
        return 'unchanged';
    }
  } catch (err) {
    if (isConflict(err)) throw new Conflict();
    // Create and update bodies carry Secret data, which the server's message may echo.
    throw m.action === 'delete' ? err : redactApiError(err);
  }
}

/** Fresh reads: is the key's namespace still allowed by its identity (SPEC §2)? */
async function stillAllowed(clients: Clients, key: MirrorKey): Promise<boolean> {
  const [identity, ns] = await Promise.all([
    readIdentity(clients, key.identity),
    readNamespace(clients, key.namespace),
  ]);
  return Boolean(
    identity && ns && isNamespaceAllowed(identity.spec?.allowedNamespaces, { name: key.namespace, labels: ns.labels }),
  );
}

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

/** Writes each consumer's conditions where they changed (a few at a time); returns the results. */
async function writeAllConditions(
  clients: Clients,
  deps: ReconcileDeps,
  key: MirrorKey,
  consumers: readonly ConsumerPlan[],
): Promise<ConsumerResult[]> {
  const now = deps.now?.() ?? new Date();
  const limit = pLimit(STATUS_CONCURRENCY);
  return Promise.all(
    consumers.map((p) =>
      limit(async (): Promise<ConsumerResult> => {
        const kind = findConsumerKind(deps.kinds, p.consumer.apiVersion!, p.consumer.kind!);
        const changed = kind ? await writeConditions(clients, kind, p.consumer, p.conditions, now, deps.logger) : false;
        return { ...resultOf(key, p), changed };
      }),
    ),
  );
}

/**
 * Acts on a plan decided from a snapshot: the mirror write, the re-check after a create,
 * the conditions.
 * @returns the result, or `'conflict'` when the mirror changed since it was read (or a
 *   create raced a revocation and was undone): the caller observes the key again.
 * @throws API errors (safe text) other than 409.
 */
export async function act(
  clients: Clients,
  deps: ReconcileDeps,
  plan: Plan,
): Promise<Omit<KeyResult, 'durationMs' | 'apiCalls'> | 'conflict'> {
  let mirrorAction: KeyResult['mirrorAction'];
  try {
    mirrorAction = await writeMirror(clients, plan);
  } catch (err) {
    if (err instanceof Conflict) return 'conflict';
    const status = apiStatus(err);
    // The mirror went away since it was read (an update answers 404): observe again.
    if (status === 404) return 'conflict';
    const target =
      plan.mirror.action === 'delete'
        ? plan.mirror.secret.metadata?.name
        : (plan.mirror as { body?: { metadata?: { name?: string } } }).body?.metadata?.name;
    const message = `writing mirror ${plan.key.namespace}/${target} failed: ${describeError(err)}`;
    // SPEC §4, §16: a failure a retry can fix (throttling, a server error, no answer) changes
    // no condition and records no Event; the caller answers 5xx and the delivery retries.
    if (status === undefined || status === 429 || status >= 500) {
      return {
        key: plan.key,
        mirrorAction: 'unchanged',
        consumers: plan.consumers.map((p) => ({ ...resultOf(plan.key, p), retry: true })),
        retry: true,
        error: message,
      };
    }
    // Refused for good. A revocation whose delete was refused still states what it decided.
    const failed =
      plan.mirror.action === 'delete'
        ? plan.consumers
        : plan.consumers.map((p): ConsumerPlan => ({
            ...p,
            outcome: 'mirror-failed',
            reason: 'MirrorFailed',
            message,
            conditions: [
              ...p.conditions.filter((c) => c.type === 'IdentityAllowed'),
              {
                type: 'CredentialsMirrored',
                status: 'False',
                reason: 'MirrorFailed',
                message,
                ...(p.consumer.metadata.generation === undefined
                  ? {}
                  : { observedGeneration: p.consumer.metadata.generation }),
              },
            ],
          }));
    const results = await writeAllConditions(clients, deps, plan.key, failed);
    return {
      key: plan.key,
      mirrorAction: 'unchanged',
      consumers: results.map((r) => ({ ...r, retry: true })),
      retry: true,
    };
  }
  // A revocation may have landed after our reads and found no mirror to delete: read the
  // permission again after creating, and undo (observing again decides the revocation).
  if (mirrorAction === 'created' && !(await stillAllowed(clients, plan.key))) return 'conflict';
  const results = await writeAllConditions(clients, deps, plan.key, plan.consumers);
  return {
    key: plan.key,
    mirrorAction,
    consumers: results,
    sourceHash: plan.sourceHash,
    retry: results.some((r) => r.retry),
  };
}

/**
 * Reconciles one key: observe (with `scope` and `seed` the first time, the whole key after a
 * conflict), decide, act. Logs what it did ({@link logKey}).
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
  let result: Omit<KeyResult, 'durationMs' | 'apiCalls'> | undefined;
  try {
    const clients = makeClients(deps.kc, counter);
    for (let attempt = 1; attempt <= ATTEMPTS && !result; attempt++) {
      // Another writer got there first: a short jittered pause so two instances do not collide in lockstep.
      if (attempt > 1) await new Promise((r) => setTimeout(r, Math.floor(Math.random() * 25 * attempt)));
      const snapshot = await observe(
        clients,
        deps.kinds,
        key,
        attempt === 1 ? scope : 'all',
        attempt === 1 ? seed : undefined,
      );
      const r = await act(clients, deps, decide(snapshot, deps.kinds));
      if (r !== 'conflict') result = r;
    }
    result ??= {
      key,
      mirrorAction: 'unchanged',
      consumers: [],
      retry: true,
      error: `the mirror kept changing; gave up after ${ATTEMPTS} attempts`,
    };
  } catch (err) {
    result = { key, mirrorAction: 'unchanged', consumers: [], retry: true, error: describeError(err) };
  }
  const done: KeyResult = {
    ...result,
    durationMs: Math.round((performance.now() - started) * 10) / 10,
    apiCalls: counter.calls,
  };
  logKey(deps.logger, done, scope);
  return done;
}

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
  let logged = 0;
  for (const c of r.consumers) {
    if (!c.changed && c.outcome === 'mirrored' && !named.has(`${c.kind}/${c.object.split('/')[1]}`)) continue;
    logged++;
    // `message` would be merged into winston's own message field, so it is logged as `detail`.
    logger.log('info', 'reconcile', {
      object: c.object,
      kind: c.kind,
      outcome: c.outcome,
      reason: c.reason,
      retry: c.retry,
      ...common,
      detail: c.message,
    });
  }
  if (r.error || (logged === 0 && (r.mirrorAction !== 'unchanged' || named.size > 0))) {
    logger.log(r.error ? 'warn' : 'info', 'reconcile key', {
      key: keyString(r.key),
      namespace: r.key.namespace,
      consumers: r.consumers.length,
      retry: r.retry,
      ...common,
      ...(r.error ? { detail: r.error } : {}),
    });
  }
}

/**
 * A consumer that names no usable identity has no key (SPEC §4): without `identityRef` its
 * owned conditions are cleared; with a name that cannot be an identity it is
 * `IdentityAllowed=False/IdentityNotFound`. Writes only when that changes something.
 * @returns its result (never retried: it waits for a person). @throws API errors of the write.
 */
export async function settleWithoutKey(
  clients: Clients,
  deps: ReconcileDeps,
  consumer: Consumer,
): Promise<ConsumerResult> {
  const kind = findConsumerKind(deps.kinds, consumer.apiVersion!, consumer.kind!);
  const object = `${consumer.metadata.namespace}/${consumer.metadata.name}`;
  const identity = consumer.spec?.identityRef?.name;
  const now = deps.now?.() ?? new Date();
  if (!identity) {
    const changed = kind ? await writeConditions(clients, kind, consumer, [], now, deps.logger) : false;
    return {
      object,
      kind: consumer.kind ?? '',
      outcome: 'no-identity-ref',
      reason: 'NoIdentityRef',
      message: 'spec.identityRef is not set; no credentials are mirrored',
      retry: false,
      changed,
    };
  }
  const message = `spec.identityRef.name ${JSON.stringify(identity).slice(0, 80)} is not a valid TerraformClusterIdentity name`;
  const cond: ConditionInput = {
    type: 'IdentityAllowed',
    status: 'False',
    reason: 'IdentityNotFound',
    message,
    ...(consumer.metadata.generation === undefined ? {} : { observedGeneration: consumer.metadata.generation }),
  };
  const changed = kind ? await writeConditions(clients, kind, consumer, [cond], now, deps.logger) : false;
  return {
    object,
    kind: consumer.kind ?? '',
    outcome: 'identity-not-found',
    reason: 'IdentityNotFound',
    message,
    retry: false,
    changed,
  };
}
