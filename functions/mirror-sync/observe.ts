/**
 * SPEC §4 step 1: gathers the snapshot of one mirror key with fresh reads — nothing is
 * remembered between reconciles. Reads run in parallel over the process's connection pool;
 * a caller that has just read some of them (an event's or prepare's own lookups, keys.ts)
 * passes them as a seed instead of reading twice. Only reads; decides nothing.
 */
import { isDns1123Subdomain } from '../lib/allowed-namespaces.ts';
import {
  IDENTITY_REF_FIELD,
  SECRET_REF_FIELDS,
  type Consumer,
  type ConsumerKind,
  type TerraformClusterIdentity,
} from '../lib/api.ts';
import { findConsumerKind, listConsumers, pageSize } from '../lib/consumers.ts';
import { ignoreNotFound, isForbidden, listAllPages, type Clients } from '../lib/kube.ts';
import { consumerObjects, identities } from '../lib/objects.ts';
import { groupOf, mirrorName, namesSecret, sourceHash, type SecretLike } from '../lib/mirror.ts';
import type { V1Namespace } from '@kubernetes/client-node';
import {
  mayHoldMirror,
  type ConsumerName,
  type NamespaceState,
  type MirrorKey,
  type Snapshot,
  type SourceRead,
} from './decide.ts';

/**
 * Reads a caller already made for this key after the request arrived (each optional; `null`
 * = read and absent). For scope `all`, `consumers` may be seeded only together with `mirror`,
 * and only when they were read after it (a consumer created meanwhile is never taken for a
 * dead one). For a named scope they may be the named consumers as the event's lookup read them:
 * only their own owner references follow them, and a consumer that changes after that read
 * brings an event of its own (in this instance the key queue runs its reconcile after this one;
 * elsewhere the mirror's resourceVersion orders the writes, and a reference to a consumer
 * deleted meanwhile is dropped by the garbage collector or the resync).
 */
export interface Seed {
  identity?: TerraformClusterIdentity | null;
  namespace?: NamespaceState | null;
  source?: SourceRead;
  mirror?: Snapshot['mirror'] | null;
  /** The key's consumers as the scope asks for them. */
  consumers?: Consumer[];
}

/** One key to observe: which consumers to look at, and reads already made for it. */
export interface KeyWork {
  key: MirrorKey;
  scope: Snapshot['scope'];
  seed?: Seed;
}

/** GETs an identity; undefined when absent or when the name cannot be an object name. */
export async function readIdentity(clients: Clients, name: string): Promise<TerraformClusterIdentity | undefined> {
  // A name that is not a valid object name cannot exist, and must not reach a URL ("..").
  if (!isDns1123Subdomain(name)) return undefined;
  return ignoreNotFound(identities(clients).get({ name }));
}

/** GETs a namespace's labels and whether it is being deleted; undefined when it does not exist. */
export async function readNamespace(clients: Clients, name: string): Promise<NamespaceState | undefined> {
  const ns = await ignoreNotFound(clients.core.readNamespace({ name }));
  return ns ? namespaceState(ns) : undefined;
}

/**
 * A namespace that was not read: it exists (an object of the key is in it) and its labels
 * are unknown. Stands only where no label selector asks for them (an identity listing names).
 */
export const EXISTS: NamespaceState = Object.freeze({ labels: {} });

/** Every namespace, listed page by page, as decisions need them. @throws API errors of the list. */
export async function listNamespaces(clients: Clients): Promise<Map<string, NamespaceState>> {
  const list = await listAllPages(
    (cont) => clients.core.listNamespace({ limit: pageSize(), _continue: cont }),
    clients.logger,
  );
  return new Map(list.items.map((n) => [n.metadata!.name!, namespaceState(n)]));
}

/** What a decision needs of a namespace read or listed. */
function namespaceState(ns: V1Namespace): NamespaceState {
  const terminating = Boolean(ns.metadata?.deletionTimestamp) || ns.status?.phase === 'Terminating';
  return { labels: ns.metadata?.labels, ...(terminating ? { terminating } : {}) };
}

/**
 * GETs an identity's source Secret, uncached, so a rotation is seen at once (SPEC §4, §8).
 * @returns found (data and hash), missing (404) or unreadable (403); other errors are thrown.
 */
export async function readSource(clients: Clients, identity: TerraformClusterIdentity): Promise<SourceRead> {
  const ref = identity.spec.secretRef;
  const what = `source Secret ${ref.namespace}/${ref.name} of TerraformClusterIdentity ${identity.metadata.name}`;
  try {
    const s = await ignoreNotFound(clients.core.readNamespacedSecret({ name: ref.name, namespace: ref.namespace }));
    if (!s) return { state: 'missing', message: `${what} does not exist` };
    // A 200 that is not that Secret (a proxy's or load balancer's page parses as a string)
    // must never pass for a source without data: the mirror keeps its last good copy.
    if (!namesSecret(ref, s as SecretLike)) throw new Error(`the answer to the read of ${what} is not that Secret`);
    return { state: 'found', data: s.data ?? {}, hash: sourceHash(s.data) };
  } catch (err) {
    if (!isForbidden(err)) throw err;
    return { state: 'unreadable', message: `${what} is not readable by mirror-sync (403)` };
  }
}

/** Every consumer in `namespace` whose `spec.identityRef.name` is `identity` (one list per kind). */
async function listKeyConsumers(clients: Clients, kinds: readonly ConsumerKind[], key: MirrorKey): Promise<Consumer[]> {
  const out: Consumer[] = [];
  const fieldSelector = `${IDENTITY_REF_FIELD}=${key.identity}`;
  for (const kind of kinds)
    out.push(...(await listConsumers(clients, kind, { namespace: key.namespace, fieldSelector })));
  return out;
}

/**
 * Reads named consumers; returns those that exist and still name the key's identity. One name is
 * one GET; several (a coalesced follow-up's) are the key's list, filtered to those names — one
 * request per kind however many requests were folded into the follow-up.
 */
async function getKeyConsumers(
  clients: Clients,
  kinds: readonly ConsumerKind[],
  key: MirrorKey,
  names: readonly ConsumerName[],
): Promise<Consumer[]> {
  if (names.length > 1) {
    const wanted = new Set(names.map((n) => `${groupOf(n.apiVersion)}/${n.kind}/${n.name}`));
    const listed = await listKeyConsumers(clients, kinds, key);
    return listed.filter((c) => wanted.has(`${groupOf(c.apiVersion ?? '')}/${c.kind}/${c.metadata.name}`));
  }
  const found = await Promise.all(
    names.map(async (n): Promise<Consumer | undefined> => {
      const kind = findConsumerKind(kinds, n.apiVersion, n.kind);
      if (!kind) return undefined;
      return ignoreNotFound(consumerObjects(clients, kind).get({ namespace: key.namespace, name: n.name }));
    }),
  );
  return found.filter((c): c is Consumer => c !== undefined && c.spec?.identityRef?.name === key.identity);
}

/**
 * Names of the identities whose `spec.secretRef` is `namespace/name`: one list on the
 * identity CRD's selectable fields (the SPEC §8 fast path maps a source Secret's event to them).
 * @throws API errors of the list.
 */
export async function identitiesUsingSecret(
  clients: Clients,
  secret: { namespace: string; name: string },
): Promise<string[]> {
  const fieldSelector = `${SECRET_REF_FIELDS.namespace}=${secret.namespace},${SECRET_REF_FIELDS.name}=${secret.name}`;
  const objects = identities(clients);
  const list = await listAllPages(
    (cont) => objects.list({ fieldSelector, limit: pageSize(), _continue: cont }),
    clients.logger,
  );
  return list.items.map((i) => i.metadata.name!).sort();
}

/**
 * Reads everything that decides one key.
 * @param work the key, `scope` (`all` lists the key's consumers, or the consumers to look
 *   at by name) and `seed` (reads already made for this key after the request arrived).
 * @throws API errors other than 404 (and 403 on the source), for the caller to retry.
 */
export async function observe(
  clients: Clients,
  kinds: readonly ConsumerKind[],
  work: Pick<KeyWork, 'key' | 'scope' | 'seed'>,
): Promise<Snapshot> {
  const { key, scope, seed = {} } = work;
  const [identity, namespace, mirror] = await Promise.all([
    seeded(seed.identity, () => readIdentity(clients, key.identity)),
    seeded(seed.namespace, () => readNamespace(clients, key.namespace)),
    seeded(seed.mirror, () =>
      ignoreNotFound(clients.core.readNamespacedSecret({ name: mirrorName(key.identity), namespace: key.namespace })),
    ),
  ]);
  // The consumers are read after the mirror (SPEC §12): any owner reference the mirror holds
  // then belongs to a consumer that existed before the read, so a consumer that arrived
  // meanwhile is never taken for a dead one — its write changes the mirror's resourceVersion
  // and ours conflicts.
  const [consumers, source] = await Promise.all([
    seed.consumers ??
      (scope === 'all' ? listKeyConsumers(clients, kinds, key) : getKeyConsumers(clients, kinds, key, scope)),
    // The source matters only where a mirror may exist; a mirror-prefixed name is never read (SPEC §3).
    mayHoldMirror(identity, key, namespace) ? (seed.source ?? readSource(clients, identity)) : undefined,
  ]);
  return { key, identity, namespace, source, mirror: mirror as Snapshot['mirror'], consumers, scope };
}

/** A seeded read (`null` = read and absent), or a fresh one. */
async function seeded<T>(value: T | null | undefined, read: () => Promise<T | undefined>): Promise<T | undefined> {
  return value !== undefined ? (value ?? undefined) : read();
}
