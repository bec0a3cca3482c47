import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ApiextensionsV1Api, RbacAuthorizationV1Api, VersionApi } from '@kubernetes/client-node';
import {
  DEFAULT_CONSUMER_KINDS,
  IDENTITY_RESOURCE,
  TERRAFORM_CLUSTER,
  TERRAFORM_MACHINE,
} from '../../functions/lib/api.ts';
import { apiStatus } from '../../functions/lib/kube.ts';
import { consumerObjects } from '../../functions/lib/objects.ts';
import { readAdminKubeConfig } from '../../scripts/controlplane/controlplane.ts';
import { asUser, controlPlaneDir, eventually, suffix } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';

const w = fx.world('foundation');
const a = w.clients;

describe('the local control plane', () => {
  it('serves the pinned Kubernetes version and is healthy', async () => {
    const { server } = readAdminKubeConfig(controlPlaneDir());
    assert.match(server, /^https:\/\/127\.0\.0\.1:\d+$/);
    const version = await a.kc.makeApiClient(VersionApi).getCode();
    assert.match(version.gitVersion, /^v1\.3[67]\.\d+$/);
  });

  it('installs the three CRDs with status subresources, selectable field and printer columns', async () => {
    const ext = a.kc.makeApiClient(ApiextensionsV1Api);
    const { group, version, plural } = IDENTITY_RESOURCE;
    const id = await ext.readCustomResourceDefinition({ name: `${plural}.${group}` });
    assert.equal(id.spec.scope, 'Cluster');
    const v = id.spec.versions.find((x) => x.name === version)!;
    assert.ok(v.subresources?.status);
    assert.deepEqual(
      v.additionalPrinterColumns?.map((c) => c.name),
      ['Ready', 'Secret-Namespace', 'Secret', 'Namespaces', 'Age'],
    );
    for (const kind of DEFAULT_CONSUMER_KINDS) {
      const crd = await ext.readCustomResourceDefinition({ name: `${kind.plural}.${kind.group}` });
      assert.equal(crd.spec.scope, 'Namespaced');
      const cv = crd.spec.versions.find((x) => x.name === kind.version)!;
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
    await assert.rejects(w.create(fx.identity(w.name('cel-empty'), fx.allowedNamespaces({}))), (err: unknown) => {
      assert.equal(apiStatus(err), 422);
      assert.match(String((err as { body?: unknown }).body), /allowedNamespaces: \{\} is ambiguous/);
      return true;
    });
    for (const form of fx.VALID_ALLOWED_NAMESPACES) {
      await w.create(fx.identity(w.name('cel-ok'), fx.allowedNamespaces(form)));
    }
  });

  it('finds a consumer by field selector on spec.identityRef.name', async () => {
    const n = await w.namespace();
    await w.create(
      fx.consumer('uses-aws', fx.inNamespace(n), fx.identityRef('aws'), fx.consumerSpec({ region: 'eu-1' })),
    );
    await w.create(fx.consumer('uses-gcp', fx.inNamespace(n), fx.identityRef('gcp')));
    const list = await consumerObjects(a, TERRAFORM_CLUSTER).list({
      namespace: n,
      fieldSelector: 'spec.identityRef.name=aws',
    });
    assert.deepEqual(
      list.items?.map((i) => i.metadata.name),
      ['uses-aws'],
    );
    assert.equal(list.items?.[0]!.spec?.region, 'eu-1', 'unknown spec fields are preserved');
  });

  it('authenticates minted users by client certificate and enforces RBAC (403 without, 200 through a group)', async () => {
    const n = await w.namespace();
    await w.create(fx.sourceSecret('creds', fx.inNamespace(n), fx.data({ k: 'v' })));
    const nobody = await asUser(`nobody-${suffix()}`);
    await assert.rejects(
      nobody.core.readNamespacedSecret({ name: 'creds', namespace: n }),
      (e: unknown) => apiStatus(e) === 403,
    );
    assert.equal((await a.core.readNamespacedSecret({ name: 'creds', namespace: n })).metadata?.name, 'creds');

    const group = `readers-${suffix()}`;
    const rbac = a.kc.makeApiClient(RbacAuthorizationV1Api);
    await rbac.createNamespacedRole({
      namespace: n,
      body: {
        metadata: { name: 'read-creds' },
        rules: [{ apiGroups: [''], resources: ['secrets'], verbs: ['get'], resourceNames: ['creds'] }],
      },
    });
    await rbac.createNamespacedRoleBinding({
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
    const n = await w.namespace();
    const owner = await w.create(fx.consumer('owner', fx.inNamespace(n), fx.ofKind(TERRAFORM_MACHINE)));
    const dependent = await w.create(fx.sourceSecret('dependent', fx.inNamespace(n), fx.ownedBy(owner)));
    await w.delete(owner);
    await eventually(
      'the garbage collector to delete the dependent Secret',
      async () => (await w.read(dependent)) === undefined,
      120_000,
    );
    t.diagnostic('dependent Secret garbage-collected');
  });
});
