/**
 * Kubeconfigs for ServiceAccounts, from TokenRequest tokens: lets tests (and the local mode)
 * run a function or the event-source adapter with exactly the RBAC its ServiceAccount gets
 * in the manifests, the way it runs in a cluster.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CoreV1Api, KubeConfig, KubernetesObjectApi, dumpYaml, type KubernetesObject } from '@kubernetes/client-node';

/**
 * Requests a token for ServiceAccount `namespace/name` (TokenRequest API, default audience)
 * and writes a kubeconfig that uses it.
 * @param admin kubeconfig allowed to create `serviceaccounts/token`.
 * @param sa.dir folder for the kubeconfig (created).
 * @param sa.expirationSeconds token lifetime (default 3600, the API's minimum is 600).
 * @returns the kubeconfig path and a loaded KubeConfig for it.
 * @throws the API error when the ServiceAccount does not exist or the request is refused.
 */
export async function serviceAccountKubeConfig(
  admin: KubeConfig,
  sa: { namespace: string; name: string; dir: string; expirationSeconds?: number },
): Promise<{ path: string; kc: KubeConfig }> {
  const { namespace, name, dir, expirationSeconds = 3600 } = sa;
  const core = admin.makeApiClient(CoreV1Api);
  const tr = await core.createNamespacedServiceAccountToken({
    name,
    namespace,
    body: { spec: { audiences: [], expirationSeconds } },
  });
  const token = tr.status?.token;
  if (!token) throw new Error(`TokenRequest for ${namespace}/${name} returned no token`);
  const cluster = admin.getCurrentCluster()!;
  const user = `system:serviceaccount:${namespace}:${name}`;
  const config = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [
      {
        name: 'captf',
        cluster: {
          server: cluster.server,
          ...(cluster.caData ? { 'certificate-authority-data': cluster.caData } : {}),
        },
      },
    ],
    users: [{ name: user, user: { token } }],
    contexts: [{ name: user, context: { cluster: 'captf', user, namespace } }],
    'current-context': user,
  };
  mkdirSync(dir, { recursive: true });
  const path = join(dir, `sa-${namespace}-${name}.kubeconfig`);
  writeFileSync(path, dumpYaml(config), { mode: 0o600 });
  const kc = new KubeConfig();
  kc.loadFromFile(path);
  return { path, kc };
}

const RBAC_KINDS = new Set(['ServiceAccount', 'ClusterRole', 'ClusterRoleBinding', 'Role', 'RoleBinding']);

/**
 * A copy of RBAC object `o` for one test: namespaced objects (and subjects in `opts.from`)
 * moved to `opts.namespace`, cluster-scoped names (and role references) given `-<suffix>`.
 */
function forTest(o: KubernetesObject, opts: { namespace: string; suffix: string; from: string }): KubernetesObject {
  const rename = (n: string) => `${n}-${opts.suffix}`;
  const c = structuredClone(o) as KubernetesObject & {
    roleRef?: { kind: string; name: string };
    subjects?: { kind: string; namespace?: string }[];
  };
  if (c.kind === 'ClusterRole' || c.kind === 'ClusterRoleBinding') c.metadata!.name = rename(c.metadata!.name!);
  else c.metadata!.namespace = opts.namespace;
  if (c.roleRef?.kind === 'ClusterRole') c.roleRef.name = rename(c.roleRef.name);
  for (const s of c.subjects ?? []) if (s.namespace === opts.from) s.namespace = opts.namespace;
  return c;
}

/**
 * Installs the RBAC part of rendered manifests (ServiceAccounts, Roles, ClusterRoles and
 * their bindings) into a test control plane: namespaced objects go to `namespace`,
 * cluster-scoped ones get `-<suffix>` appended (and bindings follow), so concurrent tests
 * never share them.
 * @param objects rendered manifests (e.g. `render('manifests/overlays/without-crds')`).
 * @returns the created objects and `cleanup()` that deletes the cluster-scoped ones.
 * @throws the API error of the first object the API server refuses.
 */
export async function installRbac(
  admin: KubeConfig,
  objects: readonly KubernetesObject[],
  opts: { namespace: string; suffix: string; from?: string },
): Promise<{ objects: KubernetesObject[]; cleanup(): Promise<void> }> {
  const from = opts.from ?? 'captf-system';
  const api = KubernetesObjectApi.makeApiClient(admin);
  const out: KubernetesObject[] = [];
  for (const o of objects) {
    if (RBAC_KINDS.has(o.kind!)) out.push(await api.create(forTest(o, { ...opts, from })));
  }
  return {
    objects: out,
    async cleanup() {
      for (const o of out) {
        if (o.kind === 'ClusterRole' || o.kind === 'ClusterRoleBinding') await api.delete(o).catch(() => undefined);
      }
    },
  };
}
