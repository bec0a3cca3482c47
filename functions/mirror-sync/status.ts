/**
 * Writes a consumer's conditions (SPEC §4, §16): server-side apply to the status
 * subresource with field manager `captf-credentials`, only when something changed, and a
 * Kubernetes Event (events.k8s.io/v1) per changed condition with reason = condition reason
 * (one per change even when reconciles of the same object race, see {@link eventName}).
 */
import { createHash } from 'node:crypto';
import { hostname } from 'node:os';
import { PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import { FIELD_MANAGER, type Consumer, type ConsumerKind } from '../lib/api.ts';
import type { ConditionInput } from '../lib/conditions.ts';
import { describeError, isConflict, isNotFound, type Clients } from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import { planConditions } from '../lib/conditions.ts';

/** `reportingController` of the Events this function records. */
export const REPORTING_CONTROLLER = 'captf.io/mirror-sync';

/**
 * Applies the desired owned conditions to `obj`'s status when they differ from what it has.
 * @param obj the consumer as just read (its conditions are compared; nothing is written when equal).
 * @returns whether a write happened. API errors other than 404 (object gone meanwhile) are thrown.
 */
export async function writeConditions(
  clients: Clients,
  kind: ConsumerKind,
  obj: Consumer,
  desired: readonly ConditionInput[],
  now: Date,
  logger: Logger,
): Promise<boolean> {
  const plan = planConditions(obj.status?.conditions, desired, now);
  if (!plan.changed) return false;
  const { name, namespace } = obj.metadata;
  try {
    await clients.custom.patchNamespacedCustomObjectStatus(
      {
        group: kind.group,
        version: kind.version,
        plural: kind.plural,
        namespace: namespace!,
        name: name!,
        fieldManager: FIELD_MANAGER,
        force: true,
        body: {
          apiVersion: `${kind.group}/${kind.version}`,
          kind: kind.kind,
          metadata: { name, namespace },
          status: { conditions: plan.owned },
        },
      },
      setHeaderOptions('Content-Type', PatchStrategy.ServerSideApply),
    );
  } catch (err) {
    if (isNotFound(err)) return false;
    throw err;
  }
  await Promise.all(plan.changedInputs.map((c) => recordEvent(clients, kind, obj, c, now, logger)));
  return true;
}

/**
 * Records one Event about a condition change. Failures are logged, never fatal: an Event is
 * a courtesy to humans, the condition is the contract.
 */
async function recordEvent(
  clients: Clients,
  kind: ConsumerKind,
  obj: Consumer,
  c: ConditionInput,
  now: Date,
  logger: Logger,
): Promise<void> {
  const { name, namespace, uid } = obj.metadata;
  try {
    await clients.events.createNamespacedEvent({
      namespace: namespace!,
      body: {
        metadata: { name: eventName(obj, c) },
        // metav1.MicroTime needs six fractional digits; a Date would serialise with three.
        eventTime: now.toISOString().replace(/\.(\d{3})Z$/, '.$1000Z') as unknown as Date,
        reportingController: REPORTING_CONTROLLER,
        reportingInstance: hostname().slice(0, 128),
        action: 'Reconcile',
        reason: c.reason,
        note: `${c.type}=${c.status}: ${c.message}`.slice(0, 1024),
        type: c.status === 'True' ? 'Normal' : 'Warning',
        regarding: { apiVersion: `${kind.group}/${kind.version}`, kind: kind.kind, name, namespace, uid },
      },
    });
  } catch (err) {
    // 409: a concurrent reconcile of the same object recorded this very change already.
    if (isConflict(err)) return;
    logger.warn('could not record event', {
      object: `${namespace}/${name}`,
      reason: c.reason,
      error: describeError(err),
    });
  }
}

/**
 * Event name `<object>.<16 hex>`, the hex derived from the object's UID and the
 * resourceVersion the reconcile read, plus the condition: reconciles racing on one object
 * that saw the same state record the same change under the same name, so the API server
 * keeps one (the second create answers 409); a later change always reads a newer
 * resourceVersion. Within 253 characters.
 */
export function eventName(obj: Consumer, c: ConditionInput): string {
  const digest = createHash('sha256')
    .update(
      JSON.stringify([
        obj.metadata.uid,
        obj.metadata.resourceVersion,
        c.type,
        c.status,
        c.reason,
        c.message,
        c.observedGeneration ?? null,
      ]),
    )
    .digest('hex')
    .slice(0, 16);
  return `${obj.metadata.name!.slice(0, 220)}.${digest}`;
}
