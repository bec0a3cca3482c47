/**
 * Kubeconfigs for ServiceAccounts, from TokenRequest tokens: lets tests (and the local mode)
 * run a function or the event-source adapter with exactly the RBAC its ServiceAccount gets
 * in the manifests, the way it runs in a cluster.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  AuthorizationV1Api,
  CoreV1Api,
  type KubeConfig,
  KubernetesObjectApi,
  RbacAuthorizationV1Api,
  dumpYaml,
  type KubernetesObject,
  type V1PolicyRule,
} from '@kubernetes/client-node';
import { loadAll } from 'js-yaml';
import { loadKubeConfig } from '../../functions/lib/kube.ts';
import { DEFAULT_PREPARE_AUDIENCE } from '../../functions/mirror-sync/authorize.ts';
import { REPO_ROOT } from '../tools/build.ts';
import { createOnce } from './kube.ts';
import { eventually } from './wait.ts';

/**
 * Mints a token for ServiceAccount `namespace/name` with the TokenRequest API (what
 * `kubectl create token <name> -n <namespace> [--audience <audience>]` does).
 * @param sa.audience the audience the token is bound to; default: the API server's own
 *   (such a token is refused by mirror-sync's prepare, whose audience is `captf-mirror-sync`).
 * @returns the token (a JWT valid for an hour; never print it).
 * @throws the API error when the ServiceAccount does not exist or the request is refused.
 */
export async function serviceAccountToken(
  admin: KubeConfig,
  sa: { namespace: string; name: string; audience?: string },
): Promise<string> {
  const { namespace, name, audience } = sa;
  const tr = await admin.makeApiClient(CoreV1Api).createNamespacedServiceAccountToken({
    name,
    namespace,
    body: { spec: { audiences: audience ? [audience] : [], expirationSeconds: 3600 } },
  });
  const token = tr.status?.token;
  if (!token) throw new Error(`TokenRequest for ${namespace}/${name} returned no token`);
  return token;
}

/**
 * Requests a token for ServiceAccount `namespace/name` ({@link serviceAccountToken}, for the
 * API server's own audience) and writes a kubeconfig that uses it.
 * @param admin kubeconfig allowed to create `serviceaccounts/token`.
 * @param sa.dir folder for the kubeconfig (created).
 * @returns the kubeconfig path and a loaded KubeConfig for it.
 * @throws the API error when the ServiceAccount does not exist or the request is refused.
 */
export async function serviceAccountKubeConfig(
  admin: KubeConfig,
  sa: { namespace: string; name: string; dir: string },
): Promise<{ path: string; kc: KubeConfig }> {
  const { namespace, name, dir } = sa;
  const token = await serviceAccountToken(admin, sa);
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
  return { path, kc: loadKubeConfig(path) };
}

const RBAC_KINDS = new Set(['ServiceAccount', 'ClusterRole', 'ClusterRoleBinding', 'Role', 'RoleBinding']);

/**
 * A copy of RBAC object `o` for one test: namespaced objects (and subjects in `captf-system`)
 * moved to `opts.namespace`, cluster-scoped names (and role references) given `-<suffix>`.
 */
function forTest(o: KubernetesObject, opts: { namespace: string; suffix: string }): KubernetesObject {
  const rename = (n: string) => `${n}-${opts.suffix}`;
  const c = structuredClone(o) as KubernetesObject & {
    roleRef?: { kind: string; name: string };
    subjects?: { kind: string; namespace?: string }[];
  };
  if (c.kind === 'ClusterRole' || c.kind === 'ClusterRoleBinding') c.metadata!.name = rename(c.metadata!.name!);
  else c.metadata!.namespace = opts.namespace;
  if (c.roleRef?.kind === 'ClusterRole') c.roleRef.name = rename(c.roleRef.name);
  for (const s of c.subjects ?? []) if (s.namespace === 'captf-system') s.namespace = opts.namespace;
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
  opts: { namespace: string; suffix: string },
): Promise<{ objects: KubernetesObject[]; cleanup(): Promise<void> }> {
  const api = KubernetesObjectApi.makeApiClient(admin);
  const out: KubernetesObject[] = [];
  for (const o of objects) {
    if (RBAC_KINDS.has(o.kind!)) out.push(await api.create(forTest(o, opts)));
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

/** The shipped ClusterRole of prepare's callers (SPEC §5), relative to the repository root. */
export const PREPARE_ROLE_FILE = 'manifests/base/rbac/prepare.yaml';

/**
 * The rules of the ClusterRole `captf-prepare` as the manifests ship it (read from
 * {@link PREPARE_ROLE_FILE}, never copied).
 * @throws Error when the file has no such ClusterRole.
 */
export function shippedPrepareRules(): V1PolicyRule[] {
  const docs = loadAll(readFileSync(join(REPO_ROOT, PREPARE_ROLE_FILE), 'utf8')) as (KubernetesObject & {
    rules?: V1PolicyRule[];
  })[];
  const role = docs.find((d) => d?.kind === 'ClusterRole' && d.metadata?.name === 'captf-prepare');
  if (!role?.rules) throw new Error(`${PREPARE_ROLE_FILE} has no ClusterRole captf-prepare`);
  return role.rules;
}

/** A caller of mirror-sync's prepare: a ServiceAccount holding the shipped prepare role. */
export interface PrepareCaller {
  /** `system:serviceaccount:<namespace>:<name>`. */
  user: string;
  /** A token bound to the prepare audience (never print it). */
  token: string;
  /** The `Authorization` header value: `Bearer <token>`. */
  authorization: string;
  /** Deletes the ClusterRoleBinding, the ClusterRole and the ServiceAccount. */
  cleanup(): Promise<void>;
}

/**
 * Plays the provider's manager for prepare (SPEC §5): creates ServiceAccount
 * `namespace/name` (if missing), binds it to a copy of the shipped `captf-prepare`
 * ClusterRole named `captf-prepare-<suffix>` (plus `extraRules`, e.g. for a consumer kind of
 * a test's own), waits until the API server's authorizer allows it, and mints a token for
 * `audience` (default `captf-mirror-sync`), as `kubectl create token <name> --audience
 * captf-mirror-sync` would.
 * @throws the API error of a refused create, or Error when RBAC does not take effect in 30 s.
 */
export async function prepareCaller(
  admin: KubeConfig,
  opts: { namespace: string; name: string; suffix: string; audience?: string; extraRules?: V1PolicyRule[] },
): Promise<PrepareCaller> {
  const { namespace, name } = opts;
  const user = `system:serviceaccount:${namespace}:${name}`;
  const core = admin.makeApiClient(CoreV1Api);
  await createOnce(core.createNamespacedServiceAccount({ namespace, body: { metadata: { name } } }));
  const rules = [...shippedPrepareRules(), ...(opts.extraRules ?? [])];
  const unbind = await bindClusterRole(admin, { name: `captf-prepare-${opts.suffix}`, rules, namespace, sa: name });
  await allowedToPrepare(admin, user, rules);
  const token = await serviceAccountToken(admin, {
    namespace,
    name,
    audience: opts.audience ?? DEFAULT_PREPARE_AUDIENCE,
  });
  const cleanup = async () => {
    await unbind();
    await core.deleteNamespacedServiceAccount({ namespace, name }).catch(() => undefined);
  };
  return { user, token, authorization: `Bearer ${token}`, cleanup };
}

/** Creates ClusterRole `name` with `rules` and a ClusterRoleBinding of it to a ServiceAccount. @returns their cleanup. */
async function bindClusterRole(
  admin: KubeConfig,
  r: { name: string; rules: V1PolicyRule[]; namespace: string; sa: string },
): Promise<() => Promise<void>> {
  const rbac = admin.makeApiClient(RbacAuthorizationV1Api);
  await rbac.createClusterRole({ body: { metadata: { name: r.name }, rules: r.rules } });
  await rbac.createClusterRoleBinding({
    body: {
      metadata: { name: r.name },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: r.name },
      subjects: [{ kind: 'ServiceAccount', name: r.sa, namespace: r.namespace }],
    },
  });
  return async () => {
    await rbac.deleteClusterRoleBinding({ name: r.name }).catch(() => undefined);
    await rbac.deleteClusterRole({ name: r.name }).catch(() => undefined);
  };
}

/** Waits until RBAC lets `user` create the first resource of every rule (the authorizer's cache lags a create). */
async function allowedToPrepare(admin: KubeConfig, user: string, rules: readonly V1PolicyRule[]): Promise<void> {
  const authz = admin.makeApiClient(AuthorizationV1Api);
  const groups = ['system:serviceaccounts', `system:serviceaccounts:${user.split(':')[2]}`, 'system:authenticated'];
  for (const rule of rules) {
    const [resource, subresource = ''] = (rule.resources?.[0] ?? '').split('/');
    await eventually(
      `${user} to be allowed to create ${rule.resources?.[0]}`,
      async () =>
        (
          await authz.createSubjectAccessReview({
            body: {
              spec: {
                user,
                groups,
                resourceAttributes: { verb: 'create', group: rule.apiGroups?.[0] ?? '', resource, subresource },
              },
            },
          })
        ).status?.allowed === true,
      30_000,
      100,
    );
  }
}
