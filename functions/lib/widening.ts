/**
 * SPEC §10: does an update of `spec.allowedNamespaces` widen it, i.e. might the new value
 * allow a namespace the old one did not? Pure and conservative: when in doubt the answer is
 * "widening", which costs the updater a SubjectAccessReview, never a leak.
 */
import { validateAllowedNamespaces } from './allowed-namespaces.ts';

/** The verdict and a short reason for messages and logs. */
export interface WideningVerdict {
  widening: boolean;
  /** Human-readable why, e.g. `list gains team-c` or `selector loses a requirement`. */
  reason: string;
}

/** A selector as a set of requirements; `matchLabels` k=v is the same as `k In (v)`. */
type Requirements = Set<string>;

interface Normalized {
  /** Names in `list` (absent list = none). */
  list: Set<string>;
  /** Requirements of `selector`, or undefined when there is no selector. */
  selector: Requirements | undefined;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// One canonical string per requirement: key, operator and sorted unique values, so that
// reordering values or requirements, or writing k=v either way, is recognised as unchanged.
function requirementKey(key: string, operator: string, values: readonly string[]): string {
  return JSON.stringify([key, operator, [...new Set(values)].sort()]);
}

/** Normalizes a valid value; undefined for absent/null; throws on nothing (validated first). */
function normalize(allowed: unknown): Normalized {
  if (!isPlainObject(allowed)) return { list: new Set(), selector: undefined };
  const list = new Set(Array.isArray(allowed.list) ? (allowed.list as string[]) : []);
  const sel = allowed.selector;
  if (!isPlainObject(sel)) return { list, selector: undefined };
  const reqs: Requirements = new Set();
  for (const [k, v] of Object.entries(isPlainObject(sel.matchLabels) ? sel.matchLabels : {})) {
    reqs.add(requirementKey(k, 'In', [String(v)]));
  }
  for (const r of Array.isArray(sel.matchExpressions) ? sel.matchExpressions : []) {
    const req = r as { key: string; operator: string; values?: string[] | null };
    reqs.add(requirementKey(req.key, req.operator, req.values ?? []));
  }
  return { list, selector: reqs };
}

/**
 * SPEC §10: is the change from `oldAllowed` to `newAllowed` a widening?
 *
 * Rules, in order:
 * - the new value is invalid (e.g. `{}`) → widening (it never reaches storage anyway);
 * - the old value is invalid → widening (it allowed nothing, so anything may be more);
 * - the new list names a namespace the old list did not → widening, even when the old
 *   selector happened to match it (conservative);
 * - no selector before, a selector now (unset→set, list→selector) → widening;
 * - both have a selector: narrowing only when every old requirement is still present
 *   (same key, operator and value set); anything else — a lost requirement, a changed
 *   value, a changed operator — is widening;
 * - otherwise (names only removed, selector unchanged, tightened or removed) → narrowing.
 * Absent and null are the same "allows none"; `list: []` from absent allows nothing new.
 * @param oldAllowed `oldObject.spec.allowedNamespaces` (any shape).
 * @param newAllowed `object.spec.allowedNamespaces` (any shape).
 * @returns `{ widening, reason }`.
 */
export function isWidening(oldAllowed: unknown, newAllowed: unknown): WideningVerdict {
  if (validateAllowedNamespaces(newAllowed).length > 0)
    return { widening: true, reason: 'the new allowedNamespaces is invalid' };
  if (validateAllowedNamespaces(oldAllowed).length > 0)
    return { widening: true, reason: 'the old allowedNamespaces was invalid' };
  const before = normalize(oldAllowed);
  const after = normalize(newAllowed);
  const added = [...after.list].filter((n) => !before.list.has(n)).sort();
  if (added.length > 0) return { widening: true, reason: `list gains ${added.join(', ')}` };
  if (after.selector && !before.selector) return { widening: true, reason: 'a selector was added' };
  if (after.selector && before.selector) {
    const lost = [...before.selector].filter((r) => !after.selector!.has(r));
    if (lost.length > 0) return { widening: true, reason: 'the selector lost or changed a requirement' };
  }
  return { widening: false, reason: 'allowedNamespaces only narrowed or stayed the same' };
}

/**
 * SPEC §10 (warnings): might the change from `oldAllowed` to `newAllowed` take access away
 * from a namespace? Pure and conservative: `false` only when every namespace the old value
 * allowed is certainly still allowed (names kept, and the selector unchanged, loosened, or
 * now matching everything), so the webhook can skip its impact lookup for plain widenings.
 * @param oldAllowed `oldObject.spec.allowedNamespaces`; @param newAllowed `object.spec.allowedNamespaces`.
 * @returns true when a namespace may lose access (the lookup decides which), or either value is invalid.
 */
export function mayRevoke(oldAllowed: unknown, newAllowed: unknown): boolean {
  if (validateAllowedNamespaces(newAllowed).length > 0 || validateAllowedNamespaces(oldAllowed).length > 0) return true;
  const before = normalize(oldAllowed);
  const after = normalize(newAllowed);
  if (after.selector?.size === 0) return false; // selector {}: every namespace
  if ([...before.list].some((n) => !after.list.has(n))) return true;
  if (!before.selector) return false;
  // Every requirement of the new selector was already required: it matches at least as much.
  return !after.selector || [...after.selector].some((r) => !before.selector!.has(r));
}
