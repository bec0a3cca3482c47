/**
 * RBAC proof (SPEC §13): the rendered ServiceAccounts and (Cluster)Roles are
 * applied to the real API server; each function runs a real flow as its ServiceAccount
 * (TokenRequest token) and works; SubjectAccessReviews and real requests show what each
 * account cannot do.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import type { KubernetesObject } from '@kubernetes/client-node';
import {
  IDENTITY_RESOURCE,
  TERRAFORM_CLUSTER,
  TERRAFORM_MACHINE,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { apiStatus } from '../../functions/lib/kube.ts';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { consumerObjects, identities } from '../../functions/lib/objects.ts';
import { render } from '../../scripts/tools/kustomize.ts';
import { installRbac, serviceAccountToken } from '../../scripts/lib/serviceaccount.ts';
import { eventually, suffix } from '../helpers/cluster.ts';
import { pingEvent, postEvents, UNSIGNED_EVENTS } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';
import { captureLogger } from '../helpers/logs.ts';
import { MANAGER_SERVICE_ACCOUNT, postPrepare, prepareTarget } from '../helpers/prepare.ts';

const w = fx.world('rbac');
const a = w.clients;
// Labels this file's identities, so its identity-status ping refreshes only them: unscoped, it
// would write the status of every test file's identities (other files share the control
// plane and assert on those statuses while they run).
const SCOPE_LABEL = 'captf-test/rbac';
const SCOPE_VALUE = suffix();
/** The functions' accounts, and the provider manager's, which the shipped prepare role is bound to. */
type Sa = fx.Account | typeof MANAGER_SERVICE_ACCOUNT;
const { group: INFRA, plural: IDS } = IDENTITY_RESOURCE;
const [TCS, TMS] = [TERRAFORM_CLUSTER.plural, TERRAFORM_MACHINE.plural];

/** Where every account's rendered RBAC is installed at once, for the SubjectAccessReviews. */
let home: string;
let rendered: KubernetesObject[] = [];
const running: FunctionHandle[] = [];

before(async () => {
  home = await w.namespace();
  rendered = await render('manifests/overlays/without-crds');
  const rbac = await installRbac(a.kc, rendered, { namespace: home, suffix: suffix() });
  w.onCleanup(rbac.cleanup);
  // The provider's manager is not in the manifests (the provider installs it); its binding is.
  await a.core.createNamespacedServiceAccount({
    namespace: home,
    body: { metadata: { name: MANAGER_SERVICE_ACCOUNT } },
  });
});
after(async () => {
  for (const f of running) await f.close();
});

const accounts = new Map<fx.Account, Promise<fx.AccountClients>>();
/** Clients acting as a function's ServiceAccount with exactly its rendered RBAC (installed once for the file). */
function as(sa: fx.Account): Promise<fx.AccountClients> {
  if (!accounts.has(sa)) accounts.set(sa, w.account(sa));
  return accounts.get(sa)!;
}

/** Asks the API server (SubjectAccessReview) whether `sa` in `home` may do `verb` on a resource. */
async function can(
  sa: Sa,
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

/** The rendered object of `kind` named `name`. */
const renderedObject = <T>(kind: string, name: string) =>
  rendered.find((o) => o.kind === kind && o.metadata?.name === name) as (KubernetesObject & T) | undefined;

// [account, verb, resource, group, subresource, allowed]
const TABLE: [Sa, string, string, string, string, boolean][] = [
  ['captf-admission', 'create', 'subjectaccessreviews', 'authorization.k8s.io', '', true],
  ['captf-admission', 'list', TCS, INFRA, '', true],
  ['captf-admission', 'list', TMS, INFRA, '', true],
  ['captf-admission', 'get', 'secrets', '', '', false],
  ['captf-admission', 'list', 'secrets', '', '', false],
  ['captf-admission', 'get', IDS, INFRA, '', false],
  ['captf-admission', 'watch', TCS, INFRA, '', false],
  // Namespace labels for the revocation warnings: get only.
  ['captf-admission', 'get', 'namespaces', '', '', true],
  ...(['list', 'watch', 'create', 'update', 'patch', 'delete'] as const).map(
    (v): [Sa, string, string, string, string, boolean] => ['captf-admission', v, 'namespaces', '', '', false],
  ),
  ['captf-mirror-sync', 'get', TCS, INFRA, '', true],
  ['captf-mirror-sync', 'patch', TCS, INFRA, 'status', true],
  ['captf-mirror-sync', 'patch', TMS, INFRA, 'status', true],
  ['captf-mirror-sync', 'update', TCS, INFRA, '', false],
  ['captf-mirror-sync', 'patch', TCS, INFRA, '', false],
  ['captf-mirror-sync', 'delete', TCS, INFRA, '', false],
  ['captf-mirror-sync', 'get', IDS, INFRA, '', true],
  ['captf-mirror-sync', 'patch', IDS, INFRA, 'status', false],
  ['captf-mirror-sync', 'get', 'namespaces', '', '', true],
  ['captf-mirror-sync', 'list', 'namespaces', '', '', true],
  ['captf-mirror-sync', 'update', 'namespaces', '', '', false],
  ['captf-mirror-sync', 'create', 'secrets', '', '', true],
  ['captf-mirror-sync', 'update', 'secrets', '', '', true],
  ['captf-mirror-sync', 'delete', 'secrets', '', '', true],
  ['captf-mirror-sync', 'watch', 'secrets', '', '', false],
  ['captf-mirror-sync', 'patch', 'secrets', '', '', true],
  ['captf-mirror-sync', 'create', 'events', 'events.k8s.io', '', true],
  ['captf-mirror-sync', 'create', 'configmaps', '', '', false],
  // prepare's callers (SPEC §5): their token and their permission.
  ['captf-mirror-sync', 'create', 'tokenreviews', 'authentication.k8s.io', '', true],
  ['captf-identity-status', 'create', 'tokenreviews', 'authentication.k8s.io', '', true],
  ['captf-mirror-sync', 'create', 'subjectaccessreviews', 'authorization.k8s.io', '', true],
  ['captf-mirror-sync', 'create', TCS, INFRA, 'prepare', false],
  // The manager may prepare the shipped consumer kinds and do nothing else this project grants.
  [MANAGER_SERVICE_ACCOUNT, 'create', TCS, INFRA, 'prepare', true],
  [MANAGER_SERVICE_ACCOUNT, 'create', TMS, INFRA, 'prepare', true],
  [MANAGER_SERVICE_ACCOUNT, 'get', TCS, INFRA, 'prepare', false],
  [MANAGER_SERVICE_ACCOUNT, 'create', TCS, INFRA, '', false],
  [MANAGER_SERVICE_ACCOUNT, 'create', IDS, INFRA, 'prepare', false],
  [MANAGER_SERVICE_ACCOUNT, 'get', 'secrets', '', '', false],
  [MANAGER_SERVICE_ACCOUNT, 'create', 'tokenreviews', 'authentication.k8s.io', '', false],
  ['captf-identity-status', 'list', IDS, INFRA, '', true],
  ['captf-identity-status', 'get', IDS, INFRA, '', false],
  ['captf-identity-status', 'watch', IDS, INFRA, '', false],
  ['captf-identity-status', 'patch', IDS, INFRA, 'status', true],
  ['captf-identity-status', 'update', IDS, INFRA, '', false],
  ['captf-identity-status', 'list', TCS, INFRA, '', true],
  ['captf-identity-status', 'get', 'secrets', '', '', true],
  ['captf-identity-status', 'create', 'secrets', '', '', false],
  ['captf-identity-status', 'update', 'secrets', '', '', false],
  ['captf-identity-status', 'patch', 'secrets', '', '', false],
  ['captf-identity-status', 'delete', 'secrets', '', '', false],
  ['captf-identity-status', 'patch', TCS, INFRA, 'status', false],
  ...([TCS, TMS, IDS] as const).flatMap((r) =>
    (['get', 'list', 'watch', 'create', 'update', 'patch', 'delete'] as const).map(
      (v): [Sa, string, string, string, string, boolean] => [
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
  ['captf-event-sources', 'patch', TCS, INFRA, 'status', false],
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

  it('the event functions may list EventPolicies in their own namespace only, and nothing more of them (SPEC §12)', async () => {
    const wrong: string[] = [];
    for (const sa of ['captf-mirror-sync', 'captf-identity-status'] as const)
      for (const [verb, namespace, allowed] of [
        ['list', home, true],
        ['list', 'anywhere', false],
        ['get', home, false],
        ['watch', home, false],
        ['create', home, false],
      ] as const) {
        const got = await can(sa, verb, 'eventpolicies', { group: 'eventing.knative.dev', namespace });
        if (got !== allowed) wrong.push(`${sa} ${verb} eventpolicies in ${namespace}: ${got}, expected ${allowed}`);
      }
    assert.deepEqual(wrong, []);
  });

  it("the prepare ClusterRole grants exactly create on the consumer kinds' prepare, bound to the manager's ServiceAccount", () => {
    assert.deepEqual(renderedObject<{ rules?: unknown[] }>('ClusterRole', 'captf-prepare')?.rules, [
      { apiGroups: [INFRA], resources: [`${TCS}/prepare`, `${TMS}/prepare`], verbs: ['create'] },
    ]);
    const binding = renderedObject<{ roleRef?: unknown; subjects?: unknown[] }>('ClusterRoleBinding', 'captf-prepare');
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
    assert.deepEqual(renderedObject<{ rules?: unknown[] }>('ClusterRole', 'captf-admission')?.rules, [
      { apiGroups: ['authorization.k8s.io'], resources: ['subjectaccessreviews'], verbs: ['create'] },
      { apiGroups: [INFRA], resources: [TCS, TMS], verbs: ['list'] },
      { apiGroups: [''], resources: ['namespaces'], verbs: ['get'] },
    ]);
  });

  it('real requests: admission cannot read Secrets; identity-status cannot write them; the event-source account only reads what it sources', async () => {
    const n = await w.namespace();
    const creds = await w.create(fx.sourceSecret('creds', fx.inNamespace(n), fx.data({ k: 'v' })));
    const forbidden = (e: unknown) => apiStatus(e) === 403;
    const adm = (await as('captf-admission')).clients;
    await assert.rejects(adm.core.readNamespacedSecret({ name: 'creds', namespace: n }), forbidden);
    await assert.rejects(adm.core.listNamespacedSecret({ namespace: n }), forbidden);

    const st = (await as('captf-identity-status')).clients;
    assert.equal((await st.core.readNamespacedSecret({ name: 'creds', namespace: n })).metadata?.name, 'creds');
    await assert.rejects(st.core.createNamespacedSecret({ namespace: n, body: fx.sourceSecret('x') }), forbidden);
    await assert.rejects(
      st.core.replaceNamespacedSecret({
        name: 'creds',
        namespace: n,
        body: fx.sourceSecret('creds', fx.data({ k: 'changed' })),
      }),
      forbidden,
    );
    await assert.rejects(st.core.deleteNamespacedSecret({ name: 'creds', namespace: n }), forbidden);

    const src = (await as('captf-event-sources')).clients;
    // (eventually: right after the control plane starts, a list may get 429 "storage is
    // (re)initializing" while the watch cache fills.)
    await eventually('the event-source account lists consumers, identities and namespaces', async () => {
      await consumerObjects(src, TERRAFORM_CLUSTER).list();
      await identities(src).list();
      await src.core.listNamespace();
      return true;
    });
    await assert.rejects(src.core.readNamespacedSecret({ name: 'creds', namespace: n }), forbidden);
    await assert.rejects(src.core.listNamespacedConfigMap({ namespace: n }), forbidden);
    await assert.rejects(
      consumerObjects(src, TERRAFORM_CLUSTER).create(fx.consumer('x', fx.inNamespace(n))),
      forbidden,
    );
    // The secret is unchanged.
    const s = await w.read(creds);
    assert.equal(Buffer.from(s!.data!.k!, 'base64').toString(), 'v');
  });
});

describe('each function works as its ServiceAccount', () => {
  /** An identity in this file's scope, its source Secret and a consumer that uses it, all unique to one test. */
  async function inUse() {
    const [operator, tenant] = [await w.namespace(), await w.namespace()];
    await w.create(fx.sourceSecret('creds', fx.inNamespace(operator)));
    const id = await w.create(
      fx.identity(
        w.name('id'),
        fx.secretRef(operator, 'creds'),
        fx.allowList(tenant),
        fx.labels({ [SCOPE_LABEL]: SCOPE_VALUE }),
      ),
    );
    const c = await w.create(fx.consumer('tc', fx.inNamespace(tenant), fx.identityRef(id.metadata.name)));
    return { operator, tenant, id, idName: id.metadata.name!, c };
  }

  async function startAs<T extends { start(o: object): Promise<FunctionHandle> }>(
    mod: Promise<T>,
    sa: fx.Account,
    env: NodeJS.ProcessEnv = {},
  ) {
    const { logger, lines } = captureLogger(sa);
    const kubeconfig = (await as(sa)).clients.kc;
    const fn = await (
      await mod
    ).start({ port: 0, host: '127.0.0.1', kubeconfig, logger, env: { ...UNSIGNED_EVENTS, ...env } });
    running.push(fn);
    return { url: `http://127.0.0.1:${fn.port}`, lines };
  }

  /** Log lines that tell of a permission error. */
  const refusals = (lines: string[]) => lines.filter((l) => /forbidden|HTTP 403|\(403\)/i.test(l));

  it("mirror-sync: prepare, called with the manager's audience-bound token, creates the mirror and writes conditions", async () => {
    const { tenant, idName, c } = await inUse();
    const { url, lines } = await startAs(import('../../functions/mirror-sync/index.ts'), 'captf-mirror-sync');
    // The manager's token (`kubectl create token captf-controller-manager --audience captf-mirror-sync`),
    // allowed by the rendered binding; mirror-sync checks it with its own account's RBAC.
    const token = await serviceAccountToken(a.kc, {
      namespace: home,
      name: MANAGER_SERVICE_ACCOUNT,
      audience: 'captf-mirror-sync',
    });
    const req = prepareTarget(c);
    assert.equal((await postPrepare(url, req, undefined)).status, 401, 'no token, no prepare');
    const res = await postPrepare(url, req, `Bearer ${token}`);
    assert.equal(res.status, 200, `${res.text}\n${lines.join('\n')}`);
    assert.equal(res.body.mirror, mirrorName(idName));
    assert.ok(!lines.join('\n').includes(token), 'the token appears in no log line');
    const mirror = await w.read(fx.mirrorOf(idName, fx.inNamespace(tenant)));
    assert.equal(mirror?.metadata?.ownerReferences?.[0]?.name, c.metadata.name);
    const status = (await w.read(c))?.status;
    assert.equal(fx.conditionOf({ status }, 'CredentialsMirrored')?.status, 'True', JSON.stringify(status));
    assert.deepEqual(refusals(lines), []);
  });

  it('identity-status: a ping sets Ready and status.namespaces', async () => {
    const { tenant, id } = await inUse();
    const { url, lines } = await startAs(import('../../functions/identity-status/index.ts'), 'captf-identity-status', {
      CAPTF_STATUS_IDENTITY_SELECTOR: `${SCOPE_LABEL}=${SCOPE_VALUE}`,
    });
    const r = await postEvents(`${url}/`, pingEvent('captf-identity-status'));
    assert.ok(r.status >= 200 && r.status < 300, `${r.status} ${r.text}\n${lines.join('\n')}`);
    const got = await eventually('Ready=True on the identity', async () => {
      const o = await w.read(id);
      return o && fx.conditionOf(o, 'Ready')?.status === 'True' && o.status?.namespaces?.length ? o : undefined;
    });
    assert.deepEqual(got.status?.namespaces, [tenant]);
    assert.deepEqual(refusals(lines), []);
  });

  it('admission: a SubjectAccessReview decides, and a deletion in use is refused', async () => {
    const { operator, tenant, idName } = await inUse();
    const { url } = await startAs(import('../../functions/admission/index.ts'), 'captf-admission', {
      CAPTF_ADMISSION_PLAIN_HTTP: 'true',
    });
    const { group, version, kind, plural } = IDENTITY_RESOURCE;
    const review = (
      operation: string,
      username: string,
      groups: string[],
      object: TerraformClusterIdentity | null,
      oldObject?: TerraformClusterIdentity,
    ) => ({
      apiVersion: 'admission.k8s.io/v1',
      kind: 'AdmissionReview',
      request: {
        uid: randomUUID(),
        operation,
        userInfo: { username, groups },
        kind: { group, version, kind },
        resource: { group, version, resource: plural },
        name: object?.metadata.name ?? idName,
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
    const fresh = fx.identity(w.name('new'), fx.secretRef(operator, 'creds'), fx.allowList(tenant));
    assert.equal((await post(review('CREATE', `nobody-${suffix()}`, ['system:authenticated'], fresh))).allowed, false);
    assert.equal(
      (await post(review('CREATE', 'admin', ['system:masters', 'system:authenticated'], fresh))).allowed,
      true,
    );
    /** The identity in use, as the API server would hand it to admission (with an empty status). */
    const asReviewed = (...mods: fx.Modifier<TerraformClusterIdentity>[]) => ({
      ...fx.identity(idName, fx.secretRef(operator, 'creds'), ...mods),
      status: {},
    });
    // DELETE: the live consumer lookup (list with a field selector) runs with this account.
    const del = await post(review('DELETE', 'admin', ['system:masters'], null, asReviewed()));
    assert.equal(del.allowed, false);
    assert.match(del.status?.message ?? '', new RegExp(tenant));
    // A narrowing from a selector: the consumer lookup, then a get of the tenant namespace's
    // labels, both as this account; the warning names the namespace (not "could not compute").
    const everywhere = asReviewed(fx.allowSelector());
    const nowhere = asReviewed(fx.allowList());
    const narrowing = await post(review('UPDATE', `nobody-${suffix()}`, ['system:authenticated'], nowhere, everywhere));
    assert.equal(narrowing.allowed, true);
    assert.deepEqual(narrowing.warnings, [
      `identity "${idName}": spec.allowedNamespaces no longer allows 1 namespace in use: ${tenant} (1 consumer); ` +
        '1 consumer there will lose its credentials',
    ]);
  });
});
