/**
 * SPEC §9: what an identity's status should say, and whether writing it would change
 * anything. Pure: the refresh (refresh.ts) gathers the facts from the API server and hands
 * them here; nothing in this file does I/O.
 */
import { API_VERSION, IDENTITY_KIND, type Condition, type TerraformClusterIdentity } from '../lib/api.ts';
import { conditionChanged, getCondition, setCondition, type ConditionInput } from '../lib/conditions.ts';
import { reservedSourceMessage } from '../lib/mirror.ts';
import type { StatusApply } from '../lib/objects.ts';

/** Condition type this function owns on identities (SPEC §9). */
export const READY = 'Ready';

/** `Ready=True`: the source Secret exists (SPEC §9; docs/troubleshooting.md). */
export const REASON_SECRET_FOUND = 'SecretFound';
/** `Ready=False`: the source Secret's GET answered 404 (SPEC §9). */
export const REASON_SECRET_NOT_FOUND = 'SecretNotFound';
/** `Ready=False`: the source Secret's GET answered 403 to this function's user (SPEC §9). */
export const REASON_SECRET_UNREADABLE = 'SecretUnreadable';
/** `Ready=False`: `spec.secretRef.name` has the prefix reserved for mirrors; the identity is inert (SPEC §3, §9). */
export const REASON_SECRET_IS_MIRROR = 'SecretIsMirror';
/** Every reason of `Ready` this function writes. */
export const READY_REASONS: readonly string[] = Object.freeze([
  REASON_SECRET_FOUND,
  REASON_SECRET_NOT_FOUND,
  REASON_SECRET_UNREADABLE,
  REASON_SECRET_IS_MIRROR,
]);

/**
 * What a direct GET of the source Secret said: it exists, the API answered 404, or it
 * answered 403 to this function's user; or `is-mirror`: the name is reserved for mirrors, so
 * it was not read at all. Any other answer is an error the caller retries.
 */
export type SourceState = 'found' | 'not-found' | 'forbidden' | 'is-mirror';

/** Where an identity is in use: namespaces of consumers that reference it and of its mirrors. */
export interface Usage {
  /** Namespaces holding a consumer whose `spec.identityRef.name` is the identity (deleting ones included). */
  consumerNamespaces: Iterable<string>;
  /** Namespaces holding the identity's mirror (a Secret that `isOurs`). */
  mirrorNamespaces: Iterable<string>;
}

/** The desired status and what differs from the current one. */
export interface StatusDecision {
  /** The `Ready` condition to apply, `lastTransitionTime` kept unless the status flips. */
  ready: Condition;
  /** Sorted, unique namespaces where the identity is in use. */
  namespaces: string[];
  /** What would change: `'Ready'` and/or `'namespaces'`; empty means write nothing. */
  changed: ('Ready' | 'namespaces')[];
}

/**
 * SPEC §9: the `Ready` condition for a source Secret state.
 * @param identity the identity as read (its `spec.secretRef` and `metadata.generation`).
 * @param source the direct GET's outcome.
 * @returns type `Ready`: True/SecretFound, False/SecretNotFound, False/SecretUnreadable or False/SecretIsMirror,
 *   with `observedGeneration` = the identity's generation. Messages name the Secret, never data.
 */
export function readyCondition(identity: TerraformClusterIdentity, source: SourceState): ConditionInput {
  const observedGeneration = identity.metadata.generation;
  return {
    type: READY,
    ...READY_BY_STATE[source](identity.spec?.secretRef ?? {}),
    ...(observedGeneration === undefined ? {} : { observedGeneration }),
  };
}

type SecretRefLike = { namespace?: string; name?: string };
const where = (ref: SecretRefLike) => `${ref.namespace ?? '?'}/${ref.name ?? '?'}`;

/** The status, reason and message of `Ready` for each source state. */
const READY_BY_STATE: Record<
  SourceState,
  (ref: SecretRefLike) => Pick<ConditionInput, 'status' | 'reason' | 'message'>
> = {
  found: (ref) => ({ status: 'True', reason: REASON_SECRET_FOUND, message: `source Secret ${where(ref)} exists` }),
  'not-found': (ref) => ({
    status: 'False',
    reason: REASON_SECRET_NOT_FOUND,
    message: `source Secret ${where(ref)} does not exist; create it or correct spec.secretRef`,
  }),
  forbidden: (ref) => ({
    status: 'False',
    reason: REASON_SECRET_UNREADABLE,
    message: `identity-status is not allowed to get source Secret ${where(ref)} (403); grant its service account get on that Secret`,
  }),
  'is-mirror': (ref) => ({
    status: 'False',
    reason: REASON_SECRET_IS_MIRROR,
    message: `inert: ${reservedSourceMessage(ref.name ?? '')}; nothing is copied from it and its mirrors are deleted`,
  }),
};

/**
 * SPEC §9: `status.namespaces` = the union of consumer and mirror namespaces, unique, sorted
 * by code unit (stable across locales), without the empty name (a cluster-scoped object is
 * in no namespace).
 */
export function namespacesInUse(usage: Usage): string[] {
  const all = new Set<string>([...usage.consumerNamespaces, ...usage.mirrorNamespaces]);
  all.delete('');
  return [...all].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

/**
 * Decides an identity's status.
 * @param identity as read from the API server (current `status` included).
 * @param source outcome of the direct GET of its source Secret.
 * @param usage where it is in use.
 * @param now clock for `lastTransitionTime` when `Ready` flips.
 * @returns the desired `Ready` condition and namespaces, and `changed`: `Ready` when status,
 *   reason, message or observedGeneration differ; `namespaces` when the sorted list differs
 *   (an absent list equals an empty one, so a fresh identity with no users needs no write
 *   for that field alone).
 */
export function decideStatus(
  identity: TerraformClusterIdentity,
  source: SourceState,
  usage: Usage,
  now: Date,
): StatusDecision {
  const conditions = identity.status?.conditions;
  const next = readyCondition(identity, source);
  const ready = getCondition(setCondition(conditions, next, now), READY)!;
  const namespaces = namespacesInUse(usage);
  const current = identity.status?.namespaces ?? [];
  const changed: StatusDecision['changed'] = [];
  if (conditionChanged(conditions, next)) changed.push('Ready');
  if (current.length !== namespaces.length || current.some((n, i) => n !== namespaces[i])) changed.push('namespaces');
  return { ready, namespaces, changed };
}

/**
 * The server-side apply body for the status subresource: only the fields this function owns
 * (`Ready` in the list-map keyed by `type`, so other writers' condition types stay, and
 * `namespaces`), plus `metadata.resourceVersion` as an optimistic-concurrency precondition
 * (the write fails with 409 if the identity changed since it was read).
 */
export function statusApplyBody(identity: TerraformClusterIdentity, decision: StatusDecision): StatusApply {
  return {
    apiVersion: API_VERSION,
    kind: IDENTITY_KIND,
    metadata: {
      name: identity.metadata.name,
      ...(identity.metadata.resourceVersion ? { resourceVersion: identity.metadata.resourceVersion } : {}),
    },
    status: { conditions: [decision.ready], namespaces: decision.namespaces },
  };
}
