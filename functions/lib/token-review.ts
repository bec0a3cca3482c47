/**
 * Bearer tokens checked by the API server, for every endpoint that authenticates its caller:
 * prepare (SPEC §5) and the event endpoints (SPEC §12, sender identity). A token is reviewed
 * with a TokenReview naming the endpoint's audience; the answer is reused from a bounded LRU
 * cache keyed by the token's SHA-256, never by the token, for at most the cache time and never
 * past the token's own expiry. What an anonymous caller can make the API server do is bounded:
 * a token that cannot be a ServiceAccount token for the audience (not a JWT, another `aud`,
 * expired by its own claim) is refused without a review, concurrent requests with one token
 * share one review, at most a few reviews run at once, and a refusal is remembered for a few
 * seconds only.
 */
import { createHash } from 'node:crypto';
import type { KubeConfig } from '@kubernetes/client-node';
import { LRUCache } from 'lru-cache';
import pLimit from 'p-limit';
import { makeClients, type CallCounter } from './kube.ts';
import { telemetry } from './telemetry.ts';

/** RFC 6750 §2.1: `Bearer` (any case), one or more spaces, a b64token. */
const BEARER = /^Bearer +([A-Za-z0-9\-._~+/]+=*)$/i;

/**
 * The token of an `Authorization` header value.
 * @returns the token, or undefined when the header is missing or is not `Bearer <b64token>`
 *   (another scheme, no token, spaces or other characters in it).
 */
export function bearerToken(header: string | undefined): string | undefined {
  return header === undefined ? undefined : BEARER.exec(header)?.[1];
}

/** The authenticated user, as a TokenReview reports it and a SubjectAccessReview takes it. */
export interface ReviewedUser {
  username: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

/** The parts of a TokenReview's `status` this module reads (`authentication.k8s.io/v1`). */
export interface TokenReviewStatusLike {
  authenticated?: boolean;
  audiences?: string[];
  user?: { username?: string; uid?: string; groups?: string[]; extra?: Record<string, string[]> };
}

/**
 * The TokenReview's verdict: the user when the token is authenticated **and** the review's
 * `status.audiences` contains `audience` (a token for the API server's own audience, or any
 * other, is refused: SPEC §5, §12).
 * @returns the user, or undefined when the caller is not authenticated for `audience`.
 */
export function reviewedUser(status: TokenReviewStatusLike | undefined, audience: string): ReviewedUser | undefined {
  const u = status?.user;
  if (status?.authenticated !== true || !u?.username) return undefined;
  if (!(status.audiences ?? []).includes(audience)) return undefined;
  return userOf({ ...u, username: u.username });
}

/** The fields of a TokenReview's user that a SubjectAccessReview takes, absent ones left out. */
function userOf(u: ReviewedUser): ReviewedUser {
  return {
    username: u.username,
    ...(u.uid ? { uid: u.uid } : {}),
    ...(u.groups ? { groups: [...u.groups] } : {}),
    ...(u.extra ? { extra: u.extra } : {}),
  };
}

/**
 * Cache key of a TokenReview result: `tr:` and the SHA-256 of the token (64 hex digits).
 * The raw token is never kept as a key.
 */
export function tokenKey(token: string): string {
  return `tr:${sha256(token)}`;
}

/** The SHA-256 of a string, as 64 hex digits. */
export const sha256 = (s: string): string => createHash('sha256').update(s).digest('hex');

/**
 * How long a verified token's answer may be reused, in ms: the cache time, cut to what is left
 * of the token's life when it is a JWT with an `exp` claim (read only after the API server
 * authenticated the token, so the claim is the issuer's). 0 when the token is already expired.
 * @param nowMs the current time (ms since the epoch).
 */
export function reuseFor(token: string, cacheTtlMs: number, nowMs: number): number {
  const exp = jwtExpiry(token);
  return exp === undefined ? cacheTtlMs : Math.max(0, Math.min(cacheTtlMs, exp * 1000 - nowMs));
}

/** The `exp` claim (seconds since the epoch) of a JWT, or undefined when there is none to read. */
function jwtExpiry(token: string): number | undefined {
  const exp = jwtClaims(token)?.exp;
  return typeof exp === 'number' && Number.isFinite(exp) ? exp : undefined;
}

/** The claims of a JWT (`header.payload.signature`), unverified; undefined when it is none. */
function jwtClaims(token: string): Record<string, unknown> | undefined {
  const parts = token.split('.');
  if (parts.length !== 3 || !parts[1]) return undefined;
  try {
    const claims: unknown = JSON.parse(Buffer.from(parts[1], 'base64url').toString('utf8'));
    return claims && typeof claims === 'object' && !Array.isArray(claims)
      ? (claims as Record<string, unknown>)
      : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Whether `token` could be a ServiceAccount token for `audience`, by its own unverified claims:
 * a JWT whose `aud` (a string or a list) names the audience and whose `exp`, when present, is
 * still ahead of `nowMs`. Every token the TokenRequest API mints is such a JWT; one that is not
 * would be refused by the TokenReview anyway, so it is refused without one (an anonymous caller
 * cannot make the API server work for junk). Never a reason to accept: only the review is.
 */
export function mayBeFor(token: string, audience: string, nowMs: number): boolean {
  const claims = jwtClaims(token);
  if (!claims) return false;
  const aud = typeof claims.aud === 'string' ? [claims.aud] : Array.isArray(claims.aud) ? claims.aud : [];
  if (!aud.includes(audience)) return false;
  const exp = jwtExpiry(token);
  return exp === undefined || exp * 1000 > nowMs;
}

/**
 * How long a refusal is remembered at most, in ms: long enough to absorb a flood of one bad
 * token, short enough that a token refused while the API server had not yet seen its new
 * ServiceAccount works again a moment later.
 */
export const REFUSAL_TTL_MS = 5_000;

/**
 * TokenReviews one process makes at once, at most: a flood of distinct well-formed forgeries
 * (each costs a review) waits its turn instead of loading the API server; a cached or shared
 * answer never waits.
 */
export const MAX_REVIEWS_IN_FLIGHT = 8;

/**
 * TokenReviews that may wait for a turn, at most: beyond that a review is not queued but
 * refused as {@link ReviewsBusy} (the caller answers 503 and the sender retries), so a flood
 * cannot build a backlog that delays the real senders' reviews for long.
 */
export const MAX_REVIEWS_WAITING = 64;

/** Thrown when {@link MAX_REVIEWS_WAITING} reviews already wait: nothing was asked of the API server. */
export class ReviewsBusy extends Error {
  constructor() {
    super(`${MAX_REVIEWS_IN_FLIGHT} TokenReviews are under way and ${MAX_REVIEWS_WAITING} wait`);
  }
}

/** A token cache entry: the reviewed user. */
type Reviewed = { user: ReviewedUser };

/** TokenReviews for one audience, with the process's cache of their answers. */
export class TokenReviewer {
  private readonly kc: KubeConfig;
  private readonly cache: LRUCache<string, Reviewed> | undefined;
  /** Refused tokens, apart from the answers: a flood of refusals never pushes a sender's answer out. */
  private readonly refused: LRUCache<string, true> | undefined;
  private readonly cacheTtlMs: number;
  /** Reviews under way, by cache key: concurrent requests with one token share one review. */
  private readonly inFlight = new Map<string, Promise<ReviewedUser | undefined>>();
  /** At most {@link MAX_REVIEWS_IN_FLIGHT} reviews at once. */
  private readonly limit = pLimit(MAX_REVIEWS_IN_FLIGHT);
  /** The audience every reviewed token must be bound to. */
  readonly audience: string;

  /**
   * @param kc API access that may `create` tokenreviews.
   * @param audience the audience a token must carry (TokenReview `spec.audiences`).
   * @param cacheTtlMs how long an answer is reused at most (0: never).
   * @param entries how many answers the cache holds at most.
   */
  constructor(kc: KubeConfig, audience: string, cacheTtlMs: number, entries: number) {
    this.kc = kc;
    this.audience = audience;
    this.cacheTtlMs = cacheTtlMs;
    this.cache = cacheTtlMs > 0 ? new LRUCache<string, Reviewed>({ max: entries, ttl: cacheTtlMs }) : undefined;
    const refusalTtl = Math.min(cacheTtlMs, REFUSAL_TTL_MS);
    this.refused = refusalTtl > 0 ? new LRUCache<string, true>({ max: entries, ttl: refusalTtl }) : undefined;
  }

  /**
   * The user `token` authenticates for the audience, or undefined when it does not (unknown,
   * expired, revoked, or minted for another audience). Each review counts on `counter`; a
   * cached answer, a shared one and a token refused by its claims ({@link mayBeFor}) make none.
   * @throws the API error of a TokenReview that could not be made; {@link ReviewsBusy} when too
   *   many reviews already wait.
   */
  async review(token: string, counter: CallCounter): Promise<ReviewedUser | undefined> {
    if (!mayBeFor(token, this.audience, Date.now())) return undefined;
    const key = tokenKey(token);
    const hit = this.cache?.get(key);
    if (hit) return hit.user;
    if (this.refused?.has(key)) return undefined;
    const pending = this.inFlight.get(key);
    if (pending) return pending;
    if (this.limit.pendingCount >= MAX_REVIEWS_WAITING) throw new ReviewsBusy();
    const review = this.limit(() => this.ask(token, key, counter)).finally(() => this.inFlight.delete(key));
    this.inFlight.set(key, review);
    return review;
  }

  /** One TokenReview, its answer cached (a refusal for at most {@link REFUSAL_TTL_MS}). */
  private async ask(token: string, key: string, counter: CallCounter): Promise<ReviewedUser | undefined> {
    const { authn } = makeClients(this.kc, counter);
    const answer = await authn.createTokenReview({
      body: {
        apiVersion: 'authentication.k8s.io/v1',
        kind: 'TokenReview',
        spec: { token, audiences: [this.audience] },
      },
    });
    const user = reviewedUser(answer.status, this.audience);
    telemetry().accessCheck('TokenReview', user !== undefined);
    if (!user) {
      this.refused?.set(key, true);
      return undefined;
    }
    const ttl = reuseFor(token, this.cacheTtlMs, Date.now());
    if (ttl > 0) this.cache?.set(key, { user }, { ttl });
    return user;
  }
}
