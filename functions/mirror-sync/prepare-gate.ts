/**
 * SPEC §5: the gate in front of `POST /prepare` — the shell around authorize.ts. An express
 * middleware, registered before the body parser, answers 401 from the `Authorization`
 * header alone and otherwise makes the TokenReview (audience-bound); after the body is
 * parsed, {@link PrepareGate.authorize} makes the SubjectAccessReview for the named object.
 * Nothing about the object is read before both said yes. Results are reused for at most
 * 10 s from a bounded LRU cache keyed by SHA-256 hashes, never by the token itself.
 */
import type { KubeConfig } from '@kubernetes/client-node';
import { isServiceAccountUser } from '../lib/api-errors.ts';
import type { NextFunction, Request, Response } from 'express';
import { LRUCache } from 'lru-cache';
import type { ConsumerKind } from '../lib/api.ts';
import { sendOutcome, type Outcome } from '../lib/http.ts';
import { makeClients, type CallCounter } from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import { bearerToken, sha256, TokenReviewer, tokenKey, type ReviewedUser } from '../lib/token-review.ts';
import {
  AUTH_CACHE_ENTRIES,
  accessKey,
  challenge,
  forbidden,
  prepareAccessReview,
  prepareAttributes,
  reviewFailed,
  unauthorizedBody,
  type PrepareAttributes,
  type PrepareAuthConfig,
  type PrepareTarget,
  type Unauthenticated,
} from './authorize.ts';
import { telemetry } from '../lib/telemetry.ts';

/** An authenticated caller, left by {@link PrepareGate.authenticate} in `res.locals.caller`. */
export interface Caller {
  user: ReviewedUser;
  /** `tokenKey(token)`: the SHA-256 of the token, never the token. */
  tokenKey: string;
  /** API requests made to check this caller (TokenReview, SubjectAccessReview; 0 when cached). */
  counter: CallCounter;
}

/** Authentication and authorization of prepare's callers, with the process's review cache. */
export class PrepareGate {
  private readonly kc: KubeConfig;
  private readonly logger: Logger;
  private readonly tokens: TokenReviewer;
  /** SubjectAccessReview verdicts, by the hash of token and attributes. */
  private readonly cache: LRUCache<string, boolean> | undefined;
  /** The audience and the cache time in use. */
  readonly config: PrepareAuthConfig;

  /**
   * @param kc mirror-sync's own API access (it needs `create` on tokenreviews and subjectaccessreviews).
   * @param config audience and cache time (authorize.ts `prepareAuthFromEnv`).
   */
  constructor(kc: KubeConfig, config: PrepareAuthConfig, logger: Logger) {
    this.kc = kc;
    this.config = config;
    this.logger = logger;
    this.tokens = new TokenReviewer(kc, config.audience, config.cacheTtlMs, AUTH_CACHE_ENTRIES);
    this.cache =
      config.cacheTtlMs > 0
        ? new LRUCache<string, boolean>({ max: AUTH_CACHE_ENTRIES, ttl: config.cacheTtlMs })
        : undefined;
  }

  /**
   * Express middleware for `POST /prepare`, registered before the body parser: a missing or
   * malformed header is a 401 without reading the body; a token the TokenReview does not
   * authenticate for the audience is a 401; a TokenReview that fails is a 503. Otherwise
   * `res.locals.caller` is set ({@link Caller}) and the next handler runs.
   */
  readonly authenticate = async (req: Request, res: Response, next: NextFunction): Promise<void> => {
    const token = bearerToken(req.get('authorization'));
    if (!token) return this.unauthorized(res, 'no-token', 0);
    const caller: Caller = { user: { username: '' }, tokenKey: tokenKey(token), counter: { calls: 0 } };
    let user: ReviewedUser | undefined;
    try {
      user = await this.tokens.review(token, caller.counter);
    } catch (err) {
      return this.failed(res, reviewFailed('TokenReview', err), caller);
    }
    if (!user) return this.unauthorized(res, 'invalid-token', caller.counter.calls);
    caller.user = user;
    res.locals.caller = caller;
    next();
  };

  /**
   * The SubjectAccessReview: may `caller` create `<plural>/prepare` for `target`?
   * @returns undefined when allowed; else the answer to send: 403 (the same whether the
   *   object exists or not) or 503 when the review failed.
   */
  async authorize(caller: Caller, kind: ConsumerKind, target: PrepareTarget): Promise<Outcome | undefined> {
    const attrs = prepareAttributes(kind, target);
    let allowed: boolean;
    try {
      allowed = await this.reviewAccess(caller, attrs);
    } catch (err) {
      const o = reviewFailed('SubjectAccessReview', err);
      this.logger.warn('prepare caller check failed', { error: o.kind === 'done' ? '' : o.error });
      return o;
    }
    if (allowed) return undefined;
    this.logger.info('prepare refused', {
      status: 403,
      // The name comes from the TokenReview's answer: only a ServiceAccount's is shown (SPEC §15).
      user: isServiceAccountUser(caller.user.username)
        ? caller.user.username
        : `sha256:${sha256(caller.user.username).slice(0, 16)}`,
      kind: kind.kind,
      object: `${target.namespace}/${target.name}`,
      apiCalls: caller.counter.calls,
    });
    return forbidden(attrs);
  }

  /** The SubjectAccessReview's verdict (cached by the hash of token and attributes). @throws its API error. */
  private async reviewAccess(caller: Caller, attrs: PrepareAttributes): Promise<boolean> {
    const key = accessKey(caller.tokenKey, attrs);
    const hit = this.cache?.get(key);
    if (hit !== undefined) return hit;
    const { authz } = makeClients(this.kc, caller.counter);
    const review = await authz.createSubjectAccessReview({ body: prepareAccessReview(caller.user, attrs) });
    const allowed = review.status?.allowed === true && review.status.denied !== true;
    telemetry().accessCheck('SubjectAccessReview', allowed);
    this.cache?.set(key, allowed);
    return allowed;
  }

  /** Sends a 401 with its challenge, and logs it (never the token). */
  private unauthorized(res: Response, why: Unauthenticated, apiCalls: number): void {
    this.logger.info('prepare refused', { status: 401, reason: why, apiCalls });
    res.status(401).set('www-authenticate', challenge(why, this.config.audience));
    res.json(unauthorizedBody(why, this.config.audience));
  }

  /** Sends the 503 of a failed TokenReview, and logs it. */
  private failed(res: Response, o: Outcome, caller: Caller): void {
    this.logger.warn('prepare caller check failed', {
      error: o.kind === 'done' ? '' : o.error,
      apiCalls: caller.counter.calls,
    });
    sendOutcome(res, o);
  }
}
