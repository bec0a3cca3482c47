/**
 * SPEC §6 and §7: letting go of mirrors. Every write is guarded by the mirror's
 * resourceVersion, so a mirror that just gained a new user is never deleted; conflicts
 * re-read and retry. A Secret that is not ours is never touched.
 */
import type { V1Secret } from '@kubernetes/client-node';
import { ANNOTATION_IDENTITY, LABEL_MIRRORED, isOurs, mirrorName, sameOwner } from '../lib/mirror.ts';
import { isConflict, isNotFound, redactApiError, retryOnConflict, type Clients } from '../lib/kube.ts';
import { planRelease, type IsConsumerRef } from './plan.ts';

/** An owner to release: uid optional (absent = any object of that group, kind and name). */
export interface OwnerKey {
  apiVersion: string;
  kind: string;
  name: string;
  uid?: string | undefined;
}

/** What a cleanup did to one mirror. */
export type CleanupAction = 'none' | 'released' | 'deleted';

async function readSecret(clients: Clients, namespace: string, name: string): Promise<V1Secret | undefined> {
  try {
    return await clients.core.readNamespacedSecret({ name, namespace });
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

/** Deletes a Secret with a resourceVersion (and uid) precondition; 404 counts as done. */
async function deleteWithPrecondition(clients: Clients, secret: V1Secret): Promise<void> {
  try {
    await clients.core.deleteNamespacedSecret({
      name: secret.metadata!.name!,
      namespace: secret.metadata!.namespace!,
      body: { preconditions: { resourceVersion: secret.metadata!.resourceVersion!, uid: secret.metadata!.uid! } },
    });
  } catch (err) {
    if (!isNotFound(err)) throw err;
  }
}

/**
 * Removes `owner`'s reference from one mirror; deletes the mirror when no consumer reference
 * would remain (SPEC §6).
 * @param name the mirror's name in `namespace`.
 * @returns what happened. @throws API errors other than 404/409 (409s are retried).
 */
export async function releaseMirror(clients: Clients, namespace: string, name: string, owner: OwnerKey, isConsumerRef: IsConsumerRef): Promise<CleanupAction> {
  return retryOnConflict(async () => {
    const mirror = await readSecret(clients, namespace, name);
    const identity = mirror?.metadata?.annotations?.[ANNOTATION_IDENTITY];
    if (!mirror || !identity || !isOurs(mirror, identity)) return 'none';
    const plan = planRelease(mirror, owner, isConsumerRef);
    if (plan.action === 'none') return 'none';
    if (plan.action === 'delete') {
      await deleteWithPrecondition(clients, mirror);
      return 'deleted';
    }
    mirror.metadata!.ownerReferences = plan.ownerReferences;
    try {
      await clients.core.replaceNamespacedSecret({ name, namespace, body: mirror });
    } catch (err) {
      throw redactApiError(err); // the body carried the mirror's data
    }
    return 'released';
  }, 20);
}

/**
 * Releases `owner` from every mirror in `namespace` that references it, except the mirror of
 * `keepIdentity` (the identity the consumer still uses).
 * @returns one entry per mirror touched.
 */
export async function releaseOwnerEverywhere(
  clients: Clients,
  namespace: string,
  owner: OwnerKey,
  isConsumerRef: IsConsumerRef,
  keepIdentity?: string,
): Promise<{ mirror: string; action: CleanupAction }[]> {
  const list = await clients.core.listNamespacedSecret({ namespace, labelSelector: `${LABEL_MIRRORED}=true` });
  const out: { mirror: string; action: CleanupAction }[] = [];
  for (const s of list.items) {
    const identity = s.metadata?.annotations?.[ANNOTATION_IDENTITY];
    if (!identity || identity === keepIdentity || !isOurs(s, identity)) continue;
    const refs = s.metadata?.ownerReferences ?? [];
    if (!refs.some((r) => sameOwner(r, { ...owner, uid: '' }) && (owner.uid === undefined || r.uid === owner.uid))) continue;
    out.push({ mirror: s.metadata!.name!, action: await releaseMirror(clients, namespace, s.metadata!.name!, owner, isConsumerRef) });
  }
  return out;
}

/**
 * SPEC §4 step 4 / §7: deletes the namespace's mirror of `identityName` if it is ours,
 * whoever references it (the namespace is no longer allowed, or the identity is gone).
 * @returns whether a mirror was deleted.
 */
export async function revokeMirror(clients: Clients, namespace: string, identityName: string): Promise<boolean> {
  for (let attempt = 1; ; attempt++) {
    const mirror = await readSecret(clients, namespace, mirrorName(identityName));
    if (!mirror || !isOurs(mirror, identityName)) return false;
    try {
      await deleteWithPrecondition(clients, mirror);
      return true;
    } catch (err) {
      if (!isConflict(err) || attempt >= 10) throw err;
    }
  }
}
