/**
 * SPEC §5: who may call `POST /prepare` — the pure decisions. The caller presents an
 * audience-bound ServiceAccount token as `Authorization: Bearer <token>`; mirror-sync checks
 * it with a TokenReview naming its audience, then asks a SubjectAccessReview whether that
 * user may `create` the consumer kind's `prepare` subresource for the named object (as
 * kube-rbac-proxy does). Everything here is a function of its arguments: the API calls, the
 * cache and the HTTP answers are in prepare-gate.ts.
 *
 * No answer here depends on the object the request names, only on the request and the two
 * reviews, so a refusal is the same whether the object exists or not.
 */
import type { ConsumerKind } from '../lib/api.ts';
import type { Outcome } from '../lib/http.ts';
import { describeError, retryAfterOf } from '../lib/kube.ts';
import { largestRetryAfter } from '../lib/retry-after.ts';
import { sha256, type ReviewedUser } from '../lib/token-review.ts';

/** Audience the caller's token must be bound to unless `CAPTF_PREPARE_AUDIENCE` says otherwise. */
export const DEFAULT_PREPARE_AUDIENCE = 'captf-mirror-sync';
/** Environment variable naming the audience (SPEC §5: configurable). */
export const PREPARE_AUDIENCE_ENV = 'CAPTF_PREPARE_AUDIENCE';
/** Environment variable: seconds a review result is reused (0 turns the cache off; at most 10). */
export const PREPARE_AUTH_CACHE_ENV = 'CAPTF_PREPARE_AUTH_CACHE_SECONDS';
/** Longest time a TokenReview or SubjectAccessReview result is reused, in seconds (SPEC §5). */
export const MAX_AUTH_CACHE_SECONDS = 10;
/** Entries the review cache holds at most (TokenReviews and SubjectAccessReviews together). */
export const AUTH_CACHE_ENTRIES = 1000;

/** How prepare checks its callers, from the environment. */
export interface PrepareAuthConfig {
  /** The audience the token must be bound to (TokenReview `spec.audiences`). */
  audience: string;
  /** How long a review result is reused, in milliseconds; 0 = never. */
  cacheTtlMs: number;
}

/**
 * Reads {@link PREPARE_AUDIENCE_ENV} (default {@link DEFAULT_PREPARE_AUDIENCE}; 1–253
 * characters of letters, digits and `.-_:/`, so it fits a URL or a plain name) and
 * {@link PREPARE_AUTH_CACHE_ENV} (integer seconds 0–10, default 10).
 * @throws Error naming the variable when a value is invalid.
 */
export function prepareAuthFromEnv(env: NodeJS.ProcessEnv): PrepareAuthConfig {
  const audience = env[PREPARE_AUDIENCE_ENV]?.trim() || DEFAULT_PREPARE_AUDIENCE;
  if (!/^[A-Za-z0-9._:/-]{1,253}$/.test(audience))
    throw new Error(`${PREPARE_AUDIENCE_ENV}=${audience.slice(0, 80)} must be 1–253 letters, digits or . - _ : /`);
  const raw = env[PREPARE_AUTH_CACHE_ENV]?.trim() || String(MAX_AUTH_CACHE_SECONDS);
  const seconds = Number(raw);
  if (!Number.isInteger(seconds) || seconds < 0 || seconds > MAX_AUTH_CACHE_SECONDS)
    throw new Error(`${PREPARE_AUTH_CACHE_ENV}=${raw} must be an integer from 0 to ${MAX_AUTH_CACHE_SECONDS}`);
  return { audience, cacheTtlMs: seconds * 1000 };
}

/** What prepare names: the object a Job is about to be created for. */
export interface PrepareTarget {
  /** `''` for a cluster-scoped kind. */
  namespace: string;
  name: string;
}

/** `resourceAttributes` of the SubjectAccessReview that guards prepare. */
export interface PrepareAttributes {
  verb: 'create';
  group: string;
  resource: string;
  subresource: 'prepare';
  namespace: string;
  name: string;
}

/**
 * SPEC §5: the permission a caller needs to prepare `target`: `create` on
 * `<plural>/prepare` of the consumer kind's group, in the object's namespace, for its name.
 */
export function prepareAttributes(kind: ConsumerKind, target: PrepareTarget): PrepareAttributes {
  return {
    verb: 'create',
    group: kind.group,
    resource: kind.plural,
    subresource: 'prepare',
    namespace: target.namespace,
    name: target.name,
  };
}

/** The body of the SubjectAccessReview asking whether `user` may do `attrs`. */
export function prepareAccessReview(
  user: ReviewedUser,
  attrs: PrepareAttributes,
): {
  apiVersion: 'authorization.k8s.io/v1';
  kind: 'SubjectAccessReview';
  spec: Omit<ReviewedUser, 'username'> & { user: string; resourceAttributes: PrepareAttributes };
} {
  const { username, ...rest } = user;
  return {
    apiVersion: 'authorization.k8s.io/v1',
    kind: 'SubjectAccessReview',
    spec: { user: username, ...rest, resourceAttributes: attrs },
  };
}

/**
 * Cache key of a SubjectAccessReview result: `sar:` and the SHA-256 of the token's
 * {@link tokenKey} followed by the attributes, so one token's answer is never another's.
 */
export function accessKey(tokenKeyValue: string, attrs: PrepareAttributes): string {
  const parts = [attrs.verb, attrs.group, attrs.resource, attrs.subresource, attrs.namespace, attrs.name];
  return `sar:${sha256(JSON.stringify([tokenKeyValue, ...parts]))}`;
}

/** Why a caller was refused a 401. */
export type Unauthenticated = 'no-token' | 'invalid-token';

/**
 * The JSON body of prepare's 401 (the `WWW-Authenticate` header goes with it). It depends on
 * nothing but the header's shape and the audience, never on the object named.
 */
export function unauthorizedBody(why: Unauthenticated, audience: string): { error: string; reason: 'Unauthorized' } {
  const error =
    why === 'no-token'
      ? `prepare needs an "Authorization: Bearer <token>" header with a ServiceAccount token for audience ${audience}`
      : `the bearer token is not valid for audience ${audience} (expired, revoked, unknown, or minted for another audience)`;
  return { error, reason: 'Unauthorized' };
}

/** `WWW-Authenticate` of a 401 (RFC 6750 §3): the realm is the audience. */
export function challenge(why: Unauthenticated, audience: string): string {
  return why === 'no-token' ? `Bearer realm="${audience}"` : `Bearer realm="${audience}", error="invalid_token"`;
}

/**
 * Prepare's 403 when the SubjectAccessReview did not allow the caller: built from the
 * request's kind and namespace only (no object name, no username, no reason from the API
 * server), so it is the same whether the object exists or not.
 */
export function forbidden(attrs: PrepareAttributes): Outcome {
  const where = attrs.namespace ? `in namespace ${attrs.namespace}` : 'cluster-wide';
  return {
    kind: 'forbidden',
    reason: 'Forbidden',
    error: `the caller may not create ${attrs.resource}/prepare (${attrs.group}) ${where}`,
  };
}

/**
 * Prepare's answer when a review could not be made (the API server unreachable, 5xx, 429,
 * or any other failure): 503, never 401, 403 or 200 (SPEC §5), with `Retry-After` when a
 * throttled API server asked for a wait (at most 30 s). The message names the review
 * and the failure as `describeError` words it, never the server's text (SPEC §15).
 * @param review `TokenReview` or `SubjectAccessReview`.
 */
export function reviewFailed(review: 'TokenReview' | 'SubjectAccessReview', err: unknown): Outcome {
  return {
    kind: 'retry',
    reason: 'AuthorizationUnavailable',
    error: `mirror-sync could not check the caller: its ${review} failed (${describeError(err)}); call prepare again`,
    retryAfterSeconds: largestRetryAfter([retryAfterOf(err)]),
  };
}
