/**
 * SPEC §2: which namespaces an identity allows, and whether an `allowedNamespaces` value is
 * valid. Pure functions; every component decides "is namespace N allowed" through
 * {@link isNamespaceAllowed} so they can never disagree.
 */
import type { AllowedNamespaces, LabelSelector, LabelSelectorRequirement } from './api.ts';

/** The label selector operators Kubernetes accepts in `matchExpressions`. */
export const SELECTOR_OPERATORS = ['In', 'NotIn', 'Exists', 'DoesNotExist'] as const;

/** A namespace as the decision needs it: its name and labels. */
export interface NamespaceInfo {
  name: string;
  labels?: Record<string, string> | undefined;
}

// Kubernetes validation (apimachinery/pkg/util/validation): DNS-1123 label/subdomain and
// qualified names for label keys and values.
const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const QUALIFIED_NAME_PART = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;

/**
 * Is `name` a valid DNS-1123 label (what a namespace name must be)?
 * @returns true when 1–63 characters of `[a-z0-9-]`, starting and ending alphanumeric.
 */
export function isDns1123Label(name: unknown): name is string {
  return typeof name === 'string' && name.length <= 63 && DNS1123_LABEL.test(name);
}

/**
 * Is `name` a valid DNS-1123 subdomain (what most object names, Secrets included, must be)?
 * @returns true when 1–253 characters of dot-separated DNS-1123 labels.
 */
export function isDns1123Subdomain(name: unknown): name is string {
  return typeof name === 'string' && name.length <= 253 && DNS1123_SUBDOMAIN.test(name);
}

/**
 * Validates a label key (`[prefix/]name`, Kubernetes qualified name).
 * @returns an error message, or undefined when valid.
 */
export function labelKeyError(key: unknown): string | undefined {
  if (typeof key !== 'string' || key === '') return 'must be a non-empty string';
  const parts = key.split('/');
  if (parts.length > 2) return 'must be a name with an optional DNS prefix and one "/"';
  const name = parts.length === 2 ? parts[1]! : parts[0]!;
  if (parts.length === 2 && !isDns1123Subdomain(parts[0])) {
    return 'prefix must be a DNS-1123 subdomain (lower case, at most 253 characters)';
  }
  if (name.length > 63 || !QUALIFIED_NAME_PART.test(name)) {
    return 'name part must be at most 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric';
  }
  return undefined;
}

/**
 * Validates a label value (empty, or a qualified name part of at most 63 characters).
 * @returns an error message, or undefined when valid.
 */
export function labelValueError(value: unknown): string | undefined {
  if (typeof value !== 'string') return 'must be a string';
  if (value === '') return undefined;
  if (value.length > 63 || !QUALIFIED_NAME_PART.test(value)) {
    return 'must be at most 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric';
  }
  return undefined;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * Validates a `metav1.LabelSelector` the way the API server's `ValidateLabelSelector` does.
 * @param selector the value found at `path`, of any shape.
 * @param path field path used in messages, e.g. `spec.allowedNamespaces.selector`.
 * @returns one message per problem, each naming the bad field and value; empty when valid.
 */
export function validateLabelSelector(selector: unknown, path: string): string[] {
  const errors: string[] = [];
  if (!isPlainObject(selector)) return [`${path}: must be an object`];
  for (const field of Object.keys(selector)) {
    if (field !== 'matchLabels' && field !== 'matchExpressions') {
      errors.push(`${path}.${field}: unknown field (only matchLabels and matchExpressions)`);
    }
  }
  const { matchLabels, matchExpressions } = selector;
  if (matchLabels !== undefined && matchLabels !== null) {
    if (!isPlainObject(matchLabels)) {
      errors.push(`${path}.matchLabels: must be a map of label key to value`);
    } else {
      for (const [k, v] of Object.entries(matchLabels)) {
        const keyErr = labelKeyError(k);
        if (keyErr) errors.push(`${path}.matchLabels: key ${JSON.stringify(k)} ${keyErr}`);
        const valErr = labelValueError(v);
        if (valErr) errors.push(`${path}.matchLabels[${JSON.stringify(k)}]: value ${JSON.stringify(v)} ${valErr}`);
      }
    }
  }
  if (matchExpressions !== undefined && matchExpressions !== null) {
    if (!Array.isArray(matchExpressions)) {
      errors.push(`${path}.matchExpressions: must be a list`);
    } else {
      matchExpressions.forEach((req: unknown, i: number) => {
        errors.push(...requirementErrors(req, `${path}.matchExpressions[${i}]`));
      });
    }
  }
  return errors;
}

function requirementErrors(req: unknown, path: string): string[] {
  if (!isPlainObject(req)) return [`${path}: must be an object with key, operator and values`];
  const errors: string[] = [];
  const keyErr = labelKeyError(req.key);
  if (keyErr) errors.push(`${path}.key: ${JSON.stringify(req.key ?? null)} ${keyErr}`);
  const op = req.operator;
  const values = req.values;
  if (values !== undefined && values !== null && !Array.isArray(values)) {
    errors.push(`${path}.values: must be a list of strings`);
    return errors;
  }
  const vals = (values ?? []) as unknown[];
  switch (op) {
    case 'In':
    case 'NotIn':
      if (vals.length === 0) errors.push(`${path}.values: must be non-empty when operator is ${op}`);
      break;
    case 'Exists':
    case 'DoesNotExist':
      if (vals.length > 0) errors.push(`${path}.values: must be empty when operator is ${op}`);
      break;
    default:
      errors.push(
        `${path}.operator: ${JSON.stringify(op ?? null)} is not a valid operator (use ${SELECTOR_OPERATORS.join(', ')})`,
      );
  }
  vals.forEach((v, j) => {
    const valErr = labelValueError(v);
    if (valErr) errors.push(`${path}.values[${j}]: ${JSON.stringify(v)} ${valErr}`);
  });
  return errors;
}

/**
 * Validates `spec.allowedNamespaces` against the forms of SPEC §2.
 * @param allowed the field's value (any shape; absent and null are valid and allow nothing).
 * @param path field path used in messages; defaults to `spec.allowedNamespaces`.
 * @returns one actionable message per problem (`{}` is rejected as ambiguous); empty when valid.
 */
export function validateAllowedNamespaces(allowed: unknown, path = 'spec.allowedNamespaces'): string[] {
  if (allowed === undefined || allowed === null) return [];
  if (!isPlainObject(allowed)) return [`${path}: must be an object with list and/or selector`];
  const errors: string[] = [];
  for (const field of Object.keys(allowed)) {
    if (field !== 'list' && field !== 'selector')
      errors.push(`${path}.${field}: unknown field (only list and selector)`);
  }
  const hasList = allowed.list !== undefined && allowed.list !== null;
  const hasSelector = allowed.selector !== undefined && allowed.selector !== null;
  if (!hasList && !hasSelector) {
    errors.push(
      `${path}: {} is ambiguous; set list (named namespaces), selector ({} for every namespace), or remove the field to allow none`,
    );
  }
  if (hasList) {
    if (!Array.isArray(allowed.list)) {
      errors.push(`${path}.list: must be a list of namespace names`);
    } else {
      allowed.list.forEach((n: unknown, i: number) => {
        if (!isDns1123Label(n)) errors.push(`${path}.list[${i}]: ${JSON.stringify(n)} is not a valid namespace name`);
      });
    }
  }
  if (hasSelector) errors.push(...validateLabelSelector(allowed.selector, `${path}.selector`));
  return errors;
}

/**
 * Does one `matchExpressions` requirement match these labels (standard semantics: `NotIn`
 * and `DoesNotExist` match when the key is absent)? Unknown operators never match.
 */
function requirementMatches(req: LabelSelectorRequirement, labels: Record<string, string>): boolean {
  const has = Object.hasOwn(labels, req.key);
  const values = req.values ?? [];
  switch (req.operator) {
    case 'In':
      return has && values.length > 0 && values.includes(labels[req.key]!);
    case 'NotIn':
      return values.length > 0 && (!has || !values.includes(labels[req.key]!));
    case 'Exists':
      return has && values.length === 0;
    case 'DoesNotExist':
      return !has && values.length === 0;
    default:
      return false;
  }
}

/**
 * Does a label selector match a label set? An empty selector matches everything; an invalid
 * selector matches nothing (fail closed).
 * @param selector a `metav1.LabelSelector`.
 * @param labels the object's labels (absent = none).
 */
export function labelSelectorMatches(selector: LabelSelector, labels: Record<string, string> = {}): boolean {
  if (validateLabelSelector(selector, 'selector').length > 0) return false;
  for (const [k, v] of Object.entries(selector.matchLabels ?? {})) {
    if (!Object.hasOwn(labels, k) || labels[k] !== v) return false;
  }
  return (selector.matchExpressions ?? []).every((req) => requirementMatches(req, labels));
}

/**
 * SPEC §2: is `namespace` allowed by an identity's `allowedNamespaces`?
 * @param allowed `spec.allowedNamespaces` (absent/null allows nothing; `{}` and invalid
 *   values allow nothing, since admission should have rejected them).
 * @param namespace the namespace's name and labels; the empty name (a cluster-scoped
 *   consumer) is never allowed.
 * @returns true when named in `list` or matched by `selector`.
 */
export function isNamespaceAllowed(allowed: AllowedNamespaces | null | undefined, namespace: NamespaceInfo): boolean {
  if (!namespace.name) return false;
  if (allowed === undefined || allowed === null) return false;
  if (validateAllowedNamespaces(allowed).length > 0) return false;
  if (allowed.list?.includes(namespace.name)) return true;
  if (allowed.selector) return labelSelectorMatches(allowed.selector, namespace.labels ?? {});
  return false;
}
