/**
 * SPEC §7, §12: which mirror keys an event concerns, found with a few reads whose results
 * seed the keys' snapshots:
 * - a consumer → its identity's key, plus the key of any mirror in its namespace that still
 *   lists it as an owner by kind and name (it switched identities or is gone; Reference-mode
 *   events carry no UID);
 * - an identity → the keys of every namespace where it has consumers or a mirror (by name);
 * - a namespace → the keys of every identity used or mirrored there;
 * - a labelled source Secret (opt-in fast path) → the keys of the identities that use it.
 */
import type { V1Secret } from '@kubernetes/client-node';
import { isDns1123Subdomain } from '../lib/allowed-namespaces.ts';
import type { Consumer, ConsumerKind, TerraformClusterIdentity } from '../lib/api.ts';
import type { ObjectRef } from '../lib/cloudevents.ts';
import { consumersOfIdentity, findConsumerKind, listConsumers, pageSize } from '../lib/consumers.ts';
import { ignoreNotFound, listAllPages, type Clients } from '../lib/kube.ts';
import { consumerObjects } from '../lib/objects.ts';
import pLimit from 'p-limit';
import {
  ANNOTATION_IDENTITY,
  LABEL_MIRRORED,
  isOurs,
  isReservedSourceName,
  mirrorName,
  sameOwner,
} from '../lib/mirror.ts';
import { mayHoldMirror, type ConsumerName, type NamespaceState, type SourceState } from './decide.ts';
import { identitiesUsingSecret, readIdentity, readNamespace, readSource, type KeyWork } from './observe.ts';

export type { KeyWork } from './observe.ts';

/** A consumer event's lookups: its keys, and the consumer as read (undefined when gone). */
export interface ConsumerKeys {
  keys: KeyWork[];
  consumer: Consumer | undefined;
}

const MIRRORS = `${LABEL_MIRRORED}=true`;

/** Mirrors (by label) in one namespace, with data. */
async function mirrorsIn(clients: Clients, namespace: string): Promise<V1Secret[]> {
  return (
    await listAllPages(
      (cont) =>
        clients.core.listNamespacedSecret({ namespace, labelSelector: MIRRORS, limit: pageSize(), _continue: cont }),
      clients.logger,
    )
  ).items;
}

/**
 * Whether a live consumer may still be an owner of another identity's mirror: unless our own
 * conditions on it were decided for its current generation (its spec, and so its identity,
 * has not changed since we last decided it) — or the event says it was just added.
 */
function mayHaveMoved(consumer: Consumer, verb: 'add' | 'update' | 'delete'): boolean {
  if (verb === 'add') return false;
  const ours = (consumer.status?.conditions ?? []).filter((c) => c.type === 'IdentityAllowed');
  return ours.length === 0 || ours.some((c) => c.observedGeneration !== consumer.metadata.generation);
}

/**
 * Keys of a consumer event: its identity's key, plus — when it is gone or its spec changed
 * since we last decided it — the key of any mirror in its namespace that still lists it as an
 * owner by kind and name. The hot path (a consumer's own add, or the echo of our status
 * write) is one GET: a LIST on a busy API server can wait for its watch cache (up to 100 ms).
 * The keys' consumers are read again by the reconcile, after the mirror. A cluster-scoped
 * consumer (no namespace) has no key (SPEC §2, §4): it is returned for its conditions alone.
 * @param verb the event's verb (`update` for prepare).
 * @throws API errors of the lookups.
 */
export async function keysForConsumer(
  clients: Clients,
  kinds: readonly ConsumerKind[],
  ref: ObjectRef,
  verb: 'add' | 'update' | 'delete' = 'update',
): Promise<ConsumerKeys> {
  const kind = findConsumerKind(kinds, ref.apiVersion, ref.kind);
  if (!kind) return { keys: [], consumer: undefined };
  const consumer = await readConsumer(clients, kind, ref);
  if (!ref.namespace) return { keys: [], consumer };
  const namespace = ref.namespace;
  const name: ConsumerName = { apiVersion: `${kind.group}/${kind.version}`, kind: kind.kind, name: ref.name };
  const identity = usableIdentity(consumer);
  const keys: KeyWork[] = identity ? [{ key: { namespace, identity }, scope: [name] }] : [];
  if (consumer && !mayHaveMoved(consumer, verb)) return { keys, consumer };
  keys.push(...(await formerMirrorKeys(clients, namespace, name, identity)));
  return { keys, consumer };
}

/** The identity a consumer names, when that can be an identity's name (else it has no key). */
function usableIdentity(consumer: Consumer | undefined): string | undefined {
  const id = consumer?.spec?.identityRef?.name;
  return id && isDns1123Subdomain(id) ? id : undefined;
}

/** GETs a consumer (cluster-scoped when `ref` has no namespace), typed with its kind; undefined when absent. */
async function readConsumer(clients: Clients, kind: ConsumerKind, ref: ObjectRef): Promise<Consumer | undefined> {
  return ignoreNotFound(consumerObjects(clients, kind).get(ref));
}

/** Keys of the namespace's mirrors of other identities that still list the consumer as an owner. */
async function formerMirrorKeys(
  clients: Clients,
  namespace: string,
  name: ConsumerName,
  identity: string | undefined,
): Promise<KeyWork[]> {
  const keys: KeyWork[] = [];
  for (const m of await mirrorsIn(clients, namespace)) {
    const other = m.metadata?.annotations?.[ANNOTATION_IDENTITY];
    // Only that identity's mirror by name: a look-alike Secret is never taken for one (SPEC §3).
    if (!other || other === identity || !isMirrorOf(m, other)) continue;
    if (!(m.metadata?.ownerReferences ?? []).some((r) => sameOwner(r, { ...name, uid: '' }))) continue;
    keys.push({ key: { namespace, identity: other }, scope: [name], seed: { mirror: m } });
  }
  return keys;
}

/**
 * Our labels and annotation, and the mirror's name for that identity (SPEC §3). It only finds
 * keys: the reconcile of each key decides ownership again with the identity's `secretRef`.
 */
const isMirrorOf = (m: V1Secret, identity: string): boolean =>
  isOurs(m, identity, undefined) && m.metadata?.name === mirrorName(identity);

/**
 * Keys of one identity: every namespace where it has consumers or a mirror, seeded with the
 * identity, its source (read once), each key's mirror and then its consumers, and (for a
 * selector) each namespace; keys that lose their mirror are marked to go first (SPEC §7).
 * @throws API errors of the lookups.
 */
export async function keysForIdentity(
  clients: Clients,
  kinds: readonly ConsumerKind[],
  identityName: string,
): Promise<KeyWork[]> {
  if (!isDns1123Subdomain(identityName)) return [];
  // Mirrors before consumers (SPEC §12), found by name so one without our labels' help
  // (made before the mirror-of label existed, or relabelled by hand) is found too.
  const [identity, mirrors] = await Promise.all([
    readIdentity(clients, identityName),
    listAllPages(
      (cont) =>
        clients.core.listSecretForAllNamespaces({
          fieldSelector: `metadata.name=${mirrorName(identityName)}`,
          limit: pageSize(),
          _continue: cont,
        }),
      clients.logger,
    ),
  ]);
  const consumers = await consumersOfIdentity(clients, kinds, identityName);
  const byNamespace = new Map<string, { consumers: Consumer[]; mirror: V1Secret | null }>();
  const entry = (ns: string) => byNamespace.get(ns) ?? byNamespace.set(ns, { consumers: [], mirror: null }).get(ns)!;
  for (const m of mirrors.items) entry(m.metadata!.namespace!).mirror = m;
  for (const c of consumers) entry(c.metadata.namespace!).consumers.push(c);
  const namespaces = identity?.spec?.allowedNamespaces?.selector
    ? await readNamespaces(clients, [...byNamespace.keys()])
    : undefined;
  const source = await sourceOnce(clients, identity, byNamespace.size);
  return [...byNamespace].map(([namespace, e]) => {
    const ns = namespaces?.get(namespace);
    const key = { namespace, identity: identityName };
    return {
      key,
      scope: 'all' as const,
      seed: {
        identity: identity ?? null,
        consumers: e.consumers,
        mirror: e.mirror,
        ...(source ? { source } : {}),
        ...(ns !== undefined ? { namespace: ns } : {}),
      },
      // Without a selector the namespaces were not read: the list alone decides.
      revoking: !mayHoldMirror(identity, key, ns ?? { labels: {} }),
    };
  });
}

/** The identity's source, read once for all its keys; not when it has none, or is inert (SPEC §3). */
async function sourceOnce(
  clients: Clients,
  identity: TerraformClusterIdentity | undefined,
  keys: number,
): Promise<SourceState | undefined> {
  const worth = identity && keys > 0 && !isReservedSourceName(identity.spec?.secretRef?.name);
  return worth ? readSource(clients, identity) : undefined;
}

/** Reads namespaces (a few at a time); `null` for one that does not exist. */
async function readNamespaces(clients: Clients, names: readonly string[]): Promise<Map<string, NamespaceState | null>> {
  const limit = pLimit(8);
  return new Map(
    await Promise.all(names.map((n) => limit(async () => [n, (await readNamespace(clients, n)) ?? null] as const))),
  );
}

/**
 * Keys of one namespace: every identity used (by a consumer) or mirrored there, seeded with the
 * mirror, then the consumers, the namespace and each identity; keys that lose their mirror
 * are marked to go first (SPEC §7). Consumers that name no usable identity are returned
 * apart, to have their conditions settled.
 * @throws API errors of the lookups.
 */
export async function keysForNamespace(
  clients: Clients,
  kinds: readonly ConsumerKind[],
  namespace: string,
): Promise<{ keys: KeyWork[]; unkeyed: Consumer[] }> {
  const [mirrors, ns] = await Promise.all([mirrorsIn(clients, namespace), readNamespace(clients, namespace)]);
  const consumers: Consumer[] = [];
  for (const k of kinds) for await (const c of listConsumers(clients, k, { namespace })) consumers.push(c);
  const { byIdentity, unkeyed } = groupByIdentity(consumers, mirrors);
  const limit = pLimit(8);
  const keys = await Promise.all(
    [...byIdentity].map(([identity, e]) =>
      limit(async (): Promise<KeyWork> => {
        const idObj = await readIdentity(clients, identity);
        const key = { namespace, identity };
        return {
          key,
          scope: 'all',
          seed: { consumers: e.consumers, mirror: e.mirror, identity: idObj ?? null, namespace: ns ?? null },
          revoking: !mayHoldMirror(idObj, key, ns),
        };
      }),
    ),
  );
  return { keys, unkeyed };
}

/** One namespace's consumers and mirrors by identity; consumers naming no usable identity apart. */
function groupByIdentity(
  consumers: readonly Consumer[],
  mirrors: readonly V1Secret[],
): { byIdentity: Map<string, { consumers: Consumer[]; mirror: V1Secret | null }>; unkeyed: Consumer[] } {
  const byIdentity = new Map<string, { consumers: Consumer[]; mirror: V1Secret | null }>();
  const entry = (id: string) => byIdentity.get(id) ?? byIdentity.set(id, { consumers: [], mirror: null }).get(id)!;
  const unkeyed: Consumer[] = [];
  for (const c of consumers) {
    const id = usableIdentity(c);
    if (id) entry(id).consumers.push(c);
    else unkeyed.push(c);
  }
  for (const m of mirrors) {
    const id = m.metadata?.annotations?.[ANNOTATION_IDENTITY];
    if (id && isMirrorOf(m, id)) entry(id).mirror = m;
  }
  return { byIdentity, unkeyed };
}

/**
 * Keys of a source Secret (SPEC §8 fast path): the keys of every identity whose
 * `spec.secretRef` names it (one field-selected list).
 * @throws API errors of the lookups.
 */
export async function keysForSecret(
  clients: Clients,
  kinds: readonly ConsumerKind[],
  namespace: string,
  name: string,
): Promise<KeyWork[]> {
  const users = await identitiesUsingSecret(clients, { namespace, name });
  return (await Promise.all(users.map((i) => keysForIdentity(clients, kinds, i)))).flat();
}
