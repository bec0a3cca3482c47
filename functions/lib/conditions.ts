/**
 * Condition helpers in the manner of Cluster API's `util/conditions` (SPEC §16,
 * `metav1.Condition`): set one condition by type, keep `lastTransitionTime` unless the
 * status flips, and compare before writing. Pure.
 */
import type { Condition } from './api.ts';

/** A condition as a decision states it; the helper fills in `lastTransitionTime`. */
export type ConditionInput = Omit<Condition, 'lastTransitionTime'>;

/** The condition types this project owns on consumers (SPEC §16); others' types are never touched. */
export const CONSUMER_CONDITION_TYPES = ['IdentityAllowed', 'CredentialsMirrored', 'ApplyJobSucceeded'] as const;

/** RFC 3339 at second precision, as `metav1.Time` serialises. */
export function rfc3339(now: Date): string {
  return now.toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** The condition of `type`, or undefined. */
export function getCondition(conditions: readonly Condition[] | undefined, type: string): Condition | undefined {
  return conditions?.find((c) => c.type === type);
}

/**
 * Sets one condition by type.
 * @param conditions current list (not modified).
 * @param next the desired type/status/reason/message/observedGeneration.
 * @param now clock used for `lastTransitionTime` when the status flips or the type is new.
 * @returns a new list; other types keep their order and values; `lastTransitionTime` is
 *   kept when the status did not change.
 */
export function setCondition(
  conditions: readonly Condition[] | undefined,
  next: ConditionInput,
  now: Date,
): Condition[] {
  const list = [...(conditions ?? [])];
  const i = list.findIndex((c) => c.type === next.type);
  const prev = i >= 0 ? list[i] : undefined;
  const lastTransitionTime = prev && prev.status === next.status ? prev.lastTransitionTime : rfc3339(now);
  const cond: Condition = { ...next, lastTransitionTime };
  if (next.observedGeneration === undefined) delete cond.observedGeneration;
  if (i >= 0) list[i] = cond;
  else list.push(cond);
  return list;
}

/** Removes the condition of `type`; returns a new list. */
export function removeCondition(conditions: readonly Condition[] | undefined, type: string): Condition[] {
  return (conditions ?? []).filter((c) => c.type !== type);
}

/**
 * Would setting `next` change anything a reader sees (status, reason, message or
 * observedGeneration)? Used to skip writes when nothing changed.
 */
export function conditionChanged(conditions: readonly Condition[] | undefined, next: ConditionInput): boolean {
  const prev = getCondition(conditions, next.type);
  return (
    !prev ||
    prev.status !== next.status ||
    prev.reason !== next.reason ||
    prev.message !== next.message ||
    (prev.observedGeneration ?? undefined) !== (next.observedGeneration ?? undefined)
  );
}

/**
 * The owned conditions an object should carry, in the manner of Cluster API's condition
 * helpers: `desired` set by type, every other owned type removed (a decision states only
 * what it knows), other writers' types untouched.
 * @param ownedTypes the types this project owns (default: the consumer types of SPEC §16).
 * @returns the full new list, the owned conditions to apply, the inputs that changed (one
 *   Event each), and `changed` (false: no status write is needed).
 */
export function planConditions(
  current: readonly Condition[] | undefined,
  desired: readonly ConditionInput[],
  now: Date,
  ownedTypes: readonly string[] = CONSUMER_CONDITION_TYPES,
): { conditions: Condition[]; owned: Condition[]; changedInputs: ConditionInput[]; changed: boolean } {
  const desiredTypes = new Set(desired.map((d) => d.type));
  const removed = (current ?? []).filter((c) => ownedTypes.includes(c.type) && !desiredTypes.has(c.type));
  const changedInputs = desired.filter((d) => conditionChanged(current, d));
  let next = (current ?? []).filter((c) => !removed.includes(c));
  for (const d of desired) next = setCondition(next, d, now);
  const owned = next.filter((c) => desiredTypes.has(c.type));
  return { conditions: next, owned, changedInputs, changed: changedInputs.length > 0 || removed.length > 0 };
}

/**
 * The owned conditions `conditions` still holds although `desired` leaves them out, with
 * their index, last first (so removing them one after another keeps the others' indexes).
 * Server-side apply leaves such a condition in place when another field manager also claims
 * it: after a `managedFields` reset, the API server gives every field to `before-first-apply`
 * at the next apply (structured-merge-diff's skip-non-applied manager), and a list item
 * co-owned that way outlives any apply that omits it.
 */
export function strayConditions(
  conditions: readonly Condition[] | undefined,
  desired: readonly ConditionInput[],
  ownedTypes: readonly string[] = CONSUMER_CONDITION_TYPES,
): { index: number; type: string }[] {
  const wanted = new Set(desired.map((d) => d.type));
  return (conditions ?? [])
    .map((c, index) => ({ index, type: c.type }))
    .filter((c) => ownedTypes.includes(c.type) && !wanted.has(c.type))
    .reverse();
}
