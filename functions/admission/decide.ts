/**
 * The admission decisions of SPEC §10, pure: what a request on a TerraformClusterIdentity
 * needs checked (nothing, a SubjectAccessReview, or an in-use lookup), and how the answer
 * of that check becomes allowed/denied with a message that names the user, the verb, the
 * Secret and the rule. Never reads or mentions Secret data.
 */
import { isDeepStrictEqual } from 'node:util';
import { validateIdentitySpec } from '../lib/identity-spec.ts';
import { isWidening } from '../lib/widening.ts';

/** `request.userInfo` of an AdmissionReview (`authentication.k8s.io/v1` UserInfo). */
export interface UserInfo {
  username: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

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

/** What the shell must do next for a request. */
export type Plan =
  | { action: 'allow'; why: string }
  | { action: 'deny'; decision: Denied }
  /** SubjectAccessReview: may `userInfo` get `secret`? `rule` says why the check is needed. */
  | { action: 'check-secret-access'; secret: SecretKey; rule: string }
  /** Look up live consumers of `identity`; `statusNamespaces` come from `oldObject.status`. */
  | { action: 'check-in-use'; identity: string; statusNamespaces: string[] };

/** An allowed request. */
export interface Allowed {
  allowed: true;
  /** Short why, for logs. */
  why: string;
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
 *   SAR).
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

function planCreate(req: IdentityRequest): Plan {
  return (
    invalidSpec(req) ?? {
      action: 'check-secret-access',
      secret: secretRefOf(req.object)!,
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
  const oldRef = secretRefOf(req.oldObject);
  if (!oldRef || oldRef.name !== newRef.name || oldRef.namespace !== newRef.namespace) {
    return {
      action: 'check-secret-access',
      secret: newRef,
      rule: 'changing spec.secretRef requires permission to get the new Secret',
    };
  }
  const verdict = isWidening(specOf(req.oldObject)?.allowedNamespaces, specOf(req.object)?.allowedNamespaces);
  if (verdict.widening) {
    return {
      action: 'check-secret-access',
      secret: newRef,
      rule: `widening spec.allowedNamespaces (${verdict.reason}) requires permission to get the Secret`,
    };
  }
  return { action: 'allow', why: 'secretRef unchanged and allowedNamespaces not widened' };
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
 * SPEC §10 delete refusal: refused while the identity is in use.
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
  return deny(
    403,
    'Forbidden',
    `user ${JSON.stringify(user)} may not delete TerraformClusterIdentity ${JSON.stringify(identity)}: it is in use in namespace(s) ${inUse.join(', ')}; an identity in use cannot be deleted — point its consumers elsewhere or delete them first`,
  );
}
