/**
 * SPEC §5: the synchronous `POST /prepare` the provider's manager calls before it creates a
 * Terraform Job. Runs the reconcile now and answers 200 `{mirror, sourceHash}` only when the
 * mirror is current and carries this object's owner reference; otherwise a non-2xx JSON
 * body with the reason, so a destroy never starts with stale or missing credentials.
 */
import { isDns1123Label, isDns1123Subdomain } from '../lib/allowed-namespaces.ts';
import type { Consumer, ConsumerKind } from '../lib/api.ts';
import { findConsumerKind, kindName, scopeMismatch } from '../lib/consumers.ts';
import { HttpError, type Outcome } from '../lib/http.ts';
import { describeError, ignoreNotFound, retryAfterOf, type Clients } from '../lib/kube.ts';
import { isCurrent, isOurs, mirrorName, type SecretLike } from '../lib/mirror.ts';
import { largestRetryAfter } from '../lib/retry-after.ts';
import { contextOf, settleWithoutKey, type ConsumerResult, type ReconcileDeps } from './act.ts';
import type { MirrorKey } from './decide.ts';
import { keysForConsumer } from './keys.ts';
import type { KeyResult } from './reconcile.ts';
import type { Scheduler } from './scheduler.ts';

/** A prepare request: the consumer the Job is for. */
export interface PrepareRequest {
  apiVersion: string;
  kind: string;
  namespace: string;
  name: string;
}

/**
 * Parses and validates the body of `POST /prepare`. An empty `namespace` names a
 * cluster-scoped object (answered like any object whose namespace is not allowed, SPEC §2);
 * it must match the kind's scope.
 * @throws HttpError 400 naming the missing or bad field, the unknown kind, or a namespace the
 *   kind's scope rules out.
 */
export function parsePrepareRequest(
  raw: string,
  kinds: readonly ConsumerKind[],
): { req: PrepareRequest; kind: ConsumerKind } {
  const b = jsonObject(raw);
  for (const f of ['apiVersion', 'kind', 'namespace', 'name']) {
    if (typeof b[f] !== 'string' || (b[f] === '' && f !== 'namespace'))
      throw new HttpError(400, `field ${f} must be a ${f === 'namespace' ? '' : 'non-empty '}string`, 'BadRequest');
  }
  const req = {
    apiVersion: b.apiVersion as string,
    kind: b.kind as string,
    namespace: b.namespace as string,
    name: b.name as string,
  };
  if (req.namespace !== '' && !isDns1123Label(req.namespace))
    throw new HttpError(
      400,
      `namespace ${JSON.stringify(req.namespace).slice(0, 80)} is not a valid namespace name`,
      'BadRequest',
    );
  if (!isDns1123Subdomain(req.name))
    throw new HttpError(400, `name ${JSON.stringify(req.name).slice(0, 80)} is not a valid object name`, 'BadRequest');
  const kind = configuredKind(kinds, req);
  const mismatch = scopeMismatch(kind, req.namespace);
  if (mismatch) throw new HttpError(400, `${req.name}: ${mismatch}`, 'BadRequest');
  return { req, kind };
}

/** The body as a JSON object. @throws HttpError 400. */
function jsonObject(raw: string): Record<string, unknown> {
  let body: unknown;
  try {
    body = JSON.parse(raw);
  } catch {
    throw new HttpError(400, 'body must be JSON: {"apiVersion","kind","namespace","name"}', 'BadRequest');
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body))
    throw new HttpError(400, 'body must be a JSON object', 'BadRequest');
  return body as Record<string, unknown>;
}

/** The configured consumer kind of the request. @throws HttpError 400 `UnknownKind`. */
function configuredKind(kinds: readonly ConsumerKind[], req: PrepareRequest): ConsumerKind {
  const kind = findConsumerKind(kinds, req.apiVersion, req.kind);
  if (kind) return kind;
  throw new HttpError(
    400,
    `${req.apiVersion}/${req.kind} is not a configured consumer kind (${kinds.map(kindName).join(', ')})`,
    'UnknownKind',
  );
}

/** What prepare learned about its consumer, for {@link prepareAnswer}. */
export interface PrepareOutcome {
  /** `<namespace>/<name>` */
  object: string;
  kind: string;
  outcome: ConsumerResult['outcome'] | 'error';
  reason: string;
  message: string;
  /** Mirror name and source hash when the mirror is current. */
  mirror?: string;
  sourceHash?: string;
  /** For an `error`: the wait, in seconds, a throttled API server asked for (answered as `Retry-After`). */
  retryAfterSeconds?: number | undefined;
}

/**
 * Maps prepare's outcome to its answer (SPEC §5: 403/404/409 for states that wait for a
 * person, 503 only for failures a retry can fix, with the wait a throttled API server asked
 * for; statuses from lib/http.ts `OUTCOME_STATUS`).
 */
export function prepareAnswer(r: PrepareOutcome, ready: boolean): Outcome {
  switch (r.outcome) {
    case 'mirrored':
      return ready
        ? { kind: 'done', body: { mirror: r.mirror!, sourceHash: r.sourceHash!, namespace: r.object.split('/')[0]! } }
        : { kind: 'retry', reason: 'MirrorFailed', error: 'the mirror changed while preparing; call prepare again' };
    case 'not-allowed':
      return { kind: 'forbidden', reason: 'IdentityNotAllowed', error: r.message };
    case 'mirror-failed':
      return { kind: 'conflict', reason: 'MirrorFailed', error: r.message };
    case 'source-is-mirror':
      return { kind: 'conflict', reason: 'SourceIsMirror', error: r.message };
    case 'source-not-found':
    case 'identity-not-found':
      return { kind: 'not-found', reason: r.reason, error: r.message };
    case 'gone':
      return { kind: 'not-found', reason: 'ObjectNotFound', error: `${r.kind} ${r.object} does not exist` };
    case 'no-identity-ref':
      return { kind: 'unprocessable', reason: 'NoIdentityRef', error: r.message };
    default:
      return {
        kind: 'retry',
        reason: r.reason,
        error: r.message,
        retryAfterSeconds: largestRetryAfter([r.retryAfterSeconds]),
      };
  }
}

/**
 * Decides whether the (already authenticated) caller may prepare this object: the
 * SubjectAccessReview of prepare-gate.ts. Resolves to undefined when allowed, else to the
 * answer to send (403, or 503 when the review failed).
 */
export type PrepareAuthorizer = (kind: ConsumerKind, req: PrepareRequest) => Promise<Outcome | undefined>;

/**
 * Runs prepare for one request of an authenticated caller (SPEC §5): parses the body, asks
 * `authorize` before anything about the object is read, then reconciles the consumer's
 * mirror key now (through the scheduler, so with a reconcile that started after this request
 * arrived) and re-reads the mirror to confirm it is current and carries this object's owner
 * reference (exact UID).
 * @returns the outcome; a bad body is `bad-input` (400) naming the field; a refusal is
 *   whatever `authorize` answered.
 */
export async function prepare(
  deps: ReconcileDeps,
  scheduler: Scheduler,
  raw: string,
  authorize: PrepareAuthorizer,
): Promise<Outcome> {
  let parsed: ReturnType<typeof parsePrepareRequest>;
  try {
    parsed = parsePrepareRequest(raw, deps.kinds);
  } catch (err) {
    if (err instanceof HttpError) return { kind: 'bad-input', error: err.message, reason: err.reason };
    throw err;
  }
  const { req, kind } = parsed;
  const refused = await authorize(kind, req);
  if (refused) return refused;
  const ctx = contextOf(deps);
  const { clients } = ctx;
  const base = { object: `${req.namespace}/${req.name}`, kind: kind.kind };
  let found: Awaited<ReturnType<typeof keysForConsumer>>;
  let results: KeyResult[];
  try {
    found = await keysForConsumer(clients, deps.kinds, { ...req, namespace: req.namespace || undefined });
    results = await scheduler.keys(found.keys);
  } catch (err) {
    // The API server failed the lookups: a retry can fix that (SPEC §5).
    const failed = { outcome: 'error', reason: 'APIError', message: describeError(err) } as const;
    return prepareAnswer({ ...base, ...failed, retryAfterSeconds: retryAfterOf(err) }, false);
  }
  const { consumer } = found;
  if (!consumer) return prepareAnswer({ ...base, outcome: 'gone', reason: 'ObjectNotFound', message: '' }, false);
  const identity = consumer.spec?.identityRef?.name;
  const own = results.find((r) => r.key.identity === identity);
  if (!own) return prepareAnswer(await settleWithoutKey(ctx, consumer), false);
  return answerFor(clients, { req, consumer, own, base });
}

/** The answer once the consumer's own key was reconciled: ready only when the mirror is current and carries its owner reference. */
async function answerFor(
  clients: Clients,
  r: { req: PrepareRequest; consumer: Consumer; own: KeyResult; base: { object: string; kind: string } },
): Promise<Outcome> {
  const { req, consumer, own, base } = r;
  if (own.error)
    return prepareAnswer(
      { ...base, outcome: 'error', reason: 'APIError', message: own.error, retryAfterSeconds: own.retryAfterSeconds },
      false,
    );
  const mine = own.consumers.find((c) => c.object === base.object && c.kind === base.kind);
  if (!mine)
    return prepareAnswer(
      {
        ...base,
        outcome: 'error',
        reason: 'MirrorFailed',
        message: 'the object changed while preparing; call prepare again',
      },
      false,
    );
  const identity = own.key.identity;
  const outcome: PrepareOutcome = {
    ...mine,
    mirror: mirrorName(identity),
    ...(own.sourceHash ? { sourceHash: own.sourceHash } : {}),
  };
  const ready =
    mine.outcome === 'mirrored' &&
    own.sourceHash !== undefined &&
    (await mirrorReadyFor(clients, {
      key: own.key,
      hash: own.sourceHash,
      owner: { kind: req.kind, name: req.name, uid: consumer.metadata.uid! },
    }));
  return prepareAnswer(outcome, ready);
}

/**
 * SPEC §5: is the key's mirror current for `hash`, and does it carry this consumer's owner
 * reference (exact UID)? Read fresh, after the reconcile.
 * @throws API errors other than 404.
 */
export async function mirrorReadyFor(
  clients: Clients,
  want: { key: MirrorKey; hash: string; owner: { kind: string; name: string; uid: string } },
): Promise<boolean> {
  const { key, hash, owner } = want;
  const m = await ignoreNotFound(
    clients.core.readNamespacedSecret({ name: mirrorName(key.identity), namespace: key.namespace }),
  );
  // Only a mirror of an identity that is not inert reaches here, so no secretRef can match it.
  if (!m || !isOurs(m as SecretLike, key.identity, undefined) || !isCurrent(m as SecretLike, hash)) return false;
  return (m.metadata?.ownerReferences ?? []).some(
    (r) => r.uid === owner.uid && r.kind === owner.kind && r.name === owner.name,
  );
}
