/**
 * SPEC §7, §12: which mirror keys an event concerns, found with a few reads whose results
 * seed the keys' snapshots:
 * - a consumer → its identity's key, plus the key of any mirror in its namespace that still
 *   lists it as an owner by kind and name (it switched identities or is gone; Reference-mode
 *   events carry no UID);
 * - an identity → the keys of every namespace where it has consumers or a mirror;
 * - a namespace → the keys of every identity used or mirrored there;
 * - a labelled source Secret (opt-in fast path) → the keys of the identities that use it.
 */
import type { V1Secret } from '@kubernetes/client-node';
import { isDns1123Subdomain, isNamespaceAllowed } from '../lib/allowed-namespaces.ts';
import { GROUP, IDENTITY_PLURAL, VERSION, type Consumer, type ConsumerKind, type TerraformClusterIdentity } from '../lib/api.ts';
import type { ObjectRef } from '../lib/cloudevents.ts';
import { consumersOfIdentity, findConsumerKind, listConsumers, pageSize } from '../lib/consumers.ts';
import { ignoreNotFound, listAllPages, type Clients } from '../lib/kube.ts';
import { ANNOTATION_IDENTITY, LABEL_MIRRORED, LABEL_MIRROR_OF, isOurs, mirrorName, mirrorOfLabel, sameOwner } from '../lib/mirror.ts';
import type { ConsumerName, MirrorKey, Snapshot } from './decide.ts';
import { readIdentity, readSource, type Seed } from './observe.ts';

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

/** Mirrors (by label) in one namespace, with data: one of them is the key's mirror. */
async function mirrorsIn(clients: Clients, namespace: string): Promise<V1Secret[]> {
  return (await listAllPages((cont) => clients.core.listNamespacedSecret({ namespace, labelSelector: MIRRORS, limit: pageSize(), _continue: cont }))).items;
}

/**
 * Keys of a consumer event.
 * @param ref the consumer named by the event (namespace required; a cluster-scoped object has no key).
 * @throws API errors of the lookups.
 */
export async function keysForConsumer(clients: Clients, kinds: readonly ConsumerKind[], ref: ObjectRef): Promise<ConsumerKeys> {
  const kind = findConsumerKind(kinds, ref.apiVersion, ref.kind);
  if (!kind || !ref.namespace) return { keys: [], consumer: undefined };
  const namespace = ref.namespace;
  const name: ConsumerName = { apiVersion: `${kind.group}/${kind.version}`, kind: kind.kind, name: ref.name };
  const [found, mirrors] = await Promise.all([
    ignoreNotFound(clients.custom.getNamespacedCustomObject({ group: kind.group, version: kind.version, plural: kind.plural, namespace, name: ref.name })),
    mirrorsIn(clients, namespace),
  ]);
  const consumer = found ? ({ ...(found as Consumer), apiVersion: name.apiVersion, kind: kind.kind }) : undefined;
  const identity = consumer?.spec?.identityRef?.name;
  const keys: KeyWork[] = [];
  if (consumer && identity && isDns1123Subdomain(identity)) {
    const mirror = mirrors.find((m) => m.metadata?.name === mirrorName(identity));
    keys.push({ key: { namespace, identity }, scope: [name], seed: { consumers: [consumer], mirror: mirror ?? null } });
  }
  for (const m of mirrors) {
    const other = m.metadata?.annotations?.[ANNOTATION_IDENTITY];
    // Only that identity's mirror by name: a look-alike Secret is never taken for one (SPEC §3).
    if (!other || other === identity || !isOurs(m, other) || m.metadata?.name !== mirrorName(other)) continue;
    if (!(m.metadata?.ownerReferences ?? []).some((r) => sameOwner(r, { ...name, uid: '' }))) continue;
    keys.push({ key: { namespace, identity: other }, scope: [name], seed: { consumers: [], mirror: m } });
  }
  return { keys, consumer };
}

/** Could `namespace` be allowed? False only when the list form alone rules it out. */
function mayBeAllowed(identity: TerraformClusterIdentity | undefined, namespace: string): boolean {
  if (!identity) return false;
  const a = identity.spec?.allowedNamespaces;
  if (a?.selector) return true;
  return isNamespaceAllowed(a, { name: namespace, labels: {} });
}

/**
 * Keys of one identity: every namespace where it has consumers or a mirror (found by the
 * mirrors' identity label), seeded with the identity, its source (read once) and each key's
 * consumers and mirror.
 * @throws API errors of the lookups.
 */
export async function keysForIdentity(clients: Clients, kinds: readonly ConsumerKind[], identityName: string): Promise<KeyWork[]> {
  if (!isDns1123Subdomain(identityName)) return [];
  const [identity, consumers, mirrors] = await Promise.all([
    readIdentity(clients, identityName),
    consumersOfIdentity(clients, kinds, identityName),
    listAllPages((cont) => clients.core.listSecretForAllNamespaces({ labelSelector: `${MIRRORS},${LABEL_MIRROR_OF}=${mirrorOfLabel(identityName)}`, limit: pageSize(), _continue: cont })),
  ]);
  const byNamespace = new Map<string, { consumers: Consumer[]; mirror: V1Secret | null }>();
  const entry = (ns: string) => byNamespace.get(ns) ?? byNamespace.set(ns, { consumers: [], mirror: null }).get(ns)!;
  for (const c of consumers) entry(c.metadata.namespace!).consumers.push(c);
  for (const m of mirrors.items) if (m.metadata?.name === mirrorName(identityName)) entry(m.metadata.namespace!).mirror = m;
  const source = identity && byNamespace.size > 0 ? await readSource(clients, identity) : undefined;
  return [...byNamespace].map(([namespace, e]) => ({
    key: { namespace, identity: identityName },
    scope: 'all' as const,
    seed: { identity: identity ?? null, consumers: e.consumers, mirror: e.mirror, ...(source ? { source } : {}) },
    revoking: !mayBeAllowed(identity, namespace),
  }));
}

/**
 * Keys of one namespace: every identity used (by a consumer) or mirrored there, seeded with
 * each key's consumers and mirror.
 * @throws API errors of the lookups.
 */
export async function keysForNamespace(clients: Clients, kinds: readonly ConsumerKind[], namespace: string): Promise<KeyWork[]> {
  const consumers: Consumer[] = [];
  const [mirrors] = await Promise.all([
    mirrorsIn(clients, namespace),
    (async () => {
      for (const k of kinds) for await (const c of listConsumers(clients, k, { namespace })) consumers.push(c);
    })(),
  ]);
  const byIdentity = new Map<string, { consumers: Consumer[]; mirror: V1Secret | null }>();
  const entry = (id: string) => byIdentity.get(id) ?? byIdentity.set(id, { consumers: [], mirror: null }).get(id)!;
  for (const c of consumers) {
    const id = c.spec?.identityRef?.name;
    if (id && isDns1123Subdomain(id)) entry(id).consumers.push(c);
  }
  for (const m of mirrors) {
    const id = m.metadata?.annotations?.[ANNOTATION_IDENTITY];
    if (id && isOurs(m, id) && m.metadata?.name === mirrorName(id)) entry(id).mirror = m;
  }
  return [...byIdentity].map(([identity, e]) => ({ key: { namespace, identity }, scope: 'all' as const, seed: { consumers: e.consumers, mirror: e.mirror } }));
}

/**
 * Keys of a source Secret (SPEC §8 fast path): the keys of every identity whose
 * `spec.secretRef` names it.
 * @throws API errors of the lookups.
 */
export async function keysForSecret(clients: Clients, kinds: readonly ConsumerKind[], namespace: string, name: string): Promise<KeyWork[]> {
  const identities = await listAllPages((cont) => clients.custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, limit: pageSize(), _continue: cont }) as Promise<{ items?: TerraformClusterIdentity[] }>);
  const users = identities.items.filter((i) => i.spec?.secretRef?.namespace === namespace && i.spec.secretRef.name === name);
  return (await Promise.all(users.map((i) => keysForIdentity(clients, kinds, i.metadata.name!)))).flat();
}
