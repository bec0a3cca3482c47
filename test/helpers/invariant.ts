/**
 * The mirror invariant (SPEC §3, §4, §6), checked on the real API server for a set of
 * namespaces (other test files work elsewhere on the same control plane at the same time):
 * - every mirror's consumer owner references are exactly the live consumers (deleting ones
 *   included) naming its identity in its namespace, with current UIDs;
 * - no mirror sits in a namespace its identity does not allow (or of an identity that is gone);
 * - every allowed key with consumers has a mirror, current for its source (annotation and
 *   data), unless the source is missing — then an existing mirror keeps its last data;
 * - no Secret that is not ours changed (compared with {@link foreignSecrets} taken before).
 * Returns every violation, not just the first.
 */
import { isNamespaceAllowed } from '../../functions/lib/allowed-namespaces.ts';
import {
  DEFAULT_CONSUMER_KINDS,
  GROUP,
  IDENTITY_PLURAL,
  VERSION,
  type Consumer,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import { ignoreNotFound, type Clients } from '../../functions/lib/kube.ts';
import {
  ANNOTATION_IDENTITY,
  ANNOTATION_SOURCE_HASH,
  isOurs,
  mirrorName,
  sourceHash,
} from '../../functions/lib/mirror.ts';

/** resourceVersion of every Secret in the namespaces that is not a mirror of ours, by `ns/name`. */
export async function foreignSecrets(a: Clients, namespaces: readonly string[]): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const ns of namespaces) {
    for (const s of (await a.core.listNamespacedSecret({ namespace: ns })).items) {
      const id = s.metadata?.annotations?.[ANNOTATION_IDENTITY];
      if (id && isOurs(s, id)) continue;
      out.set(`${ns}/${s.metadata!.name}`, s.metadata!.resourceVersion!);
    }
  }
  return out;
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
  const identities = new Map<string, TerraformClusterIdentity | undefined>();
  const identity = async (name: string) => {
    if (!identities.has(name))
      identities.set(
        name,
        (await ignoreNotFound(
          a.custom.getClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, name }),
        )) as TerraformClusterIdentity | undefined,
      );
    return identities.get(name);
  };
  for (const ns of namespaces) {
    const nsObj = await ignoreNotFound(a.core.readNamespace({ name: ns }));
    const consumers: Consumer[] = [];
    for (const k of DEFAULT_CONSUMER_KINDS) {
      const list = (await a.custom.listNamespacedCustomObject({
        group: k.group,
        version: k.version,
        plural: k.plural,
        namespace: ns,
      })) as { items: Consumer[] };
      consumers.push(...list.items.map((c) => ({ ...c, kind: k.kind })));
    }
    const secrets = (await a.core.listNamespacedSecret({ namespace: ns })).items;
    const keys = new Set([...consumers.map((c) => c.spec?.identityRef?.name).filter((x): x is string => Boolean(x))]);
    for (const s of secrets) {
      const id = s.metadata?.annotations?.[ANNOTATION_IDENTITY];
      if (id && isOurs(s, id)) keys.add(id);
    }
    for (const id of keys) {
      const idObj = await identity(id);
      const users = consumers.filter((c) => c.spec?.identityRef?.name === id);
      const mirror = secrets.find((s) => s.metadata?.name === mirrorName(id));
      const ours = mirror !== undefined && isOurs(mirror, id);
      const allowed = Boolean(
        idObj &&
        nsObj &&
        isNamespaceAllowed(idObj.spec?.allowedNamespaces, { name: ns, labels: nsObj.metadata?.labels }),
      );
      if (!allowed) {
        if (ours)
          v.push(
            `${ns}: mirror of ${id} exists although ${idObj ? 'the namespace is not allowed' : 'the identity is gone'}`,
          );
        continue;
      }
      if (mirror && !ours) continue; // a Secret in the way: never touched (checked below)
      const ref = idObj!.spec.secretRef;
      const source = await ignoreNotFound(a.core.readNamespacedSecret({ name: ref.name, namespace: ref.namespace }));
      if (!mirror) {
        if (users.length && source) v.push(`${ns}: ${users.length} consumer(s) of ${id} but no mirror`);
        continue;
      }
      const want = users.map((c) => `${c.kind}/${c.metadata.name}/${c.metadata.uid}`).sort();
      const got = (mirror.metadata?.ownerReferences ?? [])
        .filter((r) => r.kind.startsWith('Terraform'))
        .map((r) => `${r.kind}/${r.name}/${r.uid}`)
        .sort();
      if (JSON.stringify(want) !== JSON.stringify(got))
        v.push(`${ns}: mirror of ${id} is owned by [${got.join(', ')}], its consumers are [${want.join(', ')}]`);
      if (source) {
        const h = sourceHash(source.data);
        if (mirror.metadata?.annotations?.[ANNOTATION_SOURCE_HASH] !== h || sourceHash(mirror.data) !== h)
          v.push(`${ns}: mirror of ${id} is not current for its source`);
      }
    }
    for (const [k, rv] of foreign ?? []) {
      if (!k.startsWith(`${ns}/`)) continue;
      const s = secrets.find((x) => `${ns}/${x.metadata!.name}` === k);
      if (!s) v.push(`${k}: a Secret that is not ours was deleted`);
      else if (s.metadata!.resourceVersion !== rv) v.push(`${k}: a Secret that is not ours was changed`);
    }
  }
  return v;
}
