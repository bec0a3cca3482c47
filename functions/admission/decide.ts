/**
 * The admission decisions of SPEC §10, pure: what a request on a TerraformClusterIdentity
 * needs checked (nothing, a SubjectAccessReview, or an in-use lookup), and how the answer
 * of that check becomes allowed/denied with a message that names the user, the verb, the
 * Secret and the rule. Never reads or mentions Secret data.
 */
import { isDeepStrictEqual } from 'node:util';
import type { AllowedNamespaces } from '../lib/api.ts';
import { isNamespaceAllowed, validateAllowedNamespaces } from '../lib/allowed-namespaces.ts';
import { validateIdentitySpec } from '../lib/identity-spec.ts';
import { isReservedSourceName, reservedSourceMessage } from '../lib/mirror.ts';
import type { ReviewedUser } from '../lib/token-review.ts';
import { isWidening, mayRevoke } from '../lib/widening.ts';

/** `request.userInfo` of an AdmissionReview: `authentication.k8s.io/v1` UserInfo, as a TokenReview reports it too. */
export type UserInfo = ReviewedUser;

/** The parts of an `admission.k8s.io/v1` AdmissionRequest the decisions read. */
export interface IdentityRequest {
  uid: string;
  operation: string;
  /** Set for subresource requests, e.g. `status`. */
  subResource?: string;
  /** Name of the identity (for DELETE the object is absent, so this is the name to use). */
  name?: string;
  userInfo: UserInfo;
  object?: unknown;
  oldObject?: unknown;
  dryRun?: boolean;
}

/** Namespace and name of a Secret. */
export interface SecretKey {
  namespace: string;
  name: string;
}

/**
 * An `allowedNamespaces` change whose impact the shell looks up before answering (SPEC §10
 * warnings): the consumers of `identity` per namespace, and the labels of the namespaces
 * {@link namespacesNeedingLabels} names; then {@link revocationWarnings}.
 */
export interface ImpactCheck {
  identity: string;
  oldAllowed: unknown;
  newAllowed: unknown;
}

/** What an UPDATE that is (or will be) allowed tells the user besides yes. */
export interface UpdateNotes {
  /** Warnings known without a lookup (a changed `secretRef`). */
  warnings: string[];
  /** Set when `allowedNamespaces` changed and the old value allowed something. */
  impact?: ImpactCheck;
}

/** What the shell must do next for a request. */
export type Plan =
  | { action: 'allow'; why: string; notes?: UpdateNotes }
  | { action: 'deny'; decision: Denied }
  /** SubjectAccessReview: may `userInfo` get `secret`? `rule` says why the check is needed. */
  | { action: 'check-secret-access'; secret: SecretKey; rule: string; notes?: UpdateNotes }
  /** Look up live consumers of `identity`; `statusNamespaces` come from `oldObject.status`. */
  | { action: 'check-in-use'; identity: string; statusNamespaces: string[] };

/** An allowed request. */
export interface Allowed {
  allowed: true;
  /** Short why, for logs. */
  why: string;
  /** AdmissionReview `warnings` (kubectl prints each as a `Warning:` line); each under 256 characters. */
  warnings?: string[];
}

/** A denied request: HTTP-like `code`, a `reason` word and the message the user sees. */
export interface Denied {
  allowed: false;
  code: number;
  reason: string;
  message: string;
}

/** The outcome of a review. */
export type Decision = Allowed | Denied;

const deny = (code: number, reason: string, message: string): Denied => ({ allowed: false, code, reason, message });

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const isSet = (v: unknown): boolean => v !== undefined && v !== null;

const specOf = (obj: unknown): Record<string, unknown> | undefined =>
  isPlainObject(obj) && isPlainObject(obj.spec) ? obj.spec : undefined;

function secretRefOf(obj: unknown): SecretKey | undefined {
  const ref = specOf(obj)?.secretRef;
  if (!isPlainObject(ref) || typeof ref.name !== 'string' || typeof ref.namespace !== 'string') return undefined;
  return { namespace: ref.namespace, name: ref.name };
}

function nameOf(req: IdentityRequest): string {
  if (req.name) return req.name;
  for (const o of [req.object, req.oldObject]) {
    if (isPlainObject(o) && isPlainObject(o.metadata) && typeof o.metadata.name === 'string') return o.metadata.name;
  }
  return '';
}

/**
 * Decides what a request needs (SPEC §10).
 * - `status` subresource: allowed (never reviewed; only reachable through a misconfigured webhook).
 * - CREATE: spec invalid → deny 422; else a SubjectAccessReview on `spec.secretRef`.
 * - UPDATE: `spec` unchanged (deep equality) → allowed without validating it (ratcheting: an
 *   identity stored under older rules can still get labels or lose its finalizers); new spec
 *   invalid → deny 422; `secretRef` changed or `allowedNamespaces` widened ({@link isWidening})
 *   → SubjectAccessReview on the new `secretRef`; otherwise allowed (narrowing updates need no
 *   SAR). Either way the plan carries {@link UpdateNotes}: the secretRef warning, and an
 *   {@link ImpactCheck} when `allowedNamespaces` changed from a value that allowed something.
 * - DELETE: in-use lookup, seeded with `oldObject.status.namespaces`.
 * - anything else (CONNECT, unknown) → deny 400: this webhook only reviews the three above.
 * @param req a parsed request (see admission-review.ts) whose userInfo is already known to be present.
 */
export function planReview(req: IdentityRequest): Plan {
  if (req.subResource) return { action: 'allow', why: `subresource ${req.subResource} is not reviewed` };
  switch (req.operation) {
    case 'CREATE':
      return planCreate(req);
    case 'UPDATE':
      return planUpdate(req);
    case 'DELETE':
      return planDelete(req);
    default:
      return {
        action: 'deny',
        decision: deny(
          400,
          'BadRequest',
          `operation ${JSON.stringify(req.operation)} is not reviewed by this webhook (only CREATE, UPDATE, DELETE)`,
        ),
      };
  }
}

/** A 422 denial when the new object's spec is invalid, else undefined. */
function invalidSpec(req: IdentityRequest): Plan | undefined {
  const errors = validateIdentitySpec(isPlainObject(req.object) ? req.object.spec : undefined);
  if (errors.length === 0) return undefined;
  const what = `TerraformClusterIdentity ${JSON.stringify(nameOf(req))}`;
  return { action: 'deny', decision: deny(422, 'Invalid', `${what} is invalid: ${errors.join('; ')}`) };
}

/**
 * SPEC §3, §10: a `secretRef.name` with the mirror prefix names a mirror, and a mirror is never
 * a source; denied before any SubjectAccessReview (being allowed to read a mirror must not let
 * anyone republish it). Checked on CREATE and on an UPDATE that changes `secretRef` only, so an
 * identity stored before the rule can still be narrowed or lose its finalizers.
 */
function reservedSource(req: IdentityRequest, ref: SecretKey): Plan | undefined {
  if (!isReservedSourceName(ref.name)) return undefined;
  const what = `TerraformClusterIdentity ${JSON.stringify(nameOf(req))}`;
  return { action: 'deny', decision: deny(422, 'Invalid', `${what} is invalid: ${reservedSourceMessage(ref.name)}`) };
}

function planCreate(req: IdentityRequest): Plan {
  const invalid = invalidSpec(req);
  if (invalid) return invalid;
  const secret = secretRefOf(req.object)!;
  return (
    reservedSource(req, secret) ?? {
      action: 'check-secret-access',
      secret,
      rule: 'creating an identity requires permission to get the Secret it names',
    }
  );
}

/** Does an UPDATE leave `spec` as stored (deep equality; key order does not matter)? */
function specUnchanged(req: IdentityRequest): boolean {
  const { object, oldObject } = req;
  return isPlainObject(object) && isPlainObject(oldObject) && isDeepStrictEqual(object.spec, oldObject.spec);
}

function planUpdate(req: IdentityRequest): Plan {
  // Ratcheting: an update that leaves spec alone (labels, finalizers, a deletion's last
  // step) is not judged by rules the stored spec may predate.
  if (specUnchanged(req)) return { action: 'allow', why: 'spec unchanged (not validated: ratcheting)' };
  const invalid = invalidSpec(req);
  if (invalid) return invalid;
  const newRef = secretRefOf(req.object)!;
  const reserved = secretRefChanged(req, newRef) ? reservedSource(req, newRef) : undefined;
  if (reserved) return reserved;
  const notes = updateNotes(req, newRef);
  const rule = secretAccessRule(req, newRef);
  if (rule) return { action: 'check-secret-access', secret: newRef, rule, notes };
  return { action: 'allow', why: 'secretRef unchanged and allowedNamespaces not widened', notes };
}

/** Why an UPDATE needs a SubjectAccessReview (secretRef changed, or a widening), or undefined. */
function secretAccessRule(req: IdentityRequest, newRef: SecretKey): string | undefined {
  if (secretRefChanged(req, newRef)) return 'changing spec.secretRef requires permission to get the new Secret';
  const verdict = isWidening(specOf(req.oldObject)?.allowedNamespaces, specOf(req.object)?.allowedNamespaces);
  if (verdict.widening)
    return `widening spec.allowedNamespaces (${verdict.reason}) requires permission to get the Secret`;
  return undefined;
}

function secretRefChanged(req: IdentityRequest, newRef: SecretKey): boolean {
  const oldRef = secretRefOf(req.oldObject);
  return !oldRef || oldRef.name !== newRef.name || oldRef.namespace !== newRef.namespace;
}

/** The warnings and the impact lookup an allowed, spec-changing UPDATE gets (SPEC §10). */
function updateNotes(req: IdentityRequest, newRef: SecretKey): UpdateNotes {
  const identity = nameOf(req);
  const warnings = secretRefChanged(req, newRef) ? [secretRefWarning(identity, newRef)] : [];
  const oldAllowed = specOf(req.oldObject)?.allowedNamespaces;
  const newAllowed = specOf(req.object)?.allowedNamespaces;
  // An old value that allowed nothing (absent, null, invalid) cannot revoke anything.
  const oldAllowedSomething = isSet(oldAllowed) && validateAllowedNamespaces(oldAllowed).length === 0;
  if (!oldAllowedSomething || !mayRevoke(oldAllowed, newAllowed)) return { warnings };
  return { warnings, impact: { identity, oldAllowed, newAllowed } };
}

function planDelete(req: IdentityRequest): Plan {
  const name = nameOf(req);
  if (!name)
    return {
      action: 'deny',
      decision: deny(
        400,
        'BadRequest',
        'DELETE review names no identity (request.name and oldObject.metadata.name are empty)',
      ),
    };
  return { action: 'check-in-use', identity: name, statusNamespaces: statusNamespacesOf(req.oldObject) };
}

/** `oldObject.status.namespaces` as strings (anything else ignored). */
export function statusNamespacesOf(oldObject: unknown): string[] {
  const status = isPlainObject(oldObject) && isPlainObject(oldObject.status) ? oldObject.status : undefined;
  return Array.isArray(status?.namespaces)
    ? status.namespaces.filter((n): n is string => typeof n === 'string' && n !== '')
    : [];
}

/** The body of an `authorization.k8s.io/v1` SubjectAccessReview. */
export interface SubjectAccessReviewBody {
  apiVersion: 'authorization.k8s.io/v1';
  kind: 'SubjectAccessReview';
  spec: {
    user: string;
    groups?: string[];
    uid?: string;
    extra?: Record<string, string[]>;
    resourceAttributes: { group: ''; version: 'v1'; resource: 'secrets'; verb: 'get'; namespace: string; name: string };
  };
}

/**
 * SPEC §10: the SubjectAccessReview to ask "may this user get this Secret?", with `user`,
 * `groups`, `uid` and `extra` copied from the request's userInfo (so every authorizer sees
 * the same identity the API server authenticated; empty ones are left out).
 */
export function secretAccessReview(user: UserInfo, secret: SecretKey): SubjectAccessReviewBody {
  return {
    apiVersion: 'authorization.k8s.io/v1',
    kind: 'SubjectAccessReview',
    spec: {
      user: user.username,
      ...(user.groups?.length ? { groups: [...user.groups] } : {}),
      ...(user.uid ? { uid: user.uid } : {}),
      ...(user.extra && Object.keys(user.extra).length > 0 ? { extra: structuredClone(user.extra) } : {}),
      resourceAttributes: {
        group: '',
        version: 'v1',
        resource: 'secrets',
        verb: 'get',
        namespace: secret.namespace,
        name: secret.name,
      },
    },
  };
}

/** The outcome of a SubjectAccessReview call: its status, or the error it failed with. */
export type SarOutcome =
  { status: { allowed?: boolean; denied?: boolean; reason?: string; evaluationError?: string } } | { error: string };

/**
 * Turns a SubjectAccessReview outcome into a decision (SPEC §10): allowed only when
 * `status.allowed` is true; an error denies (fail closed).
 * @param user the requesting user's name (for the message).
 * @param secret the Secret the review asked about.
 * @param rule why the check was needed (from {@link planReview}).
 */
export function secretAccessDecision(user: string, secret: SecretKey, rule: string, outcome: SarOutcome): Decision {
  const target = `Secret ${secret.namespace}/${secret.name}`;
  if ('error' in outcome) {
    return deny(
      500,
      'InternalError',
      `could not check whether user ${JSON.stringify(user)} may get ${target} (SubjectAccessReview failed: ${outcome.error}); denied because ${rule}`,
    );
  }
  if (outcome.status.allowed === true) return { allowed: true, why: `user may get ${target}` };
  const detail = [outcome.status.reason, outcome.status.evaluationError].filter(Boolean).join('; ');
  return deny(
    403,
    'Forbidden',
    `user ${JSON.stringify(user)} may not get ${target}: ${rule}${detail ? ` (authorizer: ${detail})` : ''}`,
  );
}

/**
 * SPEC §10 delete refusal: refused while the identity is in use; the message gives the count,
 * the first {@link DELETE_NAMESPACES_SHOWN} namespaces and "and N more", with long names shortened.
 * @param identity the identity's name.
 * @param user the requesting user's name.
 * @param statusNamespaces `oldObject.status.namespaces`.
 * @param consumerNamespaces namespaces of live consumers found by the field-selector lookup,
 *   or `{ error }` when the lookup failed (which denies: fail closed).
 */
export function deleteDecision(
  identity: string,
  user: string,
  statusNamespaces: readonly string[],
  consumerNamespaces: readonly string[] | { error: string },
): Decision {
  if (!Array.isArray(consumerNamespaces)) {
    const err = (consumerNamespaces as { error: string }).error;
    return deny(
      500,
      'InternalError',
      `could not check whether TerraformClusterIdentity ${JSON.stringify(identity)} is in use (consumer lookup failed: ${err}); delete by user ${JSON.stringify(user)} denied`,
    );
  }
  const inUse = [...new Set([...statusNamespaces, ...consumerNamespaces])].sort();
  if (inUse.length === 0) return { allowed: true, why: 'identity not in use' };
  const shown = inUse.slice(0, DELETE_NAMESPACES_SHOWN);
  const more = inUse.length > shown.length ? `, and ${inUse.length - shown.length} more` : '';
  return deny(
    403,
    'Forbidden',
    `user ${JSON.stringify(shorten(user, NAME_IN_WARNING))} may not delete TerraformClusterIdentity ${JSON.stringify(shorten(identity, NAME_IN_WARNING))}: ` +
      `it is in use in ${count(inUse.length, 'namespace')}: ${shown.join(', ')}${more} (see its status.namespaces); ` +
      'an identity in use cannot be deleted — point its consumers elsewhere or delete them first',
  );
}

/**
 * How many namespaces a delete refusal names (SPEC §10): with names of at most 63 characters and
 * the identity and user names shortened, the message stays under 1 KiB.
 */
export const DELETE_NAMESPACES_SHOWN = 10;

/**
 * The longest warning this webhook sends: Kubernetes may cut a webhook's warning longer than
 * 256 characters before it reaches the client.
 */
export const MAX_WARNING_LENGTH = 255;

/** The longest identity or namespace name quoted in a warning (longer ones are shortened). */
const NAME_IN_WARNING = 63;

/** `text` cut to `max` characters, ending in `...` when cut. */
function shorten(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, Math.max(0, max - 3))}...`;
}

/** Printable ASCII only (a warning travels in an HTTP header); then at most {@link MAX_WARNING_LENGTH}. */
const fit = (text: string): string => shorten(text.replace(/[^\x20-\x7e]/g, ' '), MAX_WARNING_LENGTH);

const identityLabel = (identity: string): string => `identity ${JSON.stringify(shorten(identity, NAME_IN_WARNING))}`;
const count = (n: number, noun: string): string => `${n} ${noun}${n === 1 ? '' : 's'}`;

/**
 * Joins `items` with `, ` in at most `budget` characters; when they do not all fit, as many as
 * fit are followed by `and N more` (counted).
 * @returns the joined list or its summary (the first item, shortened, when not even one fits whole).
 */
export function summariseList(items: readonly string[], budget: number): string {
  const all = items.join(', ');
  if (all.length <= budget) return all;
  const shown: string[] = [];
  for (const item of items) {
    const rest = items.length - shown.length - 1;
    if ([...shown, item, `and ${rest} more`].join(', ').length > budget) break;
    shown.push(item);
  }
  // Never a list that names nothing: the first item, shortened, always shows.
  if (shown.length === 0 && items.length > 0) {
    const more = items.length > 1 ? `, and ${items.length - 1} more` : '';
    return shorten(items[0]!, Math.max(8, budget - more.length)) + more;
  }
  return [...shown, `and ${items.length - shown.length} more`].join(', ');
}

/**
 * SPEC §10: the warning of an allowed UPDATE that changes `spec.secretRef`.
 * @param identity the identity's name; @param secret the new Secret (names only, never data).
 * @returns e.g. `identity "aws-prod": spec.secretRef changed; every mirror will be rewritten from captf-system/new-creds`.
 */
export function secretRefWarning(identity: string, secret: SecretKey): string {
  const head = `${identityLabel(identity)}: spec.secretRef changed; every mirror will be rewritten from `;
  return fit(head + shorten(`${secret.namespace}/${secret.name}`, MAX_WARNING_LENGTH - head.length));
}

/** Number of consumers per namespace, from the namespaces of the consumers found ('' ignored). */
export function consumerCounts(namespaces: readonly string[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const ns of namespaces) if (ns) counts[ns] = (counts[ns] ?? 0) + 1;
  return counts;
}

function hasSelector(allowed: unknown): boolean {
  return isPlainObject(allowed) && isSet(allowed.selector);
}

const listOf = (allowed: unknown): unknown[] =>
  isPlainObject(allowed) && Array.isArray(allowed.list) ? allowed.list : [];

/**
 * Which namespaces' labels the impact of `check` depends on: none when neither value has a
 * selector; when only the new one has, the in-use namespaces the old list named; otherwise
 * every namespace in use.
 * @param inUse namespaces where the identity has consumers.
 * @returns sorted namespace names (the shell reads each one's labels).
 */
export function namespacesNeedingLabels(check: ImpactCheck, inUse: readonly string[]): string[] {
  if (hasSelector(check.oldAllowed)) return [...inUse].sort();
  if (!hasSelector(check.newAllowed)) return [];
  const listed = listOf(check.oldAllowed);
  return inUse.filter((n) => listed.includes(n)).sort();
}

/**
 * What the impact lookup of an {@link ImpactCheck} found: consumers per namespace and the
 * labels of the namespaces {@link namespacesNeedingLabels} named (a namespace missing from
 * `labels` no longer exists).
 */
export interface ImpactFound {
  consumers: Record<string, number>;
  labels: Record<string, Record<string, string>>;
}

/** The impact lookup's result, or why it failed (an API error, or the time budget ran out). */
export type ImpactFacts = ImpactFound | { error: string };

/**
 * SPEC §2/§10: the namespaces in use that the change revokes — allowed by the old value and
 * not by the new one, both decided by {@link isNamespaceAllowed}. A namespace whose labels were
 * needed but not found is gone and loses nothing.
 * @returns sorted namespace names.
 */
export function namespacesLosingAccess(check: ImpactCheck, facts: ImpactFound): string[] {
  const inUse = Object.keys(facts.consumers);
  const needed = new Set(namespacesNeedingLabels(check, inUse));
  const allows = (allowed: unknown, name: string) =>
    isNamespaceAllowed(allowed as AllowedNamespaces | null | undefined, { name, labels: facts.labels[name] ?? {} });
  return inUse
    .filter((name) => !needed.has(name) || Object.hasOwn(facts.labels, name))
    .filter((name) => allows(check.oldAllowed, name) && !allows(check.newAllowed, name))
    .sort();
}

/**
 * SPEC §10 revocation warnings for an allowed change of `allowedNamespaces`.
 * @param check the identity and its old and new `allowedNamespaces`.
 * @param facts the impact lookup's result, or `{ error }` when it failed or timed out.
 * @returns nothing when no namespace in use loses access; one warning naming the namespaces
 *   that do (each with its consumer count, summarised as `and N more` when long) and the total
 *   number of consumers that lose their credentials; or, when the lookup failed, one warning
 *   that the impact could not be computed. Each under 256 characters, names only.
 */
export function revocationWarnings(check: ImpactCheck, facts: ImpactFacts): string[] {
  if ('error' in facts) {
    const head = `${identityLabel(check.identity)}: could not compute which namespaces in use lose access (`;
    const tail = '); consumers in namespaces no longer allowed will lose their credentials';
    return [fit(head + shorten(facts.error, MAX_WARNING_LENGTH - head.length - tail.length) + tail)];
  }
  const lost = namespacesLosingAccess(check, facts);
  if (lost.length === 0) return [];
  const consumers = lost.reduce((sum, ns) => sum + facts.consumers[ns]!, 0);
  const head = `${identityLabel(check.identity)}: spec.allowedNamespaces no longer allows ${count(lost.length, 'namespace')} in use: `;
  const tail = `; ${count(consumers, 'consumer')} there will lose ${consumers === 1 ? 'its' : 'their'} credentials`;
  const items = lost.map((ns) => `${shorten(ns, NAME_IN_WARNING)} (${count(facts.consumers[ns]!, 'consumer')})`);
  return [fit(head + summariseList(items, MAX_WARNING_LENGTH - head.length - tail.length) + tail)];
}
