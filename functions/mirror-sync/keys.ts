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
import { isDns1123Subdomain, isNamespaceAllowed } from '../lib/allowed-namespaces.ts';
import {
  GROUP,
  IDENTITY_PLURAL,
  VERSION,
  type Consumer,
  type ConsumerKind,
  type TerraformClusterIdentity,
} from '../lib/api.ts';
import type { ObjectRef } from '../lib/cloudevents.ts';
import { consumersOfIdentity, findConsumerKind, listConsumers, pageSize } from '../lib/consumers.ts';
import { ignoreNotFound, listAllPages, type Clients } from '../lib/kube.ts';
import pLimit from 'p-limit';
import { ANNOTATION_IDENTITY, LABEL_MIRRORED, isOurs, mirrorName, sameOwner } from '../lib/mirror.ts';
import type { ConsumerName, MirrorKey, Snapshot } from './decide.ts';
import { readIdentity, readNamespace, readSource, type Seed } from './observe.ts';

/** One key to reconcile for an event. */
export interface KeyWork {
  key: MirrorKey;
  scope: Snapshot['scope'];
  seed?: Seed;
  /** Known (from the seed) to lose its mirror: reconciled before the others (SPEC §7). */
  revoking?: boolean;
}

/** A consumer event's lookups: its keys, and the consumer as read (undefined when gone). */
export interface ConsumerKeys {
  keys: KeyWork[];
  consumer: Consumer | undefined;
}

const MIRRORS = `${LABEL_MIRRORED}=true`;

/** Mirrors (by label) in one namespace, with data. */
async function mirrorsIn(clients: Clients, namespace: string): Promise<V1Secret[]> {
  return (
    await listAllPages((cont) =>
      clients.core.listNamespacedSecret({ namespace, labelSelector: MIRRORS, limit: pageSize(), _continue: cont }),
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
 * The keys' consumers are read again by the reconcile, after the mirror.
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
  if (!kind || !ref.namespace) return { keys: [], consumer: undefined };
  const namespace = ref.namespace;
  const name: ConsumerName = { apiVersion: `${kind.group}/${kind.version}`, kind: kind.kind, name: ref.name };
  const found = await ignoreNotFound(
    clients.custom.getNamespacedCustomObject({
      group: kind.group,
      version: kind.version,
      plural: kind.plural,
      namespace,
      name: ref.name,
    }),
  );
  const consumer = found ? { ...(found as Consumer), apiVersion: name.apiVersion, kind: kind.kind } : undefined;
  const identity = consumer?.spec?.identityRef?.name;
  const keys: KeyWork[] = [];
  if (consumer && identity && isDns1123Subdomain(identity)) keys.push({ key: { namespace, identity }, scope: [name] });
  if (consumer && !mayHaveMoved(consumer, verb)) return { keys, consumer };
  for (const m of await mirrorsIn(clients, namespace)) {
    const other = m.metadata?.annotations?.[ANNOTATION_IDENTITY];
    // Only that identity's mirror by name: a look-alike Secret is never taken for one (SPEC §3).
    if (!other || other === identity || !isOurs(m, other) || m.metadata?.name !== mirrorName(other)) continue;
    if (!(m.metadata?.ownerReferences ?? []).some((r) => sameOwner(r, { ...name, uid: '' }))) continue;
    keys.push({ key: { namespace, identity: other }, scope: [name], seed: { mirror: m } });
  }
  return { keys, consumer };
}

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
    listAllPages((cont) =>
      clients.core.listSecretForAllNamespaces({
        fieldSelector: `metadata.name=${mirrorName(identityName)}`,
        limit: pageSize(),
        _continue: cont,
      }),
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
  const source = identity && byNamespace.size > 0 ? await readSource(clients, identity) : undefined;
  return [...byNamespace].map(([namespace, e]) => {
    const ns = namespaces?.get(namespace);
    return {
      key: { namespace, identity: identityName },
      scope: 'all' as const,
      seed: {
        identity: identity ?? null,
        consumers: e.consumers,
        mirror: e.mirror,
        ...(source ? { source } : {}),
        ...(ns !== undefined ? { namespace: ns } : {}),
      },
      revoking:
        !identity ||
        !isNamespaceAllowed(identity.spec?.allowedNamespaces, { name: namespace, labels: ns?.labels ?? {} }),
    };
  });
}

/** Reads namespaces (a few at a time); `null` for one that does not exist. */
async function readNamespaces(
  clients: Clients,
  names: readonly string[],
): Promise<Map<string, { labels?: Record<string, string> | undefined } | null>> {
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
  const byIdentity = new Map<string, { consumers: Consumer[]; mirror: V1Secret | null }>();
  const entry = (id: string) => byIdentity.get(id) ?? byIdentity.set(id, { consumers: [], mirror: null }).get(id)!;
  const unkeyed: Consumer[] = [];
  for (const c of consumers) {
    const id = c.spec?.identityRef?.name;
    if (id && isDns1123Subdomain(id)) entry(id).consumers.push(c);
    else unkeyed.push(c);
  }
  for (const m of mirrors) {
    const id = m.metadata?.annotations?.[ANNOTATION_IDENTITY];
    if (id && isOurs(m, id) && m.metadata?.name === mirrorName(id)) entry(id).mirror = m;
  }
  const limit = pLimit(8);
  const keys = await Promise.all(
    [...byIdentity].map(([identity, e]) =>
      limit(async (): Promise<KeyWork> => {
        const idObj = await readIdentity(clients, identity);
        const allowed = Boolean(
          idObj && ns && isNamespaceAllowed(idObj.spec?.allowedNamespaces, { name: namespace, labels: ns.labels }),
        );
        return {
          key: { namespace, identity },
          scope: 'all',
          seed: { consumers: e.consumers, mirror: e.mirror, identity: idObj ?? null, namespace: ns ?? null },
          revoking: !allowed,
        };
      }),
    ),
  );
  return { keys, unkeyed };
}

/**
 * Keys of a source Secret (SPEC §8 fast path): the keys of every identity whose
 * `spec.secretRef` names it.
 * @throws API errors of the lookups.
 */
export async function keysForSecret(
  clients: Clients,
  kinds: readonly ConsumerKind[],
  namespace: string,
  name: string,
): Promise<KeyWork[]> {
  const identities = await listAllPages(
    (cont) =>
      clients.custom.listClusterCustomObject({
        group: GROUP,
        version: VERSION,
        plural: IDENTITY_PLURAL,
        limit: pageSize(),
        _continue: cont,
      }) as Promise<{ items?: TerraformClusterIdentity[] }>,
  );
  const users = identities.items.filter(
    (i) => i.spec?.secretRef?.namespace === namespace && i.spec.secretRef.name === name,
  );
  return (await Promise.all(users.map((i) => keysForIdentity(clients, kinds, i.metadata.name!)))).flat();
}
