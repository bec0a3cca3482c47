/**
 * Who the system's parts act as. On a control plane the system started, each function and the
 * event source can be its own client-certificate user, bound to exactly the ClusterRoles the
 * rendered manifests give its ServiceAccount: the audit log then names who sent each request,
 * and the least-privilege roles are what runs. The provider's manager, allowed to call
 * prepare, is installed as the manifests describe it.
 */
import {
  KubernetesObjectApi,
  type KubeConfig,
  type KubernetesObject,
  type V1ClusterRoleBinding,
} from '@kubernetes/client-node';
import { createOnce } from '../lib/kube.ts';
import type { ControlPlane } from '../controlplane/controlplane.ts';
import type { FunctionName } from './functions.ts';

/** Who acts: a function, or the ApiServerSource adapter. */
export type Actor = FunctionName | 'event-source';

/** Username of each actor's client certificate (audit log `user.username`). */
export const USERS: Record<Actor, string> = {
  admission: 'captf:admission',
  'mirror-sync': 'captf:mirror-sync',
  'identity-status': 'captf:identity-status',
  'dead-letters': 'captf:dead-letters',
  'event-source': 'captf:event-source',
};

/** The ServiceAccount whose roles each actor gets (manifests/base/rbac). */
const SERVICE_ACCOUNTS: Record<Actor, string> = {
  admission: 'captf-admission',
  'mirror-sync': 'captf-mirror-sync',
  'identity-status': 'captf-identity-status',
  'dead-letters': 'captf-dead-letters',
  'event-source': 'captf-event-sources',
};

/**
 * Each actor as its own user, bound to the ClusterRoles the rendered manifests bind to its
 * ServiceAccount.
 * @returns each actor's kubeconfig file.
 * @throws Error when a binding names a ClusterRole the manifests do not render, or the API
 *   server refuses an object.
 */
export async function serviceAccountUsers(
  cp: ControlPlane,
  kc: KubeConfig,
  rendered: readonly KubernetesObject[],
): Promise<Record<Actor, string>> {
  const objects = KubernetesObjectApi.makeApiClient(kc);
  const bindings = rendered.filter((o) => o.kind === 'ClusterRoleBinding') as V1ClusterRoleBinding[];
  const kubeconfigs = {} as Record<Actor, string>;
  for (const [actor, username] of Object.entries(USERS) as [Actor, string][]) {
    for (const b of bindings) {
      if (!b.subjects?.some((s) => s.kind === 'ServiceAccount' && s.name === SERVICE_ACCOUNTS[actor])) continue;
      const role = rendered.find((o) => o.kind === 'ClusterRole' && o.metadata?.name === b.roleRef.name);
      if (!role) throw new Error(`the rendered manifests bind ${actor} to missing ClusterRole ${b.roleRef.name}`);
      await createOnce(objects.create({ ...role, metadata: { name: role.metadata!.name } }));
      await createOnce(
        objects.create({
          apiVersion: 'rbac.authorization.k8s.io/v1',
          kind: 'ClusterRoleBinding',
          metadata: { name: `${b.metadata!.name}-${actor}-user` },
          roleRef: b.roleRef,
          subjects: [{ kind: 'User', apiGroup: 'rbac.authorization.k8s.io', name: username }],
        } as KubernetesObject),
      );
    }
    kubeconfigs[actor] = await cp.userKubeConfig(username);
  }
  return kubeconfigs;
}

/**
 * The provider's manager as the system plays it: the rendered `captf-prepare` ClusterRole and
 * its binding, and the ServiceAccount the binding names (in a cluster the provider installs
 * it), so `prepare` can be called as the docs show, with
 * `kubectl create token <sa> --audience captf-mirror-sync`.
 * @returns the ServiceAccount. @throws Error when the manifests render no such binding.
 */
export async function installPrepareCaller(
  kc: KubeConfig,
  rendered: readonly KubernetesObject[],
): Promise<{ namespace: string; name: string }> {
  const rbac = rendered.filter(
    (o) => (o.kind === 'ClusterRole' || o.kind === 'ClusterRoleBinding') && o.metadata?.name === 'captf-prepare',
  );
  const subject = (rbac.find((o) => o.kind === 'ClusterRoleBinding') as V1ClusterRoleBinding | undefined)
    ?.subjects?.[0];
  if (rbac.length !== 2 || !subject?.namespace)
    throw new Error('the rendered manifests hold no captf-prepare ClusterRole and ClusterRoleBinding');
  const objects = KubernetesObjectApi.makeApiClient(kc);
  const sa = {
    apiVersion: 'v1',
    kind: 'ServiceAccount',
    metadata: { name: subject.name, namespace: subject.namespace },
  };
  for (const o of [...rbac, sa]) await createOnce(objects.create(o));
  return { namespace: subject.namespace, name: subject.name };
}
