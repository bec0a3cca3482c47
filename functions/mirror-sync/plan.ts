/**
 * Pure decisions of one consumer reconcile (SPEC §3, §4, §6, §16): what to do with the
 * mirror, and which conditions the object should carry for an outcome. No I/O.
 */
import type { Condition, OwnerReference } from '../lib/api.ts';
import { conditionChanged, setCondition, type ConditionInput } from '../lib/conditions.ts';
import {
  ANNOTATION_SOURCE_HASH, LABEL_MANAGED, LABEL_MIRRORED, desiredMirror, groupOf, isCurrent, isOurs,
  withOwnerReference, withoutOwnerReference, type SecretData, type SecretLike,
} from '../lib/mirror.ts';

/** What to do with the namespace's mirror Secret. */
export type MirrorPlan =
  | { action: 'create'; body: ReturnType<typeof desiredMirror> }
  | { action: 'update'; body: SecretLike; dataChanged: boolean }
  | { action: 'none' }
  | { action: 'blocked'; reason: 'MirrorFailed'; message: string };

/**
 * SPEC §4 step 6: plans the mirror write for one consumer.
 * @param existing the Secret currently holding the mirror's name (undefined when absent).
 * @param identityName identity name; @param namespace consumer namespace.
 * @param sourceData the source Secret's data (base64 values); @param hash its source hash.
 * @param owner the consumer's owner reference.
 * @returns create (no Secret), update (ours but stale data, labels or owner reference; body
 *   carries the existing resourceVersion as precondition), none (nothing to change), or
 *   blocked (a Secret that is not ours holds the name: never written).
 */
export function planMirror(
  existing: SecretLike | undefined,
  identityName: string,
  namespace: string,
  sourceData: SecretData | undefined,
  hash: string,
  owner: OwnerReference,
): MirrorPlan {
  if (!existing) return { action: 'create', body: desiredMirror(identityName, namespace, sourceData, owner) };
  if (!isOurs(existing, identityName)) {
    return {
      action: 'blocked',
      reason: 'MirrorFailed',
      message: `Secret ${namespace}/${existing.metadata?.name} exists and is not a mirror of identity ${identityName} (it lacks label captf.io/mirrored=true or annotation captf.io/identity=${identityName}); rename or delete it so the mirror can be created`,
    };
  }
  const dataChanged = !isCurrent(existing, hash);
  const refs = withOwnerReference(existing.metadata?.ownerReferences, owner);
  const labels = existing.metadata?.labels ?? {};
  const labelsChanged = labels[LABEL_MIRRORED] !== 'true' || labels[LABEL_MANAGED] !== 'true';
  const typeOk = existing.type === undefined || existing.type === 'Opaque';
  if (!dataChanged && !refs.changed && !labelsChanged) return { action: 'none' };
  if (!typeOk && dataChanged) {
    // `type` is immutable; a mirror of another type cannot be repaired in place.
    return { action: 'blocked', reason: 'MirrorFailed', message: `mirror ${namespace}/${existing.metadata?.name} has type ${existing.type}, not Opaque; delete it so it can be recreated` };
  }
  const body: SecretLike = {
    ...existing,
    metadata: {
      ...existing.metadata,
      labels: { ...labels, [LABEL_MIRRORED]: 'true', [LABEL_MANAGED]: 'true' },
      annotations: { ...existing.metadata?.annotations, [ANNOTATION_SOURCE_HASH]: hash },
      ownerReferences: refs.refs,
    },
    data: dataChanged ? { ...(sourceData ?? {}) } : existing.data ?? {},
  };
  return { action: 'update', body, dataChanged };
}

/** Whether an owner reference points at a configured consumer kind. */
export type IsConsumerRef = (ref: OwnerReference) => boolean;

/** Builds {@link IsConsumerRef} for configured kinds (matched by group and kind, any version). */
export function consumerRefMatcher(kinds: readonly { group: string; kind: string }[]): IsConsumerRef {
  return (ref) => kinds.some((k) => k.group === groupOf(ref.apiVersion) && k.kind === ref.kind);
}

/** What to do with a mirror when a consumer lets go of it. */
export type ReleasePlan =
  | { action: 'none' }
  | { action: 'update'; ownerReferences: OwnerReference[] }
  | { action: 'delete' };

/**
 * SPEC §6: a consumer stopped using a mirror (gone, no identityRef, or another identity).
 * @param owner the consumer (uid optional: without it any UID of that name is released).
 * @returns none (not referenced), delete (no consumer reference would remain), or update
 *   (other consumers remain: drop only this reference).
 */
export function planRelease(
  mirror: SecretLike,
  owner: { apiVersion: string; kind: string; name: string; uid?: string | undefined },
  isConsumerRef: IsConsumerRef,
): ReleasePlan {
  const { refs, changed } = withoutOwnerReference(mirror.metadata?.ownerReferences, owner);
  if (!changed) return { action: 'none' };
  if (!refs.some(isConsumerRef)) return { action: 'delete' };
  return { action: 'update', ownerReferences: refs };
}

/** The condition types this function owns on consumers (SPEC §16). */
export const OWNED_TYPES = ['IdentityAllowed', 'CredentialsMirrored', 'ApplyJobSucceeded'] as const;

/**
 * The conditions a consumer should carry: `desired` set by type, every other owned type
 * removed (a reconcile that stops early states only what it knows), other writers' types
 * kept untouched.
 * @returns the full new list and the owned conditions that changed (for Events); `changed`
 *   false means no status write is needed.
 */
export function planConditions(
  current: readonly Condition[] | undefined,
  desired: readonly ConditionInput[],
  now: Date,
): { conditions: Condition[]; owned: Condition[]; changedInputs: ConditionInput[]; changed: boolean } {
  const desiredTypes = new Set(desired.map((d) => d.type));
  const removed = (current ?? []).filter((c) => (OWNED_TYPES as readonly string[]).includes(c.type) && !desiredTypes.has(c.type));
  const changedInputs = desired.filter((d) => conditionChanged(current, d));
  let next = (current ?? []).filter((c) => !removed.includes(c));
  for (const d of desired) next = setCondition(next, d, now);
  const owned = next.filter((c) => desiredTypes.has(c.type));
  return { conditions: next, owned, changedInputs, changed: changedInputs.length > 0 || removed.length > 0 };
}
