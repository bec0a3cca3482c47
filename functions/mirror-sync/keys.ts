/**
 * SPEC §7, §12: what an event concerns, found with a few reads:
 * - a consumer → its identity's key (seeded with the consumer as read), plus the key of any
 *   mirror in its namespace that still lists it as an owner by kind and name (it switched
 *   identities or is gone; Reference-mode events carry no UID) — or nothing, for the echo of
 *   a decision already written;
 * - an identity → the lists of its pass (pass.ts): every namespace where it has consumers or
 *   a mirror;
 * - a namespace → the lists of its pass: every identity used or mirrored there.
 * A labelled source Secret (opt-in fast path) gets the passes of the identities using it.
 */
import type { V1Secret } from '@kubernetes/client-node';
import { isDns1123Subdomain } from '../lib/allowed-namespaces.ts';
import type { Consumer, ConsumerKind, TerraformClusterIdentity } from '../lib/api.ts';
import type { ObjectRef } from '../lib/cloudevents.ts';
import { consumersOfIdentity, findConsumerKind, listConsumers, pageSize } from '../lib/consumers.ts';
import { ignoreNotFound, listAllPages, type Clients } from '../lib/kube.ts';
import { consumerObjects } from '../lib/objects.ts';
import pLimit from 'p-limit';
import { ANNOTATION_IDENTITY, LABEL_MIRRORED, isOurs, mirrorName, sameOwner } from '../lib/mirror.ts';
import { decidedForGeneration, type ConsumerName } from './decide.ts';
import { listNamespaces, readIdentity, readNamespace, type KeyWork } from './observe.ts';
import type { Lists } from './pass.ts';

export type { KeyWork } from './observe.ts';

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

/** A consumer event's lookups: its keys, and the consumer as read (undefined when gone). */
interface ConsumerKeys {
  keys: KeyWork[];
  consumer: Consumer | undefined;
  /**
   * Set when the event was only the echo of a decision already written: our conditions on the
   * consumer were decided for its current generation (its spec, so its key, is unchanged), and
   * nothing about it needs a reconcile (SPEC §12: our own status writes must cost little).
   */
  decided?: true;
}

/**
 * Keys of a consumer event: its identity's key (seeded with the consumer as just read), plus —
 * when it is gone or its spec changed since we last decided it — the key of any mirror in its
 * namespace that still lists it as an owner by kind and name. The hot paths cost one GET: a
 * consumer's own add, and the echo of our status write, which with `opts.echo` ends there
 * ({@link ConsumerKeys.decided}). A cluster-scoped consumer (no namespace) has no key (SPEC §2,
 * §4): it is returned for its conditions alone.
 * @param opts.verb the event's verb (absent for prepare: then treated as an update).
 * @param opts.echo recognise an echo (events; `prepare` always reconciles).
 * @throws API errors of the lookups.
 */
export async function keysForConsumer(
  clients: Clients,
  kinds: readonly ConsumerKind[],
  ref: ObjectRef,
  opts: { verb?: 'add' | 'update' | 'delete'; echo?: boolean } = {},
): Promise<ConsumerKeys> {
  const kind = findConsumerKind(kinds, ref.apiVersion, ref.kind);
  if (!kind) return { keys: [], consumer: undefined };
  const consumer = await readConsumer(clients, kind, ref);
  if (consumer && opts.echo && decidedForGeneration(consumer)) return { keys: [], consumer, decided: true };
  if (!ref.namespace) return { keys: [], consumer };
  const namespace = ref.namespace;
  const name: ConsumerName = { apiVersion: `${kind.group}/${kind.version}`, kind: kind.kind, name: ref.name };
  const keys = ownKey(namespace, name, consumer);
  // A consumer just added, or decided for this generation, owns no other identity's mirror.
  if (consumer && (opts.verb === 'add' || decidedForGeneration(consumer))) return { keys, consumer };
  keys.push(...(await formerMirrorKeys(clients, namespace, name, usableIdentity(consumer))));
  return { keys, consumer };
}

/** The key of the identity a live consumer names, seeded with the consumer as read; none without one. */
function ownKey(namespace: string, name: ConsumerName, consumer: Consumer | undefined): KeyWork[] {
  const identity = usableIdentity(consumer);
  return identity ? [{ key: { namespace, identity }, scope: [name], seed: { consumers: [consumer!] } }] : [];
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
  isDns1123Subdomain(identity) && isOurs(m, identity, undefined) && m.metadata?.name === mirrorName(identity);

/**
 * The lists of one identity's pass (pass.ts): the identity, every Secret at its mirror's
 * name (listed by name, before the consumers, SPEC §12), its consumers (one field-selected
 * list per kind) and, when it selects namespaces by label, the namespaces (one list).
 * @throws API errors of the lists.
 */
export async function listsForIdentity(
  clients: Clients,
  kinds: readonly ConsumerKind[],
  identityName: string,
): Promise<Lists> {
  if (!isDns1123Subdomain(identityName))
    return { mirrors: [], consumers: [], identities: new Map(), namespaces: new Map() };
  // Found by name, so one without our labels' help (made before the mirror-of label existed,
  // or relabelled by hand) is found too, and so is a Secret in a mirror's way.
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
  return {
    mirrors: mirrors.items,
    consumers,
    identities: new Map(identity ? [[identityName, identity]] : []),
    namespaces: identity?.spec?.allowedNamespaces?.selector ? await listNamespaces(clients) : undefined,
    mirrorsByName: true,
  };
}

/**
 * The lists of one namespace's pass (pass.ts): its mirrors (by label, before the consumers),
 * the namespace, its consumers (one list per kind) and each identity used or mirrored there.
 * @throws API errors of the lookups.
 */
export async function listsForNamespace(
  clients: Clients,
  kinds: readonly ConsumerKind[],
  namespace: string,
): Promise<Lists> {
  const [mirrors, ns] = await Promise.all([mirrorsIn(clients, namespace), readNamespace(clients, namespace)]);
  const consumers: Consumer[] = [];
  for (const k of kinds) consumers.push(...(await listConsumers(clients, k, { namespace })));
  const limit = pLimit(8);
  const names = [...identitiesNamed(consumers, mirrors)];
  const found = await Promise.all(names.map((n) => limit(async () => [n, await readIdentity(clients, n)] as const)));
  return {
    mirrors,
    consumers,
    identities: new Map(found.filter((f): f is [string, TerraformClusterIdentity] => f[1] !== undefined)),
    namespaces: new Map(ns ? [[namespace, ns]] : []),
  };
}

/** The identities a namespace's consumers name or its mirrors belong to. */
function identitiesNamed(consumers: readonly Consumer[], mirrors: readonly V1Secret[]): Set<string> {
  const names = new Set<string>();
  for (const c of consumers) {
    const id = usableIdentity(c);
    if (id) names.add(id);
  }
  for (const m of mirrors) {
    const id = m.metadata?.annotations?.[ANNOTATION_IDENTITY];
    if (id && isMirrorOf(m, id)) names.add(id);
  }
  return names;
}
