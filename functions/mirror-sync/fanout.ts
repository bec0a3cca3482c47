/**
 * SPEC §7, §8, §12: which consumers an event concerns. An event about a consumer names
 * itself; one about an identity fans out to the identity's consumers (field selector on
 * `spec.identityRef.name`); one about a namespace to every consumer in it; one about a
 * labelled source Secret (opt-in fast path) to the consumers of every identity using it.
 */
import pLimit from 'p-limit';
import { GROUP, IDENTITY_PLURAL, VERSION, type ConsumerKind, type TerraformClusterIdentity } from '../lib/api.ts';
import type { EventRequest } from '../lib/cloudevents.ts';
import { consumersOfIdentity, findConsumerKind, listConsumers, PAGE_SIZE } from '../lib/consumers.ts';
import type { Clients } from '../lib/kube.ts';
import { reconcileConsumer, type ConsumerRequest, type ReconcileDeps, type ReconcileResult } from './reconcile.ts';

/** Label that opts a source Secret into the rotation fast path (SPEC §8). */
export const SOURCE_LABEL = 'captf.io/identity-source';

/** An ApiServerSource event (already classified). */
export type ObjectEvent = Extract<EventRequest, { type: 'object' }>;

/**
 * The consumers to reconcile for one object event.
 * @param opts.sourceSecretEvents whether the Secret fast path is on (SPEC §8, off by default).
 * @returns consumer requests (may be empty). @throws API errors of the lookups.
 */
export async function consumersFor(clients: Clients, kinds: readonly ConsumerKind[], ev: ObjectEvent, opts: { sourceSecretEvents: boolean }): Promise<ConsumerRequest[]> {
  const { ref } = ev;
  const toRequest = (k: ConsumerKind, c: { metadata: { namespace?: string; name?: string; uid?: string } }): ConsumerRequest => ({
    kind: k, namespace: c.metadata.namespace!, name: c.metadata.name!, uid: c.metadata.uid,
  });
  switch (ev.target) {
    case 'consumer': {
      const kind = findConsumerKind(kinds, ref.apiVersion, ref.kind)!;
      if (!ref.namespace) return [];
      return [{ kind, namespace: ref.namespace, name: ref.name, uid: ref.uid }];
    }
    case 'identity':
      return (await consumersOfIdentity(clients, kinds, ref.name)).map((c) => toRequest(findConsumerKind(kinds, c.apiVersion!, c.kind!)!, c));
    case 'namespace': {
      const out: ConsumerRequest[] = [];
      for (const k of kinds) for await (const c of listConsumers(clients, k, { namespace: ref.name })) out.push(toRequest(k, c));
      return out;
    }
    case 'secret': {
      if (!opts.sourceSecretEvents || !ref.namespace) return [];
      if (ev.labels && ev.labels[SOURCE_LABEL] !== 'true') return [];
      const out: ConsumerRequest[] = [];
      for (const id of await identitiesUsingSecret(clients, ref.namespace, ref.name)) {
        for (const c of await consumersOfIdentity(clients, kinds, id)) out.push(toRequest(findConsumerKind(kinds, c.apiVersion!, c.kind!)!, c));
      }
      return out;
    }
    default:
      return [];
  }
}

/** Names of identities whose `spec.secretRef` is `namespace/name` (paginated list). */
async function identitiesUsingSecret(clients: Clients, namespace: string, name: string): Promise<string[]> {
  const out: string[] = [];
  let cont: string | undefined;
  do {
    const page = (await clients.custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, limit: PAGE_SIZE, _continue: cont })) as {
      items?: TerraformClusterIdentity[];
      metadata?: { continue?: string };
    };
    for (const i of page.items ?? []) if (i.spec?.secretRef?.namespace === namespace && i.spec.secretRef.name === name) out.push(i.metadata.name!);
    cont = page.metadata?.continue || undefined;
  } while (cont);
  return out;
}

/**
 * Reconciles many consumers with at most `concurrency` in flight.
 * @returns one result per request, in order.
 */
export function reconcileAll(deps: ReconcileDeps, requests: readonly ConsumerRequest[], concurrency: number): Promise<ReconcileResult[]> {
  const limit = pLimit(Math.max(1, concurrency));
  return Promise.all(requests.map((r) => limit(() => reconcileConsumer(deps, r))));
}
