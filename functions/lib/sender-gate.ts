/**
 * SPEC §12: the gate in front of a function's `POST /` — the shell around senders.ts. An
 * express middleware, registered before the body is read: a delivery without a Bearer token,
 * with one the API server does not authenticate for the function's audience (TokenReview,
 * token-review.ts, cached by hash), or from a subject that is no sender is refused 401 or 403
 * with a body that names nothing; a TokenReview that cannot be made is a 503 (Knative retries).
 * A sender is one of the configured subjects or one a Ready EventPolicy targeting the function
 * lets in (event-policies.ts, read only for a verified subject that is not configured).
 * Only a delivery that passes reaches the event handler. Each refusal is one log line that
 * names the sender only when it is a ServiceAccount, and never the token, under the random id
 * the answer carries in `x-request-id`.
 */
import { randomUUID } from 'node:crypto';
import type { KubeConfig } from '@kubernetes/client-node';
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import { isServiceAccountUser } from './api-errors.ts';
import { EVENT_ANSWER_ID_HEADER, sendOutcome } from './http.ts';
import { describeError, retryAfterOf, type CallCounter } from './kube.ts';
import type { Logger } from './log.ts';
import { largestRetryAfter } from './retry-after.ts';
import {
  EVENT_AUTH_CACHE_ENTRIES,
  isSender,
  OFF_WARNING,
  refusal,
  targetOfAudience,
  type EventAuthConfig,
  type SenderRefusal,
} from './senders.ts';
import { bearerToken, sha256, TokenReviewer } from './token-review.ts';
import { EventPolicySenders } from './event-policies.ts';

/**
 * The sender check of one function's `POST /`. With `off`, a middleware that lets every
 * delivery through, after one warning at start; with `oidc`, the check described above.
 * @param kc the function's own API access (it needs `create` on tokenreviews, and `list` on
 *   eventpolicies in its namespace for senders that policies let in).
 */
export function senderGate(kc: KubeConfig, cfg: EventAuthConfig, logger: Logger): RequestHandler {
  if (cfg.mode === 'off') {
    logger.warn('event senders unchecked', { detail: OFF_WARNING });
    return (_req, _res, next) => next();
  }
  const tokens = new TokenReviewer(kc, cfg.audience, cfg.cacheTtlMs, EVENT_AUTH_CACHE_ENTRIES);
  const target = targetOfAudience(cfg.audience);
  const policies = target && new EventPolicySenders(kc, target, logger);
  /** Whether `subject` is a sender: one of the configured ones, or one a Ready EventPolicy lets in. */
  const mayDeliver = async (subject: string, counter: CallCounter): Promise<boolean> =>
    isSender(subject, cfg.senders) || (policies !== undefined && isSender(subject, await policies.senders(counter)));
  const refuse = (res: Response, why: SenderRefusal, counter: CallCounter, subject?: string): void => {
    logger.info('event refused', {
      requestId: answerId(res),
      reason: why,
      ...(subject ? { sender: shown(subject) } : {}),
      apiCalls: counter.calls,
    });
    const r = refusal(why);
    if (r.challenge) res.set('www-authenticate', r.challenge);
    // A refused body is never read: the connection closes after the answer.
    res.set('connection', 'close').status(r.status).json(r.body);
  };
  return async (req: Request, res: Response, next: NextFunction): Promise<void> => {
    const counter: CallCounter = { calls: 0 };
    const token = bearerToken(req.get('authorization'));
    if (!token) return refuse(res, 'no-token', counter);
    let subject: string | undefined;
    let allowed: boolean;
    try {
      subject = (await tokens.review(token, counter))?.username;
      allowed = subject !== undefined && (await mayDeliver(subject, counter));
    } catch (err) {
      // The caller is not known yet: the API server's words stay in the log.
      logger.warn('event sender check failed', {
        requestId: answerId(res),
        error: describeError(err),
        apiCalls: counter.calls,
      });
      return sendOutcome(res, {
        kind: 'retry',
        error: UNCHECKED,
        retryAfterSeconds: largestRetryAfter([retryAfterOf(err)]),
      });
    }
    if (!subject) return refuse(res, 'invalid-token', counter);
    if (!allowed) return refuse(res, 'not-a-sender', counter, subject);
    next();
  };
}

/**
 * Gives the answer a random id in {@link EVENT_ANSWER_ID_HEADER}, as every event answer has, so
 * a sender's or a dead letter's record finds the log line that says why.
 */
function answerId(res: Response): string {
  const id = randomUUID();
  res.set(EVENT_ANSWER_ID_HEADER, id);
  return id;
}

/** The answer to a delivery whose sender could not be checked (a 503): it names nothing. */
export const UNCHECKED = 'the sender could not be checked; deliver again';

/** A subject as a log line may show it: a ServiceAccount's name, anything else only hashed (SPEC §15). */
const shown = (subject: string): string =>
  isServiceAccountUser(subject) ? subject : `sha256:${sha256(subject).slice(0, 16)}`;
