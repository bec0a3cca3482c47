/**
 * The imperative part of one review: runs what {@link planReview} asks for — a
 * SubjectAccessReview (`authorization.k8s.io/v1`) for the requesting user, or the live
 * in-use lookup of an identity's consumers — and returns the decision, with the warnings of
 * an allowed UPDATE (the consumers and namespace labels behind a revocation). No HTTP here;
 * never reads a Secret (admission needs no Secret RBAC, only `create subjectaccessreviews`,
 * `list` on the consumer kinds and `get` on namespaces).
 */
import pLimit from 'p-limit';
import type { ConsumerKind } from '../lib/api.ts';
import { consumersOfIdentity } from '../lib/consumers.ts';
import { apiStatus, describeError, ignoreNotFound, type Clients } from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import { admissionOperation, telemetry } from '../lib/telemetry.ts';
import {
  consumerCounts,
  deleteDecision,
  namespacesNeedingLabels,
  planReview,
  revocationWarnings,
  secretAccessDecision,
  secretAccessReview,
  type Decision,
  type IdentityRequest,
  type ImpactCheck,
  type ImpactFacts,
  type Plan,
  type SarOutcome,
  type SecretKey,
  type UpdateNotes,
  type UserInfo,
} from './decide.ts';

/** What a review needs from outside. */
export interface ReviewDeps {
  clients: Clients;
  consumerKinds: readonly ConsumerKind[];
  logger: Logger;
  /** Time budget of the revocation-impact lookup in ms (default {@link IMPACT_LOOKUP_BUDGET_MS}). */
  impactBudgetMs?: number;
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
 * @returns the SAR status, or `{ error }` with a safe description when the call fails. The
 *   authorizers' free text (`status.reason`, `status.evaluationError`) is untrusted and never
 *   passed on (SPEC §15): only whether there was an evaluation error.
 */
export async function checkSecretAccess(clients: Clients, user: UserInfo, secret: SecretKey): Promise<SarOutcome> {
  try {
    const sar = await retryTooManyRequests(() =>
      clients.authz.createSubjectAccessReview({ body: secretAccessReview(user, secret) }),
    );
    const s = sar.status;
    if (!s) return { error: 'SubjectAccessReview returned no status' };
    telemetry().accessCheck('SubjectAccessReview', s.allowed && s.denied !== true);
    return {
      status: {
        allowed: s.allowed,
        ...(s.denied !== undefined ? { denied: s.denied } : {}),
        ...(s.evaluationError ? { evaluationError: 'an authorizer failed to evaluate (its text is withheld)' } : {}),
      },
    };
  } catch (err) {
    return { error: describeError(err) };
  }
}

/** Which API lookups a review made, for its log line. */
interface Trace {
  subjectAccessReview: boolean;
  consumerLookup: boolean;
  impactLookup: boolean;
}

/**
 * Reviews one parsed request (SPEC §10) and logs one line about it (uid, operation, name,
 * user, dry run, which lookups were made, the outcome and any warnings) — never the object.
 * An allowed UPDATE that changed `secretRef` or `allowedNamespaces` gets its warnings here
 * (see {@link warningsFor}); dry runs are reviewed the same way.
 * @returns the decision; never throws (an unexpected error denies).
 */
export function reviewIdentity(req: IdentityRequest, deps: ReviewDeps): Promise<Decision> {
  const operation = admissionOperation(req.operation);
  const attributes = {
    'captf.operation': operation,
    'captf.identity': req.name ?? '',
    'captf.dry_run': Boolean(req.dryRun),
  };
  return telemetry().span(`review ${operation}`, { attributes }, async (span) => {
    const decision = await review(req, deps);
    span.set({ 'captf.decision': decision.allowed ? 'allowed' : 'denied' });
    return decision;
  });
}

/** {@link reviewIdentity} without its span. */
async function review(req: IdentityRequest, deps: ReviewDeps): Promise<Decision> {
  const plan = planReview(req);
  const trace: Trace = { subjectAccessReview: false, consumerLookup: false, impactLookup: false };
  let decision = await carryOut(plan, req, deps, trace);
  if (decision.allowed && 'notes' in plan && plan.notes) {
    const warnings = await warningsFor(plan.notes, deps, trace);
    if (warnings.length > 0) decision = { ...decision, warnings };
  }
  telemetry().admissionReview(req.operation, decision.allowed);
  deps.logger.info('reviewed', {
    uid: req.uid,
    operation: req.operation,
    ...(req.subResource ? { subResource: req.subResource } : {}),
    name: req.name,
    user: req.userInfo.username,
    dryRun: Boolean(req.dryRun),
    ...trace,
    allowed: decision.allowed,
    ...(decision.allowed
      ? { why: decision.why, ...(decision.warnings ? { warnings: decision.warnings } : {}) }
      : { code: decision.code, denial: decision.message }),
  });
  return decision;
}

/** Runs the check a plan asks for and turns its answer into a decision. */
async function carryOut(plan: Plan, req: IdentityRequest, deps: ReviewDeps, trace: Trace): Promise<Decision> {
  const user = req.userInfo.username;
  switch (plan.action) {
    case 'allow':
      return { allowed: true, why: plan.why };
    case 'deny':
      return plan.decision;
    case 'check-secret-access':
      trace.subjectAccessReview = true;
      return secretAccessDecision(
        user,
        plan.secret,
        plan.rule,
        await checkSecretAccess(deps.clients, req.userInfo, plan.secret),
      );
    case 'check-in-use': {
      trace.consumerLookup = true;
      let found: string[] | { error: string };
      try {
        found = (await consumersInUse(deps, plan.identity)).map((c) => c.metadata.namespace ?? '').filter(Boolean);
      } catch (err) {
        found = { error: describeError(err) };
      }
      return deleteDecision(plan.identity, user, plan.statusNamespaces, found);
    }
  }
}

/** Every consumer referencing `identity` (deleting ones too), retrying a warming cache's 429. */
const consumersInUse = (deps: ReviewDeps, identity: string) =>
  retryTooManyRequests(() => consumersOfIdentity(deps.clients, deps.consumerKinds, identity));

/** How long the impact lookup of one review may take before it gives up and warns instead. */
export const IMPACT_LOOKUP_BUDGET_MS = 3_000;

/** Namespaces read at once by the impact lookup. */
const NAMESPACE_READS = 8;

/**
 * The warnings of an allowed UPDATE (SPEC §10): the plan's own (a secretRef change), then,
 * when `allowedNamespaces` changed, the revocation warning computed from a live lookup of the
 * identity's consumers and the labels of their namespaces. The lookup never denies: when it
 * fails or takes longer than the budget, the warning says the impact could not be computed.
 */
async function warningsFor(notes: UpdateNotes, deps: ReviewDeps, trace: Trace): Promise<string[]> {
  if (!notes.impact) return notes.warnings;
  trace.impactLookup = true;
  const facts = await lookUpImpact(notes.impact, deps);
  return [...notes.warnings, ...revocationWarnings(notes.impact, facts)];
}

/** Consumers per namespace and the labels the decision needs, within the time budget; `{ error }` on failure. */
async function lookUpImpact(check: ImpactCheck, deps: ReviewDeps): Promise<ImpactFacts> {
  const budget = deps.impactBudgetMs ?? IMPACT_LOOKUP_BUDGET_MS;
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`the lookup took longer than ${budget} ms`)), budget);
  });
  try {
    return await Promise.race([readImpact(check, deps), deadline]);
  } catch (err) {
    return { error: describeError(err) };
  } finally {
    clearTimeout(timer);
  }
}

async function readImpact(check: ImpactCheck, deps: ReviewDeps): Promise<ImpactFacts> {
  const found = await consumersInUse(deps, check.identity);
  const consumers = consumerCounts(found.map((c) => c.metadata.namespace ?? ''));
  const limit = pLimit(NAMESPACE_READS);
  const labels: Record<string, Record<string, string>> = {};
  await Promise.all(
    namespacesNeedingLabels(check, Object.keys(consumers)).map((name) =>
      limit(async () => {
        const ns = await ignoreNotFound(retryTooManyRequests(() => deps.clients.core.readNamespace({ name })));
        if (ns) labels[name] = ns.metadata?.labels ?? {};
      }),
    ),
  );
  return { consumers, labels };
}
