import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ApiextensionsV1Api } from '@kubernetes/client-node';
import { API_VERSION, GROUP, IDENTITY_KIND, IDENTITY_PLURAL, VERSION } from '../../functions/lib/api.ts';
import { apiStatus } from '../../functions/lib/kube.ts';
import { admin, asUser, controlPlaneDir, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { readAdminKubeConfig } from '../../scripts/controlplane/controlplane.ts';

const a = admin();
const ns = namespaces('foundation');
const identity = (name: string, allowedNamespaces?: unknown) => ({
  apiVersion: API_VERSION,
  kind: IDENTITY_KIND,
  metadata: { name },
  spec: {
    secretRef: { name: 'creds', namespace: 'captf-system' },
    ...(allowedNamespaces === undefined ? {} : { allowedNamespaces }),
  },
});
const createIdentity = async (body: object) => {
  const name = (body as { metadata: { name: string } }).metadata.name;
  ns.onCleanup(() =>
    a.custom.deleteClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, name }),
  );
  return a.custom.createClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, body });
};

describe('the local control plane', () => {
  it('serves the pinned Kubernetes version and is healthy', async () => {
    const { server } = readAdminKubeConfig(controlPlaneDir());
    assert.match(server, /^https:\/\/127\.0\.0\.1:\d+$/);
    const version = await a.kc.makeApiClient((await import('@kubernetes/client-node')).VersionApi).getCode();
    assert.match(version.gitVersion, /^v1\.3[67]\.\d+$/);
  });

  it('installs the three CRDs with status subresources, selectable field and printer columns', async () => {
    const ext = a.kc.makeApiClient(ApiextensionsV1Api);
    const id = await ext.readCustomResourceDefinition({ name: `${IDENTITY_PLURAL}.${GROUP}` });
    assert.equal(id.spec.scope, 'Cluster');
    const v = id.spec.versions.find((x) => x.name === VERSION)!;
    assert.ok(v.subresources?.status);
    assert.deepEqual(
      v.additionalPrinterColumns?.map((c) => c.name),
      ['Ready', 'Secret-Namespace', 'Secret', 'Namespaces', 'Age'],
    );
    for (const plural of ['terraformclusters', 'terraformmachines']) {
      const crd = await ext.readCustomResourceDefinition({ name: `${plural}.${GROUP}` });
      assert.equal(crd.spec.scope, 'Namespaced');
      const cv = crd.spec.versions.find((x) => x.name === VERSION)!;
      assert.ok(cv.subresources?.status);
      assert.deepEqual(
        cv.selectableFields?.map((f) => f.jsonPath),
        ['.spec.identityRef.name'],
      );
      const conds = cv.schema?.openAPIV3Schema?.properties?.status?.properties?.conditions;
      assert.equal(conds?.x_kubernetes_list_type, 'map');
      assert.deepEqual(conds?.x_kubernetes_list_map_keys, ['type']);
    }
  });

  it('rejects allowedNamespaces: {} through the CEL rule, and accepts the valid forms', async () => {
    await assert.rejects(createIdentity(identity(`cel-empty-${suffix()}`, {})), (err: unknown) => {
      assert.equal(apiStatus(err), 422);
      assert.match(String((err as { body?: unknown }).body), /allowedNamespaces: \{\} is ambiguous/);
      return true;
    });
    for (const form of [
      undefined,
      null,
      { list: [] },
      { list: ['a'] },
      { selector: {} },
      { list: ['a'], selector: { matchLabels: { x: 'y' } } },
    ]) {
      await createIdentity(identity(`cel-ok-${suffix()}`, form));
    }
  });

  it('finds a consumer by field selector on spec.identityRef.name', async () => {
    const n = await ns.create();
    const mk = (name: string, idName: string) =>
      a.custom.createNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace: n,
        plural: 'terraformclusters',
        body: {
          apiVersion: API_VERSION,
          kind: 'TerraformCluster',
          metadata: { name },
          spec: { identityRef: { name: idName }, region: 'eu-1' },
        },
      });
    await mk('uses-aws', 'aws');
    await mk('uses-gcp', 'gcp');
    const list = (await a.custom.listNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: n,
      plural: 'terraformclusters',
      fieldSelector: 'spec.identityRef.name=aws',
    })) as { items: { metadata: { name: string }; spec: { region?: string } }[] };
    assert.deepEqual(
      list.items.map((i) => i.metadata.name),
      ['uses-aws'],
    );
    assert.equal(list.items[0]!.spec.region, 'eu-1', 'unknown spec fields are preserved');
  });

  it('authenticates minted users by client certificate and enforces RBAC (403 without, 200 through a group)', async () => {
    const n = await ns.create();
    await a.core.createNamespacedSecret({
      namespace: n,
      body: { metadata: { name: 'creds' }, stringData: { k: 'v' } },
    });
    const nobody = await asUser(`nobody-${suffix()}`);
    await assert.rejects(
      nobody.core.readNamespacedSecret({ name: 'creds', namespace: n }),
      (e: unknown) => apiStatus(e) === 403,
    );
    assert.equal((await a.core.readNamespacedSecret({ name: 'creds', namespace: n })).metadata?.name, 'creds');

    const group = `readers-${suffix()}`;
    await a.kc.makeApiClient((await import('@kubernetes/client-node')).RbacAuthorizationV1Api).createNamespacedRole({
      namespace: n,
      body: {
        metadata: { name: 'read-creds' },
        rules: [{ apiGroups: [''], resources: ['secrets'], verbs: ['get'], resourceNames: ['creds'] }],
      },
    });
    await a.kc
      .makeApiClient((await import('@kubernetes/client-node')).RbacAuthorizationV1Api)
      .createNamespacedRoleBinding({
        namespace: n,
        body: {
          metadata: { name: 'read-creds' },
          roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'read-creds' },
          subjects: [{ kind: 'Group', name: group, apiGroup: 'rbac.authorization.k8s.io' }],
        },
      });
    const member = await asUser(`member-${suffix()}`, [group, 'other-group']);
    await eventually(
      'RBAC to allow the group member',
      async () => (await member.core.readNamespacedSecret({ name: 'creds', namespace: n })).metadata?.name === 'creds',
    );
  });

  it('runs the garbage collector: a dependent Secret goes when its owner is deleted', async (t) => {
    const n = await ns.create();
    const owner = (await a.custom.createNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: n,
      plural: 'terraformmachines',
      body: { apiVersion: API_VERSION, kind: 'TerraformMachine', metadata: { name: 'owner' }, spec: {} },
    })) as { metadata: { uid: string } };
    await a.core.createNamespacedSecret({
      namespace: n,
      body: {
        metadata: {
          name: 'dependent',
          ownerReferences: [
            { apiVersion: API_VERSION, kind: 'TerraformMachine', name: 'owner', uid: owner.metadata.uid },
          ],
        },
      },
    });
    await a.custom.deleteNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: n,
      plural: 'terraformmachines',
      name: 'owner',
    });
    await eventually(
      'the garbage collector to delete the dependent Secret',
      async () => {
        try {
          await a.core.readNamespacedSecret({ name: 'dependent', namespace: n });
          return false;
        } catch (e) {
          return apiStatus(e) === 404;
        }
      },
      120_000,
    );
    t.diagnostic('dependent Secret garbage-collected');
  });
});
