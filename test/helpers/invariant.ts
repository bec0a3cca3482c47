/**
 * The mirror invariant (SPEC §3, §4, §6), checked on the real API server for a set of
 * namespaces (other test files work elsewhere on the same control plane at the same time):
 * - every mirror's consumer owner references are exactly the live consumers (deleting ones
 *   included) naming its identity in its namespace, with current UIDs;
 * - no mirror sits in a namespace its identity does not allow (or of an identity that is gone);
 * - every allowed key with consumers has a mirror, current for its source (annotation and
 *   data), unless the source is missing — then an existing mirror keeps its last data;
 * - no Secret that is not ours changed (compared with {@link foreignSecrets} taken before);
 *   a Secret an identity names as its source is never ours, whatever its labels;
 * - every consumer's owned conditions match its state (SPEC §16): IdentityNotFound,
 *   NamespaceNotAllowed (and ApplyJobSucceeded=False/IdentityNotAllowed when deleting),
 *   MirrorFailed for a Secret in the way, SourceNotFound, or Mirrored; none without identityRef.
 * Consumers being deleted count as live. Returns every violation, not just the first.
 */
import type { V1Namespace, V1Secret } from '@kubernetes/client-node';
import { isNamespaceAllowed } from '../../functions/lib/allowed-namespaces.ts';
import { DEFAULT_CONSUMER_KINDS, type Consumer, type TerraformClusterIdentity } from '../../functions/lib/api.ts';
import { ignoreNotFound, type Clients } from '../../functions/lib/kube.ts';
import {
  ANNOTATION_IDENTITY,
  ANNOTATION_SOURCE_HASH,
  isOurs,
  isReservedSourceName,
  mirrorName,
  sourceHash,
} from '../../functions/lib/mirror.ts';
import { consumerObjects, identities } from '../../functions/lib/objects.ts';

/** resourceVersion of every Secret in the namespaces that is not a mirror of ours, by `ns/name`. */
export async function foreignSecrets(a: Clients, namespaces: readonly string[]): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const ns of namespaces) {
    for (const s of (await a.core.listNamespacedSecret({ namespace: ns })).items) {
      const id = s.metadata?.annotations?.[ANNOTATION_IDENTITY];
      // Foreign means not a mirror by labels and annotation; whose source it is does not matter here.
      if (id && isOurs(s, id, undefined)) continue;
      out.set(`${ns}/${s.metadata!.name}`, s.metadata!.resourceVersion!);
    }
  }
  return out;
}

/** What the invariant looks at in one namespace. */
interface NamespaceState {
  ns: string;
  /** The Namespace object (its labels), or undefined when it is gone. */
  nsObj: V1Namespace | undefined;
  /** Every consumer of every default kind in it, with its kind set. */
  consumers: Consumer[];
  secrets: V1Secret[];
}

/**
 * Checks the invariant in `namespaces`.
 * @param foreign a {@link foreignSecrets} snapshot taken before the work.
 * @returns the violations (empty when it holds).
 */
export async function invariantViolations(
  a: Clients,
  namespaces: readonly string[],
  foreign?: Map<string, string>,
): Promise<string[]> {
  const v: string[] = [];
  const identity = identityCache(a);
  for (const ns of namespaces) {
    const state = await readNamespaceState(a, ns);
    for (const id of mirrorKeys(state)) {
      const key = await keyFacts(a, state, { id, idObj: await identity(id) });
      v.push(...keyViolations(state, key), ...conditionViolations(state, key));
    }
    v.push(...unkeyedViolations(state));
    v.push(...foreignViolations(state, foreign));
  }
  return v;
}

/** What decides one key (namespace, identity), read from the API server. */
interface KeyFacts {
  id: string;
  idObj: TerraformClusterIdentity | undefined;
  allowed: boolean;
  users: Consumer[];
  mirror: V1Secret | undefined;
  /** Its `secretRef` names a mirror (SPEC §3): nothing may be copied from it. */
  inert: boolean;
  /** The Secret at the mirror's name is our mirror (SPEC §3 `isOurs`). */
  ours: boolean;
  source: V1Secret | undefined;
}

/** Reads identities by name, each once. */
function identityCache(a: Clients): (name: string) => Promise<TerraformClusterIdentity | undefined> {
  const read = new Map<string, TerraformClusterIdentity | undefined>();
  return async (name) => {
    if (!read.has(name)) read.set(name, await ignoreNotFound(identities(a).get({ name })));
    return read.get(name);
  };
}

async function readNamespaceState(a: Clients, ns: string): Promise<NamespaceState> {
  const nsObj = await ignoreNotFound(a.core.readNamespace({ name: ns }));
  const consumers: Consumer[] = [];
  for (const k of DEFAULT_CONSUMER_KINDS) {
    // Typed: each item comes with its kind set.
    consumers.push(...((await consumerObjects(a, k).list({ namespace: ns })).items ?? []));
  }
  const secrets = (await a.core.listNamespacedSecret({ namespace: ns })).items;
  return { ns, nsObj, consumers, secrets };
}

/** Identities named by a consumer or by a mirror of ours in the namespace. */
function mirrorKeys({ consumers, secrets }: NamespaceState): Set<string> {
  const keys = new Set([...consumers.map((c) => c.spec?.identityRef?.name).filter((x): x is string => Boolean(x))]);
  for (const s of secrets) {
    const id = s.metadata?.annotations?.[ANNOTATION_IDENTITY];
    if (id && isOurs(s, id, undefined)) keys.add(id);
  }
  return keys;
}

async function keyFacts(
  a: Clients,
  state: NamespaceState,
  k: { id: string; idObj: TerraformClusterIdentity | undefined },
): Promise<KeyFacts> {
  const { ns, nsObj, consumers, secrets } = state;
  const users = consumers.filter((c) => c.spec?.identityRef?.name === k.id);
  const mirror = secrets.find((s) => s.metadata?.name === mirrorName(k.id));
  const ours = mirror !== undefined && isOurs(mirror, k.id, k.idObj?.spec?.secretRef);
  const allowed = Boolean(
    k.idObj &&
    nsObj &&
    isNamespaceAllowed(k.idObj.spec?.allowedNamespaces, { name: ns, labels: nsObj.metadata?.labels }),
  );
  const ref = k.idObj?.spec?.secretRef;
  const inert = isReservedSourceName(ref?.name);
  const source =
    ref && allowed && !inert
      ? await ignoreNotFound(a.core.readNamespacedSecret({ name: ref.name, namespace: ref.namespace }))
      : undefined;
  return { id: k.id, idObj: k.idObj, allowed, inert, users, mirror, ours, source };
}

/** The violations of one key's mirror (namespace, identity). */
function keyViolations({ ns }: NamespaceState, k: KeyFacts): string[] {
  const { id, idObj, allowed, users, mirror, ours, source } = k;
  if (!allowed)
    return ours
      ? [`${ns}: mirror of ${id} exists although ${idObj ? 'the namespace is not allowed' : 'the identity is gone'}`]
      : [];
  if (k.inert)
    return ours ? [`${ns}: mirror of ${id} exists although its identity is inert (its secretRef names a mirror)`] : [];
  if (mirror && !ours) return []; // a Secret in the way: never touched (checked by foreignViolations)
  if (!mirror) return users.length && source ? [`${ns}: ${users.length} consumer(s) of ${id} but no mirror`] : [];
  if (!source && sourceHash(mirror.data) !== mirror.metadata?.annotations?.[ANNOTATION_SOURCE_HASH])
    return [`${ns}: mirror of ${id} lost its last good copy while its source is missing`];
  return mirrorViolations({ ns, id, users, mirror, source });
}

/** The owned conditions SPEC §16 asks of a consumer of a key, as `Type=Status/Reason`. */
function expectedConditions(k: KeyFacts, c: Consumer): string[] {
  if (!k.idObj) return ['IdentityAllowed=False/IdentityNotFound'];
  if (!k.allowed)
    return c.metadata.deletionTimestamp
      ? ['ApplyJobSucceeded=False/IdentityNotAllowed', 'IdentityAllowed=False/NamespaceNotAllowed']
      : ['IdentityAllowed=False/NamespaceNotAllowed'];
  const mirrored = k.inert
    ? 'SourceIsMirror'
    : k.mirror && !k.ours
      ? 'MirrorFailed'
      : !k.source
        ? 'SourceNotFound'
        : 'Mirrored';
  return [
    `CredentialsMirrored=${mirrored === 'Mirrored' ? 'True' : 'False'}/${mirrored}`,
    'IdentityAllowed=True/NamespaceAllowed',
  ];
}

const OWNED = ['IdentityAllowed', 'CredentialsMirrored', 'ApplyJobSucceeded'];

/** A consumer's owned conditions as `Type=Status/Reason`, sorted. */
const ownedConditions = (c: Consumer): string[] =>
  (c.status?.conditions ?? [])
    .filter((x) => OWNED.includes(x.type))
    .map((x) => `${x.type}=${x.status}/${x.reason}`)
    .sort();

/** Consumers of a key whose conditions do not say what their state is. */
function conditionViolations({ ns }: NamespaceState, k: KeyFacts): string[] {
  return k.users.flatMap((c) => {
    const want = expectedConditions(k, c);
    const got = ownedConditions(c);
    return JSON.stringify(want) === JSON.stringify(got)
      ? []
      : [`${ns}/${c.metadata.name} (${c.kind}): conditions [${got.join(', ')}], its state says [${want.join(', ')}]`];
  });
}

/** Consumers without `identityRef` carry none of our conditions. */
function unkeyedViolations({ ns, consumers }: NamespaceState): string[] {
  return consumers
    .filter((c) => !c.spec?.identityRef?.name && ownedConditions(c).length > 0)
    .map(
      (c) => `${ns}/${c.metadata.name} (${c.kind}): no identityRef but conditions [${ownedConditions(c).join(', ')}]`,
    );
}

/** An existing mirror's owner references and currency. */
function mirrorViolations(m: {
  ns: string;
  id: string;
  users: Consumer[];
  mirror: V1Secret;
  source: V1Secret | undefined;
}): string[] {
  const v: string[] = [];
  const want = m.users.map((c) => `${c.kind}/${c.metadata.name}/${c.metadata.uid}`).sort();
  const got = (m.mirror.metadata?.ownerReferences ?? [])
    .filter((r) => r.kind.startsWith('Terraform'))
    .map((r) => `${r.kind}/${r.name}/${r.uid}`)
    .sort();
  if (JSON.stringify(want) !== JSON.stringify(got))
    v.push(`${m.ns}: mirror of ${m.id} is owned by [${got.join(', ')}], its consumers are [${want.join(', ')}]`);
  if (m.source) {
    const h = sourceHash(m.source.data);
    if (m.mirror.metadata?.annotations?.[ANNOTATION_SOURCE_HASH] !== h || sourceHash(m.mirror.data) !== h)
      v.push(`${m.ns}: mirror of ${m.id} is not current for its source`);
  }
  return v;
}

/** Secrets of the {@link foreignSecrets} snapshot in this namespace that were deleted or changed. */
function foreignViolations({ ns, secrets }: NamespaceState, foreign: Map<string, string> | undefined): string[] {
  const v: string[] = [];
  for (const [k, rv] of foreign ?? []) {
    if (!k.startsWith(`${ns}/`)) continue;
    const s = secrets.find((x) => `${ns}/${x.metadata!.name}` === k);
    if (!s) v.push(`${k}: a Secret that is not ours was deleted`);
    else if (s.metadata!.resourceVersion !== rv) v.push(`${k}: a Secret that is not ours was changed`);
  }
  return v;
}
