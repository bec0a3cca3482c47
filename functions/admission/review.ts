/**
 * The imperative part of one review: runs what {@link planReview} asks for — a
 * SubjectAccessReview (`authorization.k8s.io/v1`) for the requesting user, or the live
 * in-use lookup of an identity's consumers — and returns the decision. No HTTP here; never
 * reads a Secret (admission needs no Secret RBAC, only `create subjectaccessreviews` and
 * `list` on the consumer kinds).
 */
import type { ConsumerKind } from '../lib/api.ts';
import { consumersOfIdentity } from '../lib/consumers.ts';
import { apiStatus, describeError, type Clients } from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import {
  deleteDecision,
  planReview,
  secretAccessDecision,
  secretAccessReview,
  type Decision,
  type IdentityRequest,
  type SarOutcome,
  type SecretKey,
  type UserInfo,
} from './decide.ts';

/** What a review needs from outside. */
export interface ReviewDeps {
  clients: Clients;
  consumerKinds: readonly ConsumerKind[];
  logger: Logger;
}

/** Attempts of one API read that the server answered 429 (e.g. "storage is (re)initializing"). */
const ATTEMPTS_ON_429 = 4;

/**
 * Runs `call`, retrying a 429 Too Many Requests a few times with a short pause (as client-go
 * does), so a watch cache that is still warming up does not deny a request. The total wait
 * stays well under the webhook timeout.
 * @throws the last error when it is not a 429 or attempts run out.
 */
async function retryTooManyRequests<T>(call: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (err) {
      if (apiStatus(err) !== 429 || attempt >= ATTEMPTS_ON_429) throw err;
      await new Promise((r) => setTimeout(r, 250 * attempt));
    }
  }
}

/**
 * Asks the API server whether `user` may `get` the Secret (SubjectAccessReview with `user`,
 * `groups`, `uid` and `extra` copied from the request's userInfo).
 * @returns the SAR status, or `{ error }` with a safe description when the call fails.
 */
export async function checkSecretAccess(clients: Clients, user: UserInfo, secret: SecretKey): Promise<SarOutcome> {
  try {
    const sar = await retryTooManyRequests(() =>
      clients.authz.createSubjectAccessReview({ body: secretAccessReview(user, secret) }),
    );
    const s = sar.status;
    if (!s) return { error: 'SubjectAccessReview returned no status' };
    return {
      status: {
        allowed: s.allowed,
        ...(s.denied !== undefined ? { denied: s.denied } : {}),
        ...(s.reason ? { reason: s.reason } : {}),
        ...(s.evaluationError ? { evaluationError: s.evaluationError } : {}),
      },
    };
  } catch (err) {
    return { error: describeError(err) };
  }
}

/**
 * Reviews one parsed request (SPEC §10) and logs one line about it (uid, operation, name,
 * user, dry run, whether a SubjectAccessReview was made, the outcome) — never the object.
 * @returns the decision; never throws (an unexpected error denies).
 */
export async function reviewIdentity(req: IdentityRequest, deps: ReviewDeps): Promise<Decision> {
  const plan = planReview(req);
  const user = req.userInfo.username;
  let decision: Decision;
  let sar = false;
  let lookup = false;
  switch (plan.action) {
    case 'allow':
      decision = { allowed: true, why: plan.why };
      break;
    case 'deny':
      decision = plan.decision;
      break;
    case 'check-secret-access':
      sar = true;
      decision = secretAccessDecision(
        user,
        plan.secret,
        plan.rule,
        await checkSecretAccess(deps.clients, req.userInfo, plan.secret),
      );
      break;
    case 'check-in-use': {
      lookup = true;
      let found: string[] | { error: string };
      try {
        found = (await retryTooManyRequests(() => consumersOfIdentity(deps.clients, deps.consumerKinds, plan.identity)))
          .map((c) => c.metadata.namespace ?? '')
          .filter(Boolean);
      } catch (err) {
        found = { error: describeError(err) };
      }
      decision = deleteDecision(plan.identity, user, plan.statusNamespaces, found);
      break;
    }
  }
  deps.logger.info('reviewed', {
    uid: req.uid,
    operation: req.operation,
    ...(req.subResource ? { subResource: req.subResource } : {}),
    name: req.name,
    user,
    dryRun: Boolean(req.dryRun),
    subjectAccessReview: sar,
    consumerLookup: lookup,
    allowed: decision.allowed,
    ...(decision.allowed ? { why: decision.why } : { code: decision.code, denial: decision.message }),
  });
  return decision;
}
