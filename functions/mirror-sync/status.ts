/**
 * Writes a consumer's conditions (SPEC §4, §16): server-side apply to the status
 * subresource with field manager `captf-credentials`, only when something changed (and a
 * pinned JSON patch for an owned condition the apply could not remove), and one Kubernetes
 * Event (events.k8s.io/v1) per write naming every change, its reason that of the most
 * significant change (one Event even when reconciles of the same object race, see {@link eventName}).
 */
import { createHash } from 'node:crypto';
import { hostname } from 'node:os';
import type { Consumer, ConsumerKind } from '../lib/api.ts';
import type { ConditionInput } from '../lib/conditions.ts';
import {
  apiStatus,
  describeError,
  ignoreNotFound,
  isConflict,
  isNotFound,
  redactApiError,
  RedactedApiError,
  type Clients,
} from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import { Conflict } from './errors.ts';
import { consumerObjects, type CustomObjects, type JsonPatchOp, type ObjectAddress } from '../lib/objects.ts';
import { planConditions, strayConditions, typesClaimedByOthers } from '../lib/conditions.ts';

/** The `metav1.CauseType`s of an API error's Status (none for other errors). */
const causesOf = (err: unknown): readonly string[] => {
  const r = redactApiError(err);
  return r instanceof RedactedApiError ? r.causes : [];
};

/**
 * A JSON patch `test` failed: the object is not what was seen. The API server answers 422
 * without causes ("the server rejected our request due to an error in our request"); a 422
 * from validation names its causes.
 */
const failedPin = (err: unknown): boolean => apiStatus(err) === 422 && causesOf(err).length === 0;

/** `reportingController` of the Events this function records. */
const REPORTING_CONTROLLER = 'captf.io/mirror-sync';

/** The consumer whose conditions are written, with its configured kind. */
export interface ConditionTarget {
  kind: ConsumerKind;
  consumer: Consumer;
}

/** The clock (lastTransitionTime, Event times) and the logger for Event failures. */
export interface WriteContext {
  now: Date;
  logger: Logger;
}

/** Namespace of Events about cluster-scoped objects (kubectl's convention). */
const CLUSTER_EVENTS_NAMESPACE = 'default';

/**
 * Applies the desired owned conditions to the consumer's status when they differ from what it has.
 * A cluster-scoped consumer (no namespace) is patched at cluster scope.
 *
 * The apply carries the resourceVersion the decision read (the API server offers no UID or
 * generation precondition for an apply to a custom resource's status: its status strategy keeps
 * the stored metadata), so conditions decided for one state never land on a later one — a
 * consumer recreated under its name or switched to another identity, or a newer decision (a
 * revocation) written meanwhile. A 409 is settled with one read (SPEC §4): when the consumer is
 * still the object and generation decided for and already carries these conditions (another
 * instance wrote them), the write is done; otherwise a {@link Conflict} decides the key again.
 * @param target the consumer as read (its conditions are compared; nothing is written when equal).
 * @returns whether this call wrote. @throws Conflict (above); API errors other than 404 (the
 *   object is gone: nothing to write).
 */
export async function writeConditions(
  clients: Clients,
  target: ConditionTarget,
  desired: readonly ConditionInput[],
  ctx: WriteContext,
): Promise<boolean> {
  const { kind, consumer } = target;
  const plan = conditionPlan(consumer, desired, ctx.now);
  if (!plan.changed) return false;
  const { name, namespace, resourceVersion } = consumer.metadata;
  const metadata = { name, ...(namespace ? { namespace } : {}), ...(resourceVersion ? { resourceVersion } : {}) };
  const objects = consumerObjects(clients, kind);
  let applied: Consumer;
  try {
    applied = await objects.applyStatus({ metadata, status: { conditions: plan.owned } });
  } catch (err) {
    if (isNotFound(err)) return false;
    if (isConflict(err)) return settleConflict(objects, consumer, desired);
    throw err;
  }
  await removeWhatApplyLeft(objects, { at: { name: name!, namespace }, applied, desired }, ctx);
  if (plan.changedInputs.length) await recordEvent(clients, target, plan.changedInputs, ctx);
  return true;
}

/**
 * After a 409 on a condition write: is the consumer still the object and generation decided for,
 * and does it already carry the desired conditions (status, reason, message, observedGeneration;
 * none of ours left over)? Then another instance wrote the same decision: nothing to do.
 * @returns false (this call wrote nothing). @throws Conflict otherwise; API errors of the read.
 */
async function settleConflict(
  objects: CustomObjects<Consumer>,
  decided: Consumer,
  desired: readonly ConditionInput[],
): Promise<false> {
  const { name, namespace, uid, generation } = decided.metadata;
  const now = await ignoreNotFound(objects.get({ name: name!, namespace }));
  if (!now) return false;
  const same = now.metadata.uid === uid && now.metadata.generation === generation;
  if (same && !conditionPlan(now, desired, new Date()).changed) return false;
  throw new Conflict(`consumer ${namespace ?? ''}/${name} changed since it was read`);
}

/**
 * The condition write a consumer needs: what {@link writeConditions} applies and the resync
 * counts as work. Our types another controller also claims (its `managedFields`) are kept.
 */
export function conditionPlan(
  consumer: Consumer,
  desired: readonly ConditionInput[],
  now: Date,
): ReturnType<typeof planConditions> {
  const keep = typesClaimedByOthers(consumer.metadata.managedFields);
  return planConditions(consumer.status?.conditions, desired, now, { keep });
}

/**
 * The apply's own answer says whether it removed what it left out (see strayConditions): what
 * is still there, claimed by no other manager, goes by {@link removeStray}. An answer without a
 * resourceVersion or a conditions list is not acted on.
 */
async function removeWhatApplyLeft(
  objects: CustomObjects<Consumer>,
  r: { at: ObjectAddress; applied: Consumer | undefined; desired: readonly ConditionInput[] },
  ctx: WriteContext,
): Promise<void> {
  const { at, applied, desired } = r;
  const keep = typesClaimedByOthers(applied?.metadata?.managedFields);
  const stray = strayConditions(applied?.status?.conditions, desired, { keep });
  const resourceVersion = applied?.metadata?.resourceVersion;
  if (stray.length && typeof resourceVersion === 'string' && resourceVersion)
    await removeStray(objects, { at, resourceVersion }, stray, ctx);
}

/**
 * Removes owned conditions an apply could not remove (co-owned only by the reset manager), by a
 * JSON patch pinned to the resourceVersion the apply returned and to each condition's type at
 * its index: it removes exactly what was seen, or nothing. A failed pin (the object changed
 * since: 422 without causes) is left to the reconcile that change brings; another refusal is a
 * warning; other API errors are thrown.
 */
async function removeStray(
  objects: CustomObjects<Consumer>,
  seen: { at: ObjectAddress; resourceVersion: string },
  stray: readonly { index: number; type: string }[],
  ctx: WriteContext,
): Promise<void> {
  const { at, resourceVersion } = seen;
  const { name, namespace } = at;
  const ops: JsonPatchOp[] = [{ op: 'test', path: '/metadata/resourceVersion', value: resourceVersion }];
  for (const s of stray)
    ops.push(
      { op: 'test', path: `/status/conditions/${s.index}/type`, value: s.type },
      { op: 'remove', path: `/status/conditions/${s.index}` },
    );
  const fields = { object: `${namespace ?? ''}/${name}`, types: stray.map((s) => s.type) };
  try {
    await objects.patchStatus(at, ops);
  } catch (err) {
    if (isNotFound(err) || failedPin(err))
      ctx.logger.info('stray conditions not removed: the object changed meanwhile', fields);
    else if (apiStatus(err) === 422)
      ctx.logger.warn('stray conditions not removed: the API server refused', { ...fields, error: describeError(err) });
    else throw err;
    return;
  }
  ctx.logger.info('stray conditions removed', fields);
}

/**
 * SPEC §4: the changes an Event tells, most significant first — a False before an Unknown
 * before a True (what went wrong is what a person must see); within one status the later
 * condition first, as decisions list a consumer's conditions upstream to downstream
 * (`IdentityAllowed` before `CredentialsMirrored`), so the first names the outcome (`Mirrored`).
 */
export function eventChanges(changes: readonly ConditionInput[]): ConditionInput[] {
  const rank = (c: ConditionInput) => (c.status === 'False' ? 0 : c.status === 'Unknown' ? 1 : 2);
  return [...changes].reverse().sort((a, b) => rank(a) - rank(b));
}

/**
 * Records the one Event of a condition write: reason = the most significant change's reason,
 * the note names every change. Failures are logged, never fatal: an Event is a courtesy to
 * humans, the condition is the contract.
 */
async function recordEvent(
  clients: Clients,
  target: ConditionTarget,
  changes: readonly ConditionInput[],
  ctx: WriteContext,
): Promise<void> {
  const { kind, consumer } = target;
  const { name, namespace, uid } = consumer.metadata;
  const ordered = eventChanges(changes);
  const first = ordered[0]!;
  try {
    await clients.events.createNamespacedEvent({
      namespace: namespace || CLUSTER_EVENTS_NAMESPACE,
      body: {
        metadata: { name: eventName(consumer, ordered) },
        // metav1.MicroTime needs six fractional digits; a Date would serialise with three.
        eventTime: ctx.now.toISOString().replace(/\.(\d{3})Z$/, '.$1000Z') as unknown as Date,
        reportingController: REPORTING_CONTROLLER,
        reportingInstance: hostname().slice(0, 128),
        action: 'Reconcile',
        reason: first.reason,
        note: ordered
          .map((c) => `${c.type}=${c.status}: ${c.message}`)
          .join('; ')
          .slice(0, 1024),
        type: ordered.every((c) => c.status === 'True') ? 'Normal' : 'Warning',
        regarding: { apiVersion: `${kind.group}/${kind.version}`, kind: kind.kind, name, namespace, uid },
      },
    });
  } catch (err) {
    // 409: a concurrent reconcile of the same object recorded this very change already.
    if (isConflict(err)) return;
    // A namespace being deleted takes no new Events; its objects go with it, and the
    // condition already says so: nothing a person must look at.
    const level = causesOf(err).includes('NamespaceTerminating') ? 'info' : 'warn';
    ctx.logger[level]('could not record event', {
      object: `${namespace ?? ''}/${name}`,
      reason: first.reason,
      error: describeError(err),
    });
  }
}

/**
 * Event name `<object>.<16 hex>`, the hex derived from the object's UID and the
 * resourceVersion the reconcile read, plus the changes: reconciles racing on one object
 * that saw the same state record the same change under the same name, so the API server
 * keeps one (the second create answers 409); a later change always reads a newer
 * resourceVersion. Within 253 characters.
 */
function eventName(obj: Consumer, changes: readonly ConditionInput[]): string {
  const told = changes.map((c) => [c.type, c.status, c.reason, c.message, c.observedGeneration ?? null]);
  const digest = createHash('sha256')
    .update(JSON.stringify([obj.metadata.uid, obj.metadata.resourceVersion, told]))
    .digest('hex')
    .slice(0, 16);
  return `${obj.metadata.name!.slice(0, 220)}.${digest}`;
}
