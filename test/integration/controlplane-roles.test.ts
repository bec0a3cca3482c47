/**
 * The local control plane gives the built-in ClusterRoles what a real cluster gives them: its
 * controller-manager runs the clusterrole-aggregation controller, so
 * `kubectl create rolebinding --clusterrole=edit` (or `view`) in a namespace grants there what
 * it grants on a cluster, and nothing elsewhere. A Secret in another namespace of this file
 * stands for the operator's Secret in captf-system (the real one belongs to other files).
 */
import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';
import { RbacAuthorizationV1Api } from '@kubernetes/client-node';
import { apiStatus, type Clients } from '../../functions/lib/kube.ts';
import { asUser, eventually } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';

const w = fx.world('cproles');
const a = w.clients;
const rbac = a.kc.makeApiClient(RbacAuthorizationV1Api);
const forbidden = (e: unknown) => apiStatus(e) === 403;
/** Aggregation and the RBAC cache settle within seconds; this bound is generous, not a timing claim. */
const SETTLE_MS = 60_000;

/** The operator's stand-in: a namespace holding Secret `creds` that no test user is bound in. */
let operatorNs: string;

before(async () => {
  operatorNs = await w.namespace();
  await w.create(fx.sourceSecret('creds', fx.inNamespace(operatorNs)));
});

/**
 * A fresh namespace, and a fresh user bound there to the built-in ClusterRole `role` by a
 * RoleBinding, as `kubectl create rolebinding --clusterrole=<role> --user=<name>` makes it.
 */
async function boundUser(role: 'edit' | 'view'): Promise<{ namespace: string; user: Clients }> {
  const namespace = await w.namespace();
  const name = w.name(role);
  await rbac.createNamespacedRoleBinding({
    namespace,
    body: {
      metadata: { name: `${role}-binding` },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: role },
      subjects: [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name }],
    },
  });
  return { namespace, user: await asUser(name) };
}

describe('the built-in ClusterRoles on the local control plane', () => {
  it('admin, edit and view are aggregated: they hold rules, as on a cluster', async () => {
    for (const name of ['admin', 'edit', 'view']) {
      const role = await eventually(
        `ClusterRole ${name} to be aggregated`,
        async () => {
          const r = await rbac.readClusterRole({ name });
          return (r.rules?.length ?? 0) > 0 && r;
        },
        SETTLE_MS,
      );
      assert.ok(role.aggregationRule, `${name} is an aggregated ClusterRole`);
    }
  });

  it('a user bound to edit in a namespace gets, lists, creates and updates Secrets there, and reads none elsewhere', async () => {
    const { namespace, user } = await boundUser('edit');
    await eventually(
      'the edit binding to take effect (aggregation, then the RBAC cache)',
      async () => (await user.core.listNamespacedSecret({ namespace }), true),
      SETTLE_MS,
    );

    await user.core.createNamespacedSecret({ namespace, body: fx.sourceSecret('mine', fx.data({ k: 'v1' })) });
    const got = await user.core.readNamespacedSecret({ name: 'mine', namespace });
    assert.equal(Buffer.from(got.data!.k!, 'base64').toString(), 'v1');
    const listed = await user.core.listNamespacedSecret({ namespace });
    assert.ok(listed.items.some((s) => s.metadata?.name === 'mine'));
    await user.core.replaceNamespacedSecret({
      name: 'mine',
      namespace,
      body: { ...got, data: { ...got.data, k: Buffer.from('v2').toString('base64') } },
    });
    const updated = await user.core.readNamespacedSecret({ name: 'mine', namespace });
    assert.equal(Buffer.from(updated.data!.k!, 'base64').toString(), 'v2');

    // The binding is namespaced: the operator's Secret (and every other namespace's) stays out of reach.
    await assert.rejects(user.core.readNamespacedSecret({ name: 'creds', namespace: operatorNs }), forbidden);
    await assert.rejects(user.core.listNamespacedSecret({ namespace: operatorNs }), forbidden);
    await assert.rejects(user.core.listSecretForAllNamespaces(), forbidden);
  });

  it('a user bound to view in a namespace reads its ConfigMaps (kube-root-ca.crt too) but no Secret', async () => {
    const { namespace, user } = await boundUser('view');
    await w.create(fx.sourceSecret('theirs', fx.inNamespace(namespace)));
    // The root-ca-certificate-publisher controller puts kube-root-ca.crt in every namespace, as on a cluster.
    await eventually(
      'the view binding to take effect, and kube-root-ca.crt to be published',
      async () => {
        const cms = await user.core.listNamespacedConfigMap({ namespace });
        return cms.items.some((c) => c.metadata?.name === 'kube-root-ca.crt');
      },
      SETTLE_MS,
    );

    await assert.rejects(user.core.readNamespacedSecret({ name: 'theirs', namespace }), forbidden);
    await assert.rejects(user.core.listNamespacedSecret({ namespace }), forbidden);
    await assert.rejects(user.core.readNamespacedSecret({ name: 'creds', namespace: operatorNs }), forbidden);
    // view is read-only.
    await assert.rejects(
      user.core.createNamespacedConfigMap({ namespace, body: { metadata: { name: 'nope' } } }),
      forbidden,
    );
  });
});
