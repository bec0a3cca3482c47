/**
 * RBAC proof (SPEC §13): the rendered ServiceAccounts and (Cluster)Roles are
 * applied to the real API server; each function runs a real flow as its ServiceAccount
 * (TokenRequest token) and works; SubjectAccessReviews and real requests show what each
 * account cannot do.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import { API_VERSION, GROUP, IDENTITY_KIND, IDENTITY_PLURAL, VERSION } from '../../functions/lib/api.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { apiStatus, makeClients, type Clients } from '../../functions/lib/kube.ts';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { render } from '../../scripts/tools/kustomize.ts';
import { installRbac, serviceAccountKubeConfig, serviceAccountToken } from '../../scripts/lib/serviceaccount.ts';
import { admin, controlPlaneDir, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { pingEvent, postEvents } from '../helpers/events.ts';
import { captureLogger } from '../helpers/logs.ts';
import { MANAGER_SERVICE_ACCOUNT, postPrepare } from '../helpers/prepare.ts';

const a = admin();
const ns = namespaces('rbac');
// Labels this file's identities, so its identity-status ping refreshes only them: unscoped, it
// would write the status of every test file's identities (other files share the control
// plane and assert on those statuses while they run).
const SCOPE_LABEL = 'captf-test/rbac';
const SCOPE_VALUE = suffix();
const ACCOUNTS = ['captf-admission', 'captf-mirror-sync', 'captf-identity-status', 'captf-event-sources'] as const;
/** The functions' accounts, and the provider manager's, which the shipped prepare role is bound to. */
type Account = (typeof ACCOUNTS)[number] | typeof MANAGER_SERVICE_ACCOUNT;

let home: string;
let rendered: KubernetesObject[] = [];
const kcs = new Map<Account, { path: string; kc: KubeConfig; clients: Clients }>();
let cleanup: () => Promise<void>;
const running: FunctionHandle[] = [];

before(async () => {
  home = await ns.create();
  const objects: KubernetesObject[] = await render('manifests/overlays/without-crds');
  rendered = objects;
  const rbac = await installRbac(a.kc, objects, { namespace: home, suffix: suffix() });
  cleanup = rbac.cleanup;
  // The provider's manager is not in the manifests (the provider installs it); its binding is.
  await a.core.createNamespacedServiceAccount({
    namespace: home,
    body: { metadata: { name: MANAGER_SERVICE_ACCOUNT } },
  });
  for (const sa of ACCOUNTS) {
    const { path, kc } = await serviceAccountKubeConfig(a.kc, {
      namespace: home,
      name: sa,
      dir: `${controlPlaneDir()}/users`,
    });
    kcs.set(sa, { path, kc, clients: makeClients(kc) });
  }
});
after(async () => {
  for (const f of running) await f.close();
  await cleanup?.();
});

/** Asks the API server (SubjectAccessReview) whether `sa` may do `verb` on a resource. */
async function can(
  sa: Account,
  verb: string,
  resource: string,
  opts: { group?: string; namespace?: string; subresource?: string } = {},
): Promise<boolean> {
  const r = await a.authz.createSubjectAccessReview({
    body: {
      spec: {
        user: `system:serviceaccount:${home}:${sa}`,
        groups: ['system:serviceaccounts', `system:serviceaccounts:${home}`, 'system:authenticated'],
        resourceAttributes: {
          verb,
          resource,
          group: opts.group ?? '',
          namespace: opts.namespace ?? 'anywhere',
          subresource: opts.subresource ?? '',
        },
      },
    },
  });
  return r.status?.allowed === true;
}

const INFRA = GROUP;
// [account, verb, resource, group, subresource, allowed]
const TABLE: [Account, string, string, string, string, boolean][] = [
  ['captf-admission', 'create', 'subjectaccessreviews', 'authorization.k8s.io', '', true],
  ['captf-admission', 'list', 'terraformclusters', INFRA, '', true],
  ['captf-admission', 'list', 'terraformmachines', INFRA, '', true],
  ['captf-admission', 'get', 'secrets', '', '', false],
  ['captf-admission', 'list', 'secrets', '', '', false],
  ['captf-admission', 'get', IDENTITY_PLURAL, INFRA, '', false],
  ['captf-admission', 'watch', 'terraformclusters', INFRA, '', false],
  // Namespace labels for the revocation warnings: get only.
  ['captf-admission', 'get', 'namespaces', '', '', true],
  ...(['list', 'watch', 'create', 'update', 'patch', 'delete'] as const).map(
    (v): [Account, string, string, string, string, boolean] => ['captf-admission', v, 'namespaces', '', '', false],
  ),
  ['captf-mirror-sync', 'get', 'terraformclusters', INFRA, '', true],
  ['captf-mirror-sync', 'patch', 'terraformclusters', INFRA, 'status', true],
  ['captf-mirror-sync', 'patch', 'terraformmachines', INFRA, 'status', true],
  ['captf-mirror-sync', 'update', 'terraformclusters', INFRA, '', false],
  ['captf-mirror-sync', 'patch', 'terraformclusters', INFRA, '', false],
  ['captf-mirror-sync', 'delete', 'terraformclusters', INFRA, '', false],
  ['captf-mirror-sync', 'get', IDENTITY_PLURAL, INFRA, '', true],
  ['captf-mirror-sync', 'patch', IDENTITY_PLURAL, INFRA, 'status', false],
  ['captf-mirror-sync', 'get', 'namespaces', '', '', true],
  ['captf-mirror-sync', 'list', 'namespaces', '', '', true],
  ['captf-mirror-sync', 'update', 'namespaces', '', '', false],
  ['captf-mirror-sync', 'create', 'secrets', '', '', true],
  ['captf-mirror-sync', 'update', 'secrets', '', '', true],
  ['captf-mirror-sync', 'delete', 'secrets', '', '', true],
  ['captf-mirror-sync', 'watch', 'secrets', '', '', false],
  ['captf-mirror-sync', 'patch', 'secrets', '', '', false],
  ['captf-mirror-sync', 'create', 'events', 'events.k8s.io', '', true],
  ['captf-mirror-sync', 'create', 'configmaps', '', '', false],
  // prepare's callers (SPEC §5): their token and their permission.
  ['captf-mirror-sync', 'create', 'tokenreviews', 'authentication.k8s.io', '', true],
  ['captf-mirror-sync', 'create', 'subjectaccessreviews', 'authorization.k8s.io', '', true],
  ['captf-mirror-sync', 'create', 'terraformclusters', INFRA, 'prepare', false],
  // The manager may prepare the shipped consumer kinds and do nothing else this project grants.
  [MANAGER_SERVICE_ACCOUNT, 'create', 'terraformclusters', INFRA, 'prepare', true],
  [MANAGER_SERVICE_ACCOUNT, 'create', 'terraformmachines', INFRA, 'prepare', true],
  [MANAGER_SERVICE_ACCOUNT, 'get', 'terraformclusters', INFRA, 'prepare', false],
  [MANAGER_SERVICE_ACCOUNT, 'create', 'terraformclusters', INFRA, '', false],
  [MANAGER_SERVICE_ACCOUNT, 'create', IDENTITY_PLURAL, INFRA, 'prepare', false],
  [MANAGER_SERVICE_ACCOUNT, 'get', 'secrets', '', '', false],
  [MANAGER_SERVICE_ACCOUNT, 'create', 'tokenreviews', 'authentication.k8s.io', '', false],
  ['captf-identity-status', 'list', IDENTITY_PLURAL, INFRA, '', true],
  ['captf-identity-status', 'get', IDENTITY_PLURAL, INFRA, '', false],
  ['captf-identity-status', 'watch', IDENTITY_PLURAL, INFRA, '', false],
  ['captf-identity-status', 'patch', IDENTITY_PLURAL, INFRA, 'status', true],
  ['captf-identity-status', 'update', IDENTITY_PLURAL, INFRA, '', false],
  ['captf-identity-status', 'list', 'terraformclusters', INFRA, '', true],
  ['captf-identity-status', 'get', 'secrets', '', '', true],
  ['captf-identity-status', 'create', 'secrets', '', '', false],
  ['captf-identity-status', 'update', 'secrets', '', '', false],
  ['captf-identity-status', 'patch', 'secrets', '', '', false],
  ['captf-identity-status', 'delete', 'secrets', '', '', false],
  ['captf-identity-status', 'patch', 'terraformclusters', INFRA, 'status', false],
  ...(['terraformclusters', 'terraformmachines', IDENTITY_PLURAL] as const).flatMap((r) =>
    (['get', 'list', 'watch', 'create', 'update', 'patch', 'delete'] as const).map(
      (v): [Account, string, string, string, string, boolean] => [
        'captf-event-sources',
        v,
        r,
        INFRA,
        '',
        ['get', 'list', 'watch'].includes(v),
      ],
    ),
  ),
  ['captf-event-sources', 'watch', 'namespaces', '', '', true],
  ['captf-event-sources', 'delete', 'namespaces', '', '', false],
  ['captf-event-sources', 'get', 'secrets', '', '', false],
  ['captf-event-sources', 'list', 'secrets', '', '', false],
  ['captf-event-sources', 'list', 'configmaps', '', '', false],
  ['captf-event-sources', 'patch', 'terraformclusters', INFRA, 'status', false],
];

describe('least-privilege RBAC from the rendered manifests', () => {
  it('SubjectAccessReviews: each ServiceAccount may do exactly what docs/deploy-knative.md lists', async () => {
    const wrong: string[] = [];
    for (const [sa, verb, resource, group, subresource, allowed] of TABLE) {
      const got = await can(sa, verb, resource, { group, subresource });
      if (got !== allowed)
        wrong.push(
          `${sa} ${verb} ${group || 'core'}/${resource}${subresource ? `/${subresource}` : ''}: ${got}, expected ${allowed}`,
        );
    }
    assert.deepEqual(wrong, []);
  });

  it("the prepare ClusterRole grants exactly create on the consumer kinds' prepare, bound to the manager's ServiceAccount", () => {
    const role = rendered.find((o) => o.kind === 'ClusterRole' && o.metadata?.name === 'captf-prepare') as
      (KubernetesObject & { rules?: unknown[] }) | undefined;
    assert.deepEqual(role?.rules, [
      { apiGroups: [INFRA], resources: ['terraformclusters/prepare', 'terraformmachines/prepare'], verbs: ['create'] },
    ]);
    const binding = rendered.find((o) => o.kind === 'ClusterRoleBinding' && o.metadata?.name === 'captf-prepare') as
      (KubernetesObject & { roleRef?: unknown; subjects?: unknown[] }) | undefined;
    assert.deepEqual(binding?.roleRef, {
      apiGroup: 'rbac.authorization.k8s.io',
      kind: 'ClusterRole',
      name: 'captf-prepare',
    });
    assert.deepEqual(binding?.subjects, [
      { kind: 'ServiceAccount', name: MANAGER_SERVICE_ACCOUNT, namespace: 'captf-system' },
    ]);
  });

  it('the admission ClusterRole grants exactly SubjectAccessReviews, consumer lists and namespace gets', () => {
    const role = rendered.find((o) => o.kind === 'ClusterRole' && o.metadata?.name === 'captf-admission') as
      (KubernetesObject & { rules?: unknown[] }) | undefined;
    assert.deepEqual(role?.rules, [
      { apiGroups: ['authorization.k8s.io'], resources: ['subjectaccessreviews'], verbs: ['create'] },
      { apiGroups: [INFRA], resources: ['terraformclusters', 'terraformmachines'], verbs: ['list'] },
      { apiGroups: [''], resources: ['namespaces'], verbs: ['get'] },
    ]);
  });

  it('real requests: admission cannot read Secrets; identity-status cannot write them; the event-source account only reads what it sources', async () => {
    const n = await ns.create();
    await a.core.createNamespacedSecret({
      namespace: n,
      body: { metadata: { name: 'creds' }, stringData: { k: 'v' } },
    });
    const forbidden = (e: unknown) => apiStatus(e) === 403;
    const adm = kcs.get('captf-admission')!.clients;
    await assert.rejects(adm.core.readNamespacedSecret({ name: 'creds', namespace: n }), forbidden);
    await assert.rejects(adm.core.listNamespacedSecret({ namespace: n }), forbidden);

    const st = kcs.get('captf-identity-status')!.clients;
    assert.equal((await st.core.readNamespacedSecret({ name: 'creds', namespace: n })).metadata?.name, 'creds');
    await assert.rejects(
      st.core.createNamespacedSecret({ namespace: n, body: { metadata: { name: 'x' }, stringData: { k: 'v' } } }),
      forbidden,
    );
    await assert.rejects(
      st.core.replaceNamespacedSecret({
        name: 'creds',
        namespace: n,
        body: { metadata: { name: 'creds' }, stringData: { k: 'changed' } },
      }),
      forbidden,
    );
    await assert.rejects(st.core.deleteNamespacedSecret({ name: 'creds', namespace: n }), forbidden);

    const src = kcs.get('captf-event-sources')!.clients;
    // (eventually: right after the control plane starts, a list may get 429 "storage is
    // (re)initializing" while the watch cache fills.)
    await eventually('the event-source account lists consumers, identities and namespaces', async () => {
      await src.custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural: 'terraformclusters' });
      await src.custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL });
      await src.core.listNamespace();
      return true;
    });
    await assert.rejects(src.core.readNamespacedSecret({ name: 'creds', namespace: n }), forbidden);
    await assert.rejects(src.core.listNamespacedConfigMap({ namespace: n }), forbidden);
    await assert.rejects(
      src.custom.createNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace: n,
        plural: 'terraformclusters',
        body: { apiVersion: API_VERSION, kind: 'TerraformCluster', metadata: { name: 'x' }, spec: {} },
      }),
      forbidden,
    );
    // The secret is unchanged.
    const s = await a.core.readNamespacedSecret({ name: 'creds', namespace: n });
    assert.equal(Buffer.from(s.data!.k!, 'base64').toString(), 'v');
  });
});

describe('each function works as its ServiceAccount', () => {
  /** An identity, its source Secret and a consumer that uses it, all unique to one test. */
  async function world() {
    const operator = await ns.create();
    const tenant = await ns.create();
    const idName = `rbac-${suffix()}`;
    await a.core.createNamespacedSecret({
      namespace: operator,
      body: { metadata: { name: 'creds' }, stringData: { token: 'x' } },
    });
    ns.onCleanup(() =>
      a.custom.deleteClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, name: idName }),
    );
    await a.custom.createClusterCustomObject({
      group: GROUP,
      version: VERSION,
      plural: IDENTITY_PLURAL,
      body: {
        apiVersion: API_VERSION,
        kind: IDENTITY_KIND,
        metadata: { name: idName, labels: { [SCOPE_LABEL]: SCOPE_VALUE } },
        spec: { secretRef: { name: 'creds', namespace: operator }, allowedNamespaces: { list: [tenant] } },
      },
    });
    const consumer = `tc-${suffix()}`;
    await a.custom.createNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: tenant,
      plural: 'terraformclusters',
      body: {
        apiVersion: API_VERSION,
        kind: 'TerraformCluster',
        metadata: { name: consumer },
        spec: { identityRef: { name: idName } },
      },
    });
    return { operator, tenant, idName, consumer };
  }

  async function startAs<T extends { start(o: object): Promise<FunctionHandle> }>(
    mod: Promise<T>,
    sa: Account,
    env: NodeJS.ProcessEnv = {},
  ) {
    const { logger, lines } = captureLogger(sa);
    const fn = await (await mod).start({ port: 0, host: '127.0.0.1', kubeconfig: kcs.get(sa)!.kc, logger, env });
    running.push(fn);
    return { url: `http://127.0.0.1:${fn.port}`, lines };
  }

  it("mirror-sync: prepare, called with the manager's audience-bound token, creates the mirror and writes conditions", async () => {
    const w = await world();
    const { url, lines } = await startAs(import('../../functions/mirror-sync/index.ts'), 'captf-mirror-sync');
    // The manager's token (`kubectl create token captf-controller-manager --audience captf-mirror-sync`),
    // allowed by the rendered binding; mirror-sync checks it with its own account's RBAC.
    const token = await serviceAccountToken(a.kc, {
      namespace: home,
      name: MANAGER_SERVICE_ACCOUNT,
      audience: 'captf-mirror-sync',
    });
    const req = { apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: w.tenant, name: w.consumer };
    assert.equal((await postPrepare(url, req, undefined)).status, 401, 'no token, no prepare');
    const res = await postPrepare(url, req, `Bearer ${token}`);
    assert.equal(res.status, 200, `${res.text}\n${lines.join('\n')}`);
    assert.equal(res.body.mirror, mirrorName(w.idName));
    assert.ok(!lines.join('\n').includes(token), 'the token appears in no log line');
    const mirror = await a.core.readNamespacedSecret({ name: mirrorName(w.idName), namespace: w.tenant });
    assert.equal(mirror.metadata?.ownerReferences?.[0]?.name, w.consumer);
    const obj = (await a.custom.getNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: w.tenant,
      plural: 'terraformclusters',
      name: w.consumer,
    })) as { status?: { conditions?: { type: string; status: string }[] } };
    assert.ok(
      obj.status?.conditions?.some((c) => c.type === 'CredentialsMirrored' && c.status === 'True'),
      JSON.stringify(obj.status),
    );
    assert.deepEqual(
      lines.filter((l) => /forbidden|HTTP 403|\(403\)/i.test(l)),
      [],
    );
  });

  it('identity-status: a ping sets Ready and status.namespaces', async () => {
    const w = await world();
    const { url, lines } = await startAs(import('../../functions/identity-status/index.ts'), 'captf-identity-status', {
      CAPTF_STATUS_IDENTITY_SELECTOR: `${SCOPE_LABEL}=${SCOPE_VALUE}`,
    });
    const r = await postEvents(`${url}/`, pingEvent('captf-identity-status'));
    assert.ok(r.status >= 200 && r.status < 300, `${r.status} ${r.text}\n${lines.join('\n')}`);
    const id = await eventually('Ready=True on the identity', async () => {
      const o = (await a.custom.getClusterCustomObject({
        group: GROUP,
        version: VERSION,
        plural: IDENTITY_PLURAL,
        name: w.idName,
      })) as { status?: { conditions?: { type: string; status: string }[]; namespaces?: string[] } };
      return o.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') && o.status.namespaces?.length
        ? o
        : undefined;
    });
    assert.deepEqual(id.status?.namespaces, [w.tenant]);
    assert.deepEqual(
      lines.filter((l) => /forbidden|HTTP 403|\(403\)/i.test(l)),
      [],
    );
  });

  it('admission: a SubjectAccessReview decides, and a deletion in use is refused', async () => {
    const w = await world();
    const { url } = await startAs(import('../../functions/admission/index.ts'), 'captf-admission', {
      CAPTF_ADMISSION_PLAIN_HTTP: 'true',
    });
    const review = (operation: string, username: string, groups: string[], object: unknown, oldObject?: unknown) => ({
      apiVersion: 'admission.k8s.io/v1',
      kind: 'AdmissionReview',
      request: {
        uid: randomUUID(),
        operation,
        userInfo: { username, groups },
        kind: { group: GROUP, version: VERSION, kind: IDENTITY_KIND },
        resource: { group: GROUP, version: VERSION, resource: IDENTITY_PLURAL },
        name: (object as { metadata: { name: string } } | null)?.metadata.name ?? w.idName,
        object,
        oldObject: oldObject ?? null,
        dryRun: false,
      },
    });
    const post = async (body: unknown) => {
      const res = await fetch(`${url}/validate`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      return (
        (await res.json()) as { response: { allowed: boolean; status?: { message?: string }; warnings?: string[] } }
      ).response;
    };
    const identity = {
      apiVersion: API_VERSION,
      kind: IDENTITY_KIND,
      metadata: { name: `new-${suffix()}` },
      spec: { secretRef: { name: 'creds', namespace: w.operator }, allowedNamespaces: { list: [w.tenant] } },
    };
    assert.equal(
      (await post(review('CREATE', `nobody-${suffix()}`, ['system:authenticated'], identity))).allowed,
      false,
    );
    assert.equal(
      (await post(review('CREATE', 'admin', ['system:masters', 'system:authenticated'], identity))).allowed,
      true,
    );
    // DELETE: the live consumer lookup (list with a field selector) runs with this account.
    const old = {
      apiVersion: API_VERSION,
      kind: IDENTITY_KIND,
      metadata: { name: w.idName },
      spec: { secretRef: { name: 'creds', namespace: w.operator } },
      status: {},
    };
    const del = await post(review('DELETE', 'admin', ['system:masters'], null, old));
    assert.equal(del.allowed, false);
    assert.match(del.status?.message ?? '', new RegExp(w.tenant));
    // A narrowing from a selector: the consumer lookup, then a get of the tenant namespace's
    // labels, both as this account; the warning names the namespace (not "could not compute").
    const everywhere = { ...old, spec: { ...old.spec, allowedNamespaces: { selector: {} } } };
    const nowhere = { ...old, spec: { ...old.spec, allowedNamespaces: { list: [] } } };
    const narrowing = await post(review('UPDATE', `nobody-${suffix()}`, ['system:authenticated'], nowhere, everywhere));
    assert.equal(narrowing.allowed, true);
    assert.deepEqual(narrowing.warnings, [
      `identity "${w.idName}": spec.allowedNamespaces no longer allows 1 namespace in use: ${w.tenant} (1 consumer); ` +
        '1 consumer there will lose its credentials',
    ]);
  });
});
