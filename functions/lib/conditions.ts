/**
 * Condition helpers in the manner of Cluster API's `util/conditions` (SPEC §16,
 * `metav1.Condition`): set one condition by type, keep `lastTransitionTime` unless the
 * status flips, and compare before writing. Pure.
 */
import { FIELD_MANAGER, type Condition, type ManagedFieldsEntry } from './api.ts';

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

/** How a condition plan treats the object's existing conditions. */
export interface PlanOptions {
  /** The types this project owns (default: the consumer types of SPEC §16). */
  ownedTypes?: readonly string[];
  /**
   * Owned types another field manager also claims ({@link typesClaimedByOthers}): never
   * removed, since server-side apply leaves them and removing them by force would take another
   * controller's condition.
   */
  keep?: ReadonlySet<string>;
}

/**
 * The owned conditions an object should carry, in the manner of Cluster API's condition
 * helpers: `desired` set by type, every other owned type removed (a decision states only
 * what it knows) unless another manager claims it, other writers' types untouched.
 * @returns the full new list, the owned conditions to apply, the inputs that changed (one
 *   Event each), and `changed` (false: no status write is needed).
 */
export function planConditions(
  current: readonly Condition[] | undefined,
  desired: readonly ConditionInput[],
  now: Date,
  opts: PlanOptions = {},
): { conditions: Condition[]; owned: Condition[]; changedInputs: ConditionInput[]; changed: boolean } {
  const removable = removableBy(desired, opts);
  const removed = (current ?? []).filter((c) => removable(c.type));
  const changedInputs = desired.filter((d) => conditionChanged(current, d));
  let next = (current ?? []).filter((c) => !removed.includes(c));
  for (const d of desired) next = setCondition(next, d, now);
  const desiredTypes = new Set(desired.map((d) => d.type));
  const owned = next.filter((c) => desiredTypes.has(c.type));
  return { conditions: next, owned, changedInputs, changed: changedInputs.length > 0 || removed.length > 0 };
}

/** Whether a condition of `type` should go: owned, not desired, claimed by no other manager. */
const removableBy =
  (desired: readonly ConditionInput[], { ownedTypes = CONSUMER_CONDITION_TYPES, keep }: PlanOptions) =>
  (type: unknown): boolean =>
    typeof type === 'string' && ownedTypes.includes(type) && !desired.some((d) => d.type === type) && !keep?.has(type);

/** The field manager the API server gives every field to at the first apply after a `managedFields` reset. */
export const RESET_MANAGER = 'before-first-apply';

/**
 * Condition types whose `status.conditions` item a field manager other than ours (and other
 * than {@link RESET_MANAGER}, which only stands for a reset) claims, read from an object's
 * `managedFields` (`f:status` → `f:conditions` → `k:{"type":…}`). Malformed entries claim
 * nothing.
 */
export function typesClaimedByOthers(
  managedFields: readonly ManagedFieldsEntry[] | undefined,
  ours: string = FIELD_MANAGER,
): Set<string> {
  const types = new Set<string>();
  for (const entry of Array.isArray(managedFields) ? managedFields : []) {
    if (!entry || entry.manager === ours || entry.manager === RESET_MANAGER) continue;
    for (const type of claimedTypes(entry.fieldsV1)) types.add(type);
  }
  return types;
}

/** The condition types one entry's field set claims. */
function claimedTypes(fieldsV1: unknown): string[] {
  const status = (fieldsV1 as Record<string, unknown> | null | undefined)?.['f:status'];
  const conditions = (status as Record<string, unknown> | null | undefined)?.['f:conditions'];
  if (!conditions || typeof conditions !== 'object') return [];
  return Object.keys(conditions).flatMap((k) => {
    if (!k.startsWith('k:')) return [];
    try {
      const key = JSON.parse(k.slice(2)) as { type?: unknown } | null;
      return typeof key?.type === 'string' ? [key.type] : [];
    } catch {
      return [];
    }
  });
}

/**
 * The owned conditions `conditions` still holds although `desired` leaves them out (and no
 * other manager claims them: `opts.keep`), with their index, last first (so removing them one
 * after another keeps the others' indexes). Server-side apply leaves such a condition in place
 * when another field manager also claims it: after a `managedFields` reset the API server
 * gives every field to {@link RESET_MANAGER} at the next apply (structured-merge-diff's
 * skip-non-applied manager), and a list item co-owned that way outlives any apply that omits
 * it. Items that are not objects with a string `type` are never counted.
 */
export function strayConditions(
  conditions: unknown,
  desired: readonly ConditionInput[],
  opts: PlanOptions = {},
): { index: number; type: string }[] {
  if (!Array.isArray(conditions)) return [];
  const removable = removableBy(desired, opts);
  return conditions
    .map((c: unknown, index) => ({ index, type: (c as { type?: unknown } | null)?.type }))
    .filter((c): c is { index: number; type: string } => removable(c.type))
    .reverse();
}
