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
  if (!isPlainObject(selector)) return [`${path}: must be an object`];
  return [
    ...unknownFields(selector, ['matchLabels', 'matchExpressions'], path),
    ...matchLabelsErrors(selector.matchLabels, `${path}.matchLabels`),
    ...matchExpressionsErrors(selector.matchExpressions, `${path}.matchExpressions`),
  ];
}

const isSet = (v: unknown): boolean => v !== undefined && v !== null;

/**
 * A bad value as JSON for a message, at most 80 characters: a denial quotes what was wrong,
 * never a megabyte of it. Never throws (a value that cannot be serialised is described by type).
 * @param v any value from a request.
 */
export function quote(v: unknown): string {
  let text: string;
  try {
    text = JSON.stringify(v) ?? String(v);
  } catch {
    text = `<${Array.isArray(v) ? 'array' : typeof v}>`;
  }
  return text.length <= 80 ? text : `${text.slice(0, 77)}...`;
}

/** One message per field of `obj` not in `known`. */
function unknownFields(obj: Record<string, unknown>, known: readonly string[], path: string): string[] {
  return Object.keys(obj)
    .filter((field) => !known.includes(field))
    .map((field) => `${path}.${field}: unknown field (only ${known.join(' and ')})`);
}

function matchLabelsErrors(matchLabels: unknown, path: string): string[] {
  if (!isSet(matchLabels)) return [];
  if (!isPlainObject(matchLabels)) return [`${path}: must be a map of label key to value`];
  const errors: string[] = [];
  for (const [k, v] of Object.entries(matchLabels)) {
    const keyErr = labelKeyError(k);
    if (keyErr) errors.push(`${path}: key ${quote(k)} ${keyErr}`);
    const valErr = labelValueError(v);
    if (valErr) errors.push(`${path}[${quote(k)}]: value ${quote(v)} ${valErr}`);
  }
  return errors;
}

function matchExpressionsErrors(matchExpressions: unknown, path: string): string[] {
  if (!isSet(matchExpressions)) return [];
  if (!Array.isArray(matchExpressions)) return [`${path}: must be a list`];
  return matchExpressions.flatMap((req: unknown, i: number) => requirementErrors(req, `${path}[${i}]`));
}

function requirementErrors(req: unknown, path: string): string[] {
  if (!isPlainObject(req)) return [`${path}: must be an object with key, operator and values`];
  const errors: string[] = [];
  const keyErr = labelKeyError(req.key);
  if (keyErr) errors.push(`${path}.key: ${quote(req.key ?? null)} ${keyErr}`);
  if (isSet(req.values) && !Array.isArray(req.values)) return [...errors, `${path}.values: must be a list of strings`];
  const vals = (req.values ?? []) as unknown[];
  errors.push(...operatorErrors(req.operator, vals.length, path));
  vals.forEach((v, j) => {
    const valErr = labelValueError(v);
    if (valErr) errors.push(`${path}.values[${j}]: ${quote(v)} ${valErr}`);
  });
  return errors;
}

/** Does the operator exist, and does the number of values suit it? */
function operatorErrors(op: unknown, valueCount: number, path: string): string[] {
  switch (op) {
    case 'In':
    case 'NotIn':
      return valueCount === 0 ? [`${path}.values: must be non-empty when operator is ${op}`] : [];
    case 'Exists':
    case 'DoesNotExist':
      return valueCount > 0 ? [`${path}.values: must be empty when operator is ${op}`] : [];
    default:
      return [`${path}.operator: ${quote(op ?? null)} is not a valid operator (use ${SELECTOR_OPERATORS.join(', ')})`];
  }
}

/**
 * Validates `spec.allowedNamespaces` against the forms of SPEC §2.
 * @param allowed the field's value (any shape; absent and null are valid and allow nothing).
 * @param path field path used in messages; defaults to `spec.allowedNamespaces`.
 * @returns one actionable message per problem (`{}` is rejected as ambiguous); empty when valid.
 */
export function validateAllowedNamespaces(allowed: unknown, path = 'spec.allowedNamespaces'): string[] {
  if (!isSet(allowed)) return [];
  if (!isPlainObject(allowed)) return [`${path}: must be an object with list and/or selector`];
  const errors = unknownFields(allowed, ['list', 'selector'], path);
  if (!isSet(allowed.list) && !isSet(allowed.selector)) {
    errors.push(
      `${path}: {} is ambiguous; set list (named namespaces), selector ({} for every namespace), or remove the field to allow none`,
    );
  }
  errors.push(...listErrors(allowed.list, `${path}.list`));
  if (isSet(allowed.selector)) errors.push(...validateLabelSelector(allowed.selector, `${path}.selector`));
  return errors;
}

function listErrors(list: unknown, path: string): string[] {
  if (!isSet(list)) return [];
  if (!Array.isArray(list)) return [`${path}: must be a list of namespace names`];
  return list.flatMap((n: unknown, i: number) =>
    isDns1123Label(n) ? [] : [`${path}[${i}]: ${quote(n)} is not a valid namespace name`],
  );
}

/**
 * Does one `matchExpressions` requirement match these labels (standard semantics: `NotIn`
 * and `DoesNotExist` match when the key is absent)? Unknown operators never match.
 */
function requirementMatches(req: LabelSelectorRequirement, labels: Record<string, string>): boolean {
  const has = Object.hasOwn(labels, req.key);
  const values = req.values ?? [];
  return OPERATOR_MATCHES.get(req.operator)?.(has, values, has && values.includes(labels[req.key]!)) ?? false;
}

/** Per operator (a Map: no inherited keys): does it match, given whether the key is present, the values, and whether the label's value is listed? */
const OPERATOR_MATCHES = new Map<string, (has: boolean, values: readonly string[], listed: boolean) => boolean>([
  ['In', (_has, values, listed) => values.length > 0 && listed],
  ['NotIn', (_has, values, listed) => values.length > 0 && !listed],
  ['Exists', (has, values) => has && values.length === 0],
  ['DoesNotExist', (has, values) => !has && values.length === 0],
]);

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
