/**
 * identity-status against the real control plane (SPEC §9, §12): the function runs in-process
 * as a minted client-certificate user with least-privilege RBAC, driven over HTTP with
 * CloudEvents shaped as Knative sends them. Its pings are scoped to this file's identities
 * with CAPTF_STATUS_IDENTITY_SELECTOR so other test files' identities are never touched.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { PatchStrategy, RbacAuthorizationV1Api, setHeaderOptions } from '@kubernetes/client-node';
import { CloudEvent } from 'cloudevents';
import pLimit from 'p-limit';
import {
  API_VERSION,
  DEFAULT_CONSUMER_KINDS,
  GROUP,
  IDENTITY_KIND,
  IDENTITY_PLURAL,
  VERSION,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import { getCondition } from '../../functions/lib/conditions.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { apiStatus, type Clients } from '../../functions/lib/kube.ts';
import { ANNOTATION_IDENTITY, LABEL_MIRRORED, desiredMirror, mirrorName } from '../../functions/lib/mirror.ts';
import { start } from '../../functions/identity-status/index.ts';
import { METADATA, METADATA_LIST, refreshIdentity } from '../../functions/identity-status/refresh.ts';
import { admin, asUser, controlPlaneDir, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { apiServerEvent, pingEvent, postEvents } from '../helpers/events.ts';
import { spawnFunction } from '../helpers/process.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';
import { scanLater } from '../helpers/leaks.ts';

const a = admin();
const rbac = a.kc.makeApiClient(RbacAuthorizationV1Api);
const ns = namespaces('idst');
const run = suffix();
const SCOPE_LABEL = 'captf-test/identity-status';
const cap = captureLogger('identity-status');
const planted: string[] = [];
const responses: string[] = [];
scanLater('HTTP answers', () => responses.join('\n'));
const fnUserName = `idst-fn-${run}`;
let fnUser: Clients & { kubeconfigPath: string };
let fn: FunctionHandle;
let url: string;
let src: string; // namespace of readable source Secrets
let locked: string; // namespace whose Secrets the function may list but not get

const b64 = (s: string) => Buffer.from(s).toString('base64');
const idName = (what: string) => `idst-${what}-${run}-${suffix()}`;

async function createSource(namespace: string, name: string): Promise<Record<string, string>> {
  const value = sentinel();
  planted.push(value);
  const data = { AWS_SECRET_ACCESS_KEY: b64(value), TF_VAR_token: b64(sentinel()) };
  planted.push(Buffer.from(data.TF_VAR_token, 'base64').toString());
  await a.core.createNamespacedSecret({ namespace, body: { metadata: { name }, data } });
  return data;
}

async function createIdentity(
  name: string,
  secretRef: { name: string; namespace: string },
  labels: Record<string, string> = {},
): Promise<TerraformClusterIdentity> {
  ns.onCleanup(() =>
    a.custom.deleteClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, name }),
  );
  return (await a.custom.createClusterCustomObject({
    group: GROUP,
    version: VERSION,
    plural: IDENTITY_PLURAL,
    body: {
      apiVersion: API_VERSION,
      kind: IDENTITY_KIND,
      metadata: { name, labels: { [SCOPE_LABEL]: run, ...labels } },
      spec: { secretRef, allowedNamespaces: { selector: {} } },
    },
  })) as TerraformClusterIdentity;
}

const getIdentity = async (name: string) =>
  (await a.custom.getClusterCustomObject({
    group: GROUP,
    version: VERSION,
    plural: IDENTITY_PLURAL,
    name,
  })) as TerraformClusterIdentity;

async function createConsumer(
  namespace: string,
  plural: 'terraformclusters' | 'terraformmachines',
  name: string,
  identity: string,
  finalizers?: string[],
): Promise<void> {
  const kind = plural === 'terraformclusters' ? 'TerraformCluster' : 'TerraformMachine';
  await a.custom.createNamespacedCustomObject({
    group: GROUP,
    version: VERSION,
    namespace,
    plural,
    body: {
      apiVersion: API_VERSION,
      kind,
      metadata: { name, ...(finalizers ? { finalizers } : {}) },
      spec: { identityRef: { name: identity } },
    },
  });
}

const deleteConsumer = (namespace: string, plural: string, name: string) =>
  a.custom.deleteNamespacedCustomObject({ group: GROUP, version: VERSION, namespace, plural, name });

/** A mirror as mirror-sync would write it, created directly as admin, owned by a ConfigMap that stays. */
async function createMirror(namespace: string, identity: string, sourceData: Record<string, string>): Promise<void> {
  const cm = await a.core.createNamespacedConfigMap({ namespace, body: { metadata: { name: `holder-${suffix()}` } } });
  const owner = { apiVersion: 'v1', kind: 'ConfigMap', name: cm.metadata!.name!, uid: cm.metadata!.uid! };
  await a.core.createNamespacedSecret({ namespace, body: desiredMirror(identity, namespace, sourceData, owner) });
}

async function ping(): Promise<{ status: number; body: Record<string, unknown> }> {
  const r = await postEvents(url, pingEvent('identity-status'));
  responses.push(r.text);
  return { status: r.status, body: r.body as Record<string, unknown> };
}

async function identityEvent(
  name: string,
  mode: 'resource' | 'ref' = 'ref',
  verb: 'add' | 'update' | 'delete' = 'update',
) {
  const obj =
    mode === 'resource'
      ? {
          ...(await getIdentity(name).catch(() => ({ metadata: { name } }))),
          apiVersion: API_VERSION,
          kind: IDENTITY_KIND,
        }
      : { apiVersion: API_VERSION, kind: IDENTITY_KIND, metadata: { name } };
  const r = await postEvents(url, apiServerEvent(obj as never, mode, verb, IDENTITY_PLURAL));
  responses.push(r.text);
  return { status: r.status, body: r.body as Record<string, unknown> };
}

const ready = (i: TerraformClusterIdentity) => getCondition(i.status?.conditions, 'Ready');

/**
 * Sends `send` (a ping or an identity event), then asserts the identity's status.namespaces
 * is `want`. One send must be enough, except while a mirror of the identity lingers in a
 * namespace that lost its last consumer: mirror-sync instances of other test files, resyncing
 * the whole shared control plane at the same time, may have mirrored for these consumers,
 * and such a mirror (which counts, SPEC §9) stays until Kubernetes' garbage collector
 * deletes it after its owners. Then the send is repeated until the mirror is gone.
 */
async function namespacesSettle(name: string, want: string[], send: () => Promise<unknown>): Promise<void> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    // Read before the send: a send made when no such mirror existed must give `want` exactly.
    const lingering = (
      await a.core.listSecretForAllNamespaces({
        labelSelector: `${LABEL_MIRRORED}=true`,
        fieldSelector: `metadata.name=${mirrorName(name)}`,
      })
    ).items
      .filter((m) => m.metadata?.annotations?.[ANNOTATION_IDENTITY] === name && !want.includes(m.metadata.namespace!))
      .map((m) => m.metadata!.namespace!);
    await send();
    const got = (await getIdentity(name)).status?.namespaces;
    if (JSON.stringify(got) === JSON.stringify(want)) return;
    if (lingering.length === 0) assert.deepEqual(got, want, 'one refresh after the last user left is enough');
    if (Date.now() > deadline) assert.deepEqual(got, want, `mirrors still in ${lingering.join(', ')} after 60 s`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** Microseconds since the epoch of an audit timestamp (`…:05.123456Z`). */
const micros = (ts: string): number => {
  const m = /^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?Z$/.exec(ts)!;
  return Date.parse(`${m[1]}Z`) * 1000 + Number((m[2] ?? '').padEnd(6, '0').slice(0, 6));
};

/** [received, completed] of every completed `get` of the named Secrets by `user`, from the audit log. */
function sourceGets(user: string, names: readonly string[]): [number, number][] {
  const out: [number, number][] = [];
  for (const line of readFileSync(join(controlPlaneDir(), 'logs', 'audit.log'), 'utf8').split('\n')) {
    if (!line.includes(user)) continue;
    const e = JSON.parse(line) as {
      stage?: string;
      verb?: string;
      user?: { username?: string };
      objectRef?: { resource?: string; name?: string };
      requestReceivedTimestamp: string;
      stageTimestamp: string;
    };
    if (
      e.stage === 'ResponseComplete' &&
      e.verb === 'get' &&
      e.user?.username === user &&
      e.objectRef?.resource === 'secrets' &&
      names.includes(e.objectRef.name ?? '')
    ) {
      out.push([micros(e.requestReceivedTimestamp), micros(e.stageTimestamp)]);
    }
  }
  return out;
}

/** Most intervals open at one instant (an interval ending when another starts does not overlap it). */
function maxOverlap(intervals: readonly [number, number][]): number {
  const points = intervals
    .flatMap(
      ([s, e]) =>
        [
          [s, 1],
          [e, -1],
        ] as const,
    )
    .sort((x, y) => x[0] - y[0] || x[1] - y[1]);
  let open = 0;
  let max = 0;
  for (const [, d] of points) max = Math.max(max, (open += d));
  return max;
}

describe('identity-status (SPEC §9)', () => {
  before(async () => {
    src = await ns.create();
    locked = await ns.create();
    // Least privilege for the function's user: read identities and write their status,
    // list consumers, list Secrets cluster-wide (mirror metadata), and get Secrets only in
    // `src` through a Role. `locked` Secrets can be listed but not fetched: a real 403.
    const role = `idst-fn-${run}`;
    await rbac.createClusterRole({
      body: {
        metadata: { name: role },
        rules: [
          { apiGroups: [GROUP], resources: [IDENTITY_PLURAL], verbs: ['get', 'list', 'watch'] },
          { apiGroups: [GROUP], resources: [`${IDENTITY_PLURAL}/status`], verbs: ['patch'] },
          { apiGroups: [GROUP], resources: ['terraformclusters', 'terraformmachines'], verbs: ['list'] },
          { apiGroups: [''], resources: ['secrets'], verbs: ['list'] },
        ],
      },
    });
    ns.onCleanup(() => rbac.deleteClusterRole({ name: role }));
    await rbac.createClusterRoleBinding({
      body: {
        metadata: { name: role },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: role },
        subjects: [{ kind: 'User', name: fnUserName, apiGroup: 'rbac.authorization.k8s.io' }],
      },
    });
    ns.onCleanup(() => rbac.deleteClusterRoleBinding({ name: role }));
    await rbac.createNamespacedRole({
      namespace: src,
      body: { metadata: { name: 'get-sources' }, rules: [{ apiGroups: [''], resources: ['secrets'], verbs: ['get'] }] },
    });
    await rbac.createNamespacedRoleBinding({
      namespace: src,
      body: {
        metadata: { name: 'get-sources' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'get-sources' },
        subjects: [{ kind: 'User', name: fnUserName, apiGroup: 'rbac.authorization.k8s.io' }],
      },
    });
    await createSource(src, 'rbac-probe');
    fnUser = await asUser(fnUserName);
    await eventually(
      'RBAC to let the function user get Secrets in the source namespace',
      async () =>
        (await fnUser.core.readNamespacedSecret({ namespace: src, name: 'rbac-probe' })).metadata?.name ===
        'rbac-probe',
    );
    fn = await start({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: fnUser.kc,
      logger: cap.logger,
      env: { CAPTF_STATUS_IDENTITY_SELECTOR: `${SCOPE_LABEL}=${run}`, CAPTF_STATUS_CONCURRENCY: '8' },
    });
    url = `http://127.0.0.1:${fn.port}/`;
  });

  after(async () => {
    await fn?.close();
    assertNoSecret(cap.lines.join('\n'), planted, 'identity-status log');
    assertNoSecret(responses.join('\n'), planted, 'identity-status HTTP responses');
  });

  readyTests();
  usageTests();
  writeTests();
  httpTests();
  processTests();
});

/** Ready from the source Secret: found, deleted, unreadable. */
function readyTests(): void {
  it('sets Ready=True/SecretFound with observedGeneration when the source exists, and SecretNotFound after it is deleted', async () => {
    const name = idName('present');
    await createSource(src, `${name}-src`);
    const created = await createIdentity(name, { name: `${name}-src`, namespace: src });
    const r = await ping();
    assert.equal(r.status, 200, JSON.stringify(r.body));
    let id = await getIdentity(name);
    assert.equal(ready(id)?.status, 'True');
    assert.equal(ready(id)?.reason, 'SecretFound');
    assert.equal(ready(id)?.observedGeneration, created.metadata.generation);
    assert.match(ready(id)!.message, new RegExp(`${src}/${name}-src`));
    assert.deepEqual(id.status?.namespaces, []);

    // A spec change bumps the generation; the next refresh reports it as observed.
    await a.custom.patchClusterCustomObject({
      group: GROUP,
      version: VERSION,
      plural: IDENTITY_PLURAL,
      name,
      body: [{ op: 'replace', path: '/spec/allowedNamespaces', value: { list: ['x'] } }],
    });
    await identityEvent(name, 'resource', 'update');
    id = await getIdentity(name);
    assert.equal(ready(id)?.observedGeneration, (created.metadata.generation ?? 1) + 1);

    await a.core.deleteNamespacedSecret({ namespace: src, name: `${name}-src` });
    const ev = await identityEvent(name, 'ref', 'update');
    assert.equal(ev.status, 200, JSON.stringify(ev.body));
    id = await getIdentity(name);
    assert.equal(ready(id)?.status, 'False');
    assert.equal(ready(id)?.reason, 'SecretNotFound');

    await createSource(src, `${name}-src`);
    await ping();
    assert.equal(ready(await getIdentity(name))?.reason, 'SecretFound');
  });

  it('sets Ready=False/SecretUnreadable when the function user may list but not get the source (a real 403)', async () => {
    const name = idName('locked');
    await createSource(locked, `${name}-src`);
    await assert.rejects(
      fnUser.core.readNamespacedSecret({ namespace: locked, name: `${name}-src` }),
      (e: unknown) => apiStatus(e) === 403,
    );
    await createIdentity(name, { name: `${name}-src`, namespace: locked });
    const r = await identityEvent(name, 'resource', 'add');
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const c = ready(await getIdentity(name));
    assert.equal(c?.status, 'False');
    assert.equal(c?.reason, 'SecretUnreadable');
    assert.match(c!.message, /403/);
    const line = cap.entries().find((e) => e.message === 'identity refreshed' && e.identity === name);
    assert.equal(line?.reason, 'SecretUnreadable');
  });
}

/** status.namespaces: which namespaces use the identity. */
function usageTests(): void {
  it('status.namespaces follows consumers of several kinds appearing and disappearing across namespaces', async () => {
    const name = idName('users');
    await createSource(src, `${name}-src`);
    await createIdentity(name, { name: `${name}-src`, namespace: src });
    const [n1, n2, n3] = [await ns.create(), await ns.create(), await ns.create()];
    await createConsumer(n1, 'terraformclusters', 'c1', name);
    await createConsumer(n2, 'terraformmachines', 'm1', name);
    await createConsumer(n2, 'terraformclusters', 'c2', name);
    await createConsumer(n3, 'terraformmachines', 'm-other', `someone-else-${run}`);
    await ping();
    assert.deepEqual((await getIdentity(name)).status?.namespaces, [n1, n2].sort());

    await createConsumer(n3, 'terraformclusters', 'c3', name);
    await identityEvent(name);
    assert.deepEqual((await getIdentity(name)).status?.namespaces, [n1, n2, n3].sort());

    await deleteConsumer(n2, 'terraformmachines', 'm1');
    await ping();
    assert.deepEqual((await getIdentity(name)).status?.namespaces, [n1, n2, n3].sort(), 'n2 still has c2');
    await deleteConsumer(n2, 'terraformclusters', 'c2');
    await deleteConsumer(n1, 'terraformclusters', 'c1');
    await namespacesSettle(name, [n3], ping);
    await deleteConsumer(n3, 'terraformclusters', 'c3');
    await namespacesSettle(name, [], () => identityEvent(name, 'resource', 'update'));
    const lines = cap.entries().filter((e) => e.message === 'identity refreshed' && e.identity === name);
    assert.ok(lines.some((l) => (l.changed as string[]).includes('namespaces')));
  });

  it('a deleting consumer still counts until it is gone', async () => {
    const name = idName('deleting');
    await createSource(src, `${name}-src`);
    await createIdentity(name, { name: `${name}-src`, namespace: src });
    const n = await ns.create();
    const hold = 'captf.io/test-hold';
    await createConsumer(n, 'terraformmachines', 'dying', name, [hold]);
    await deleteConsumer(n, 'terraformmachines', 'dying');
    const obj = (await a.custom.getNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: n,
      plural: 'terraformmachines',
      name: 'dying',
    })) as { metadata: { deletionTimestamp?: string } };
    assert.ok(obj.metadata.deletionTimestamp, 'the consumer is deleting');
    await ping();
    assert.deepEqual((await getIdentity(name)).status?.namespaces, [n]);
    await identityEvent(name);
    assert.deepEqual((await getIdentity(name)).status?.namespaces, [n], 'the single-identity path counts it too');

    await a.custom.patchNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: n,
      plural: 'terraformmachines',
      name: 'dying',
      body: [{ op: 'remove', path: '/metadata/finalizers' }],
    });
    await eventually('the consumer to be gone', async () => {
      try {
        await a.custom.getNamespacedCustomObject({
          group: GROUP,
          version: VERSION,
          namespace: n,
          plural: 'terraformmachines',
          name: 'dying',
        });
        return false;
      } catch (e) {
        return apiStatus(e) === 404;
      }
    });
    await namespacesSettle(name, [], ping);
  });

  it('a namespace that only still holds a mirror counts; Secrets that are not its mirror do not; mirrors are never changed', async () => {
    const name = idName('mirror');
    const data = await createSource(src, `${name}-src`);
    await createIdentity(name, { name: `${name}-src`, namespace: src });
    const [withMirror, notOurs, otherIdentity] = [await ns.create(), await ns.create(), await ns.create()];
    await createMirror(withMirror, name, data);
    // Same name without the mirrored label: someone else's Secret.
    await a.core.createNamespacedSecret({
      namespace: notOurs,
      body: { metadata: { name: mirrorName(name), annotations: { [ANNOTATION_IDENTITY]: name } }, data },
    });
    // Labeled, but annotated for another identity.
    await a.core.createNamespacedSecret({
      namespace: otherIdentity,
      body: {
        metadata: {
          name: mirrorName(name),
          labels: { [LABEL_MIRRORED]: 'true' },
          annotations: { [ANNOTATION_IDENTITY]: `other-${run}` },
        },
        data,
      },
    });
    const rvBefore = (await a.core.readNamespacedSecret({ namespace: withMirror, name: mirrorName(name) })).metadata
      ?.resourceVersion;

    await ping();
    assert.deepEqual((await getIdentity(name)).status?.namespaces, [withMirror]);
    await identityEvent(name, 'ref', 'add');
    assert.deepEqual((await getIdentity(name)).status?.namespaces, [withMirror], 'the single-identity path agrees');
    assert.equal(
      (await a.core.readNamespacedSecret({ namespace: withMirror, name: mirrorName(name) })).metadata?.resourceVersion,
      rvBefore,
      'the mirror was not written',
    );

    // The function reads Secrets as metadata only: the API server never sends it their data.
    const asList = await fnUser.core.listSecretForAllNamespaces(
      { labelSelector: `${LABEL_MIRRORED}=true`, fieldSelector: `metadata.name=${mirrorName(name)}` },
      METADATA_LIST,
    );
    assert.deepEqual(asList.items.map((s) => s.metadata?.namespace).sort(), [withMirror, otherIdentity].sort());
    assert.ok(asList.items.every((s) => s.data === undefined && s.metadata?.annotations?.[ANNOTATION_IDENTITY]));
    const one = await fnUser.core.readNamespacedSecret({ namespace: src, name: `${name}-src` }, METADATA);
    assert.equal(one.metadata?.name, `${name}-src`);
    assert.equal(one.data, undefined);

    await a.core.deleteNamespacedSecret({ namespace: withMirror, name: mirrorName(name) });
    await ping();
    assert.deepEqual((await getIdentity(name)).status?.namespaces, []);
  });
}

/** How the status is written: no empty writes, other writers' conditions kept, conflicts redone. */
function writeTests(): void {
  it('repeated refreshes with no change leave the identity resourceVersion unchanged', async () => {
    const name = idName('steady');
    const data = await createSource(src, `${name}-src`);
    await createIdentity(name, { name: `${name}-src`, namespace: src });
    const n = await ns.create();
    await createConsumer(n, 'terraformclusters', 'c', name);
    await createMirror(await ns.create(), name, data);
    await ping();
    const first = await getIdentity(name);
    assert.equal(first.status?.namespaces?.length, 2);
    for (const send of [ping, () => identityEvent(name, 'ref'), () => identityEvent(name, 'resource'), ping]) {
      const r = await send();
      assert.equal(r.status, 200);
    }
    const later = await getIdentity(name);
    assert.equal(later.metadata.resourceVersion, first.metadata.resourceVersion);
    assert.equal(ready(later)?.lastTransitionTime, ready(first)?.lastTransitionTime);
    const lines = cap.entries().filter((e) => e.message === 'identity refreshed' && e.identity === name);
    assert.ok(lines.length >= 5);
    assert.deepEqual(
      lines.slice(1).map((l) => l.changed),
      [[], [], [], []],
    );
  });

  it("keeps other writers' condition types when it changes Ready", async () => {
    const name = idName('others');
    await createSource(src, `${name}-src`);
    await createIdentity(name, { name: `${name}-src`, namespace: src });
    await ping();
    await a.custom.patchClusterCustomObjectStatus(
      {
        group: GROUP,
        version: VERSION,
        plural: IDENTITY_PLURAL,
        name,
        fieldManager: 'another-controller',
        body: {
          apiVersion: API_VERSION,
          kind: IDENTITY_KIND,
          metadata: { name },
          status: {
            conditions: [
              {
                type: 'Audited',
                status: 'True',
                reason: 'Checked',
                message: 'ok',
                lastTransitionTime: '2026-01-01T00:00:00Z',
              },
            ],
          },
        },
      },
      setHeaderOptions('Content-Type', PatchStrategy.ServerSideApply),
    );
    await a.core.deleteNamespacedSecret({ namespace: src, name: `${name}-src` });
    await identityEvent(name);
    const id = await getIdentity(name);
    assert.equal(ready(id)?.reason, 'SecretNotFound');
    assert.equal(getCondition(id.status?.conditions, 'Audited')?.reason, 'Checked');
  });

  it('a write on a stale read conflicts and is redone from fresh lookups (resourceVersion precondition)', async () => {
    const name = idName('stale');
    await createSource(src, `${name}-src`);
    const stale = await createIdentity(name, { name: `${name}-src`, namespace: src });
    const n = await ns.create();
    await createConsumer(n, 'terraformclusters', 'c', name);
    // Someone writes the identity after our read: its resourceVersion moves on.
    await a.custom.patchClusterCustomObject({
      group: GROUP,
      version: VERSION,
      plural: IDENTITY_PLURAL,
      name,
      body: [{ op: 'add', path: '/metadata/annotations', value: { touched: 'yes' } }],
    });
    const result = await refreshIdentity(
      {
        clients: fnUser,
        consumerKinds: DEFAULT_CONSUMER_KINDS,
        concurrency: 1,
        identitySelector: `${SCOPE_LABEL}=${run}`,
        logger: cap.logger,
      },
      stale,
      { consumerNamespaces: ['stale-namespace'], mirrorNamespaces: [] },
    );
    assert.equal(result.outcome, 'refreshed');
    const id = await getIdentity(name);
    assert.deepEqual(id.status?.namespaces, [n], 'the stale usage was never written');
    assert.equal(ready(id)?.reason, 'SecretFound');
  });
}

/** The function's HTTP interface. */
function httpTests(): void {
  it('answers over HTTP: binary, structured and batch events, healthz, 4xx with a reason, gone identities', async () => {
    const name = idName('http');
    await createSource(src, `${name}-src`);
    await createIdentity(name, { name: `${name}-src`, namespace: src });
    const obj = { apiVersion: API_VERSION, kind: IDENTITY_KIND, metadata: { name } };
    const structured = await postEvents(url, apiServerEvent(obj, 'ref', 'add', IDENTITY_PLURAL), 'structured');
    assert.equal(structured.status, 200, structured.text);
    assert.equal(ready(await getIdentity(name))?.reason, 'SecretFound');

    const batch = await postEvents(
      url,
      [
        apiServerEvent(obj, 'ref', 'update', IDENTITY_PLURAL),
        apiServerEvent({ ...obj, metadata: { name: `missing-${run}` } }, 'resource', 'delete', IDENTITY_PLURAL),
      ],
      'batch',
    );
    responses.push(batch.text);
    assert.equal(batch.status, 200, batch.text);
    const body = batch.body as { refreshed: number; gone: number; identities: { identity: string; outcome: string }[] };
    assert.equal(body.refreshed, 1);
    assert.equal(body.gone, 1);
    assert.deepEqual(
      body.identities.map((i) => i.outcome),
      ['refreshed', 'gone'],
    );

    // SPEC §12 batch policy: a bad element (no type) and an event about another kind do not
    // drop the good event; the answer is 400 naming them, with the good one's result.
    const good = apiServerEvent(obj, 'ref', 'update', IDENTITY_PLURAL).toJSON() as Record<string, unknown>;
    const noType = { ...good, id: 'bad-1', type: undefined };
    const other = apiServerEvent(
      { apiVersion: API_VERSION, kind: 'TerraformCluster', metadata: { name: 'c', namespace: src } },
      'ref',
      'add',
      'terraformclusters',
    ).toJSON();
    const mixed = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/cloudevents-batch+json' },
      body: JSON.stringify([good, noType, other]),
    });
    const mixedText = await mixed.text();
    responses.push(mixedText);
    assert.equal(mixed.status, 400, mixedText);
    const mixedBody = JSON.parse(mixedText) as { error: string; refreshed: number; identities: { identity: string }[] };
    assert.equal(mixedBody.refreshed, 1);
    assert.deepEqual(
      mixedBody.identities.map((i) => i.identity),
      [name],
    );
    assert.match(mixedBody.error, /batch\[1\]/);
    assert.match(mixedBody.error, /TerraformCluster/);

    // An identity outside the configured selector is out of scope, like a gone one.
    const outside = `idst-outside-${run}`;
    ns.onCleanup(() =>
      a.custom.deleteClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, name: outside }),
    );
    await a.custom.createClusterCustomObject({
      group: GROUP,
      version: VERSION,
      plural: IDENTITY_PLURAL,
      body: {
        apiVersion: API_VERSION,
        kind: IDENTITY_KIND,
        metadata: { name: outside },
        spec: { secretRef: { name: 'x', namespace: src } },
      },
    });
    const out = await identityEvent(outside);
    assert.equal((out.body as { gone: number }).gone, 1);
    assert.equal((await getIdentity(outside)).status, undefined, 'out-of-scope identity untouched');

    const health = await fetch(`${url}healthz`);
    assert.equal(health.status, 200);

    const cases: [string, () => Promise<{ status: number; body: unknown; text: string }>, number, RegExp][] = [
      [
        'no CloudEvent',
        () =>
          fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' }).then(
            async (r) => ({ status: r.status, text: await r.text(), body: null }),
          ),
        400,
        /CloudEvent/,
      ],
      [
        'binary event without ce-id',
        () =>
          fetch(url, {
            method: 'POST',
            headers: { 'ce-type': 'dev.knative.sources.ping', 'ce-source': '/x', 'ce-specversion': '1.0' },
            body: '',
          }).then(async (r) => ({ status: r.status, text: await r.text(), body: null })),
        400,
        /lacks required header\(s\) ce-id/,
      ],
      [
        'malformed JSON',
        () =>
          fetch(url, {
            method: 'POST',
            headers: { 'content-type': 'application/cloudevents+json' },
            body: '{"specversion":',
          }).then(async (r) => ({ status: r.status, text: await r.text(), body: null })),
        400,
        /./,
      ],
      [
        'unknown type',
        () =>
          postEvents(
            url,
            new CloudEvent<unknown>({ specversion: '1.0', id: '1', source: '/x', type: 'com.example.nope', data: {} }),
          ),
        400,
        /unsupported event type/,
      ],
      [
        'event naming no object',
        () =>
          postEvents(
            url,
            new CloudEvent<unknown>({
              specversion: '1.0',
              id: '1',
              source: '/x',
              type: 'dev.knative.apiserver.ref.add',
              datacontenttype: 'application/json',
              data: { foo: 1 },
            }),
          ),
        400,
        /must name the object/,
      ],
      [
        'event about a consumer',
        () =>
          postEvents(
            url,
            apiServerEvent(
              { apiVersion: API_VERSION, kind: 'TerraformCluster', metadata: { name: 'c', namespace: src } },
              'ref',
              'add',
              'terraformclusters',
            ),
          ),
        422,
        /TerraformClusterIdentity/,
      ],
      [
        'too large',
        () =>
          fetch(url, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: 'x'.repeat(4 * 1024 * 1024),
          }).then(async (r) => ({ status: r.status, text: await r.text(), body: null })),
        413,
        /too large/,
      ],
    ];
    for (const [what, send, status, message] of cases) {
      const r = await send();
      responses.push(r.text);
      assert.equal(r.status, status, `${what}: ${r.text}`);
      assert.match(JSON.parse(r.text).error, message, what);
    }
    // Still serving after all of that.
    assert.equal((await identityEvent(name)).status, 200);
  });
}

/** As a process, and at scale. */
function processTests(): void {
  it('runs as a process (npm run function -- identity-status): PORT, JSON logs, and SIGTERM lets an in-flight ping finish', async () => {
    const name = idName('process');
    await createSource(src, `${name}-src`);
    await createIdentity(name, { name: `${name}-src`, namespace: src });
    const fn = await spawnFunction('identity-status', {
      KUBECONFIG: fnUser.kubeconfigPath,
      CAPTF_STATUS_IDENTITY_SELECTOR: `${SCOPE_LABEL}=${run}`,
      LOG_LEVEL: 'info',
    });
    const { port, exited } = fn;
    try {
      const pending = postEvents(`http://127.0.0.1:${port}/`, pingEvent('identity-status'));
      await eventually('the ping to be in flight', async () => fn.output().includes('"identity refreshed"'), 30_000);
      fn.child.kill('SIGTERM');
      const r = await pending;
      responses.push(r.text);
      assert.equal(r.status, 200, r.text);
      assert.equal(await exited, 0, fn.output());
      assert.match(fn.output(), /"message":"stopped"/);
      assert.equal(ready(await getIdentity(name))?.reason, 'SecretFound');
      cap.lines.push(...fn.output().split('\n').filter(Boolean)); // scanned for planted values in after()
    } finally {
      fn.kill();
    }
  });

  it('refreshes 200 identities in one ping with bounded concurrency', async (t) => {
    const bulk = `bulk-${run}`;
    ns.onCleanup(() =>
      a.custom.deleteCollectionClusterCustomObject({
        group: GROUP,
        version: VERSION,
        plural: IDENTITY_PLURAL,
        labelSelector: `captf-test/bulk=${bulk}`,
      }),
    );
    const data = await createSource(src, `${bulk}-src`);
    const [n1, n2, n3] = [await ns.create(), await ns.create(), await ns.create()];
    const names = Array.from({ length: 200 }, (_, i) => `idst-${bulk}-${String(i).padStart(3, '0')}`);
    const expected = new Map<string, { reason: string; namespaces: string[] }>();
    const limit = pLimit(10);
    await limit.map(names, async (name, i) => {
      // Every third identity points at a missing Secret; every 10th has consumers; every 25th a mirror.
      const secret = i % 3 === 0 ? `${bulk}-missing` : `${bulk}-src`;
      await createIdentity(name, { name: secret, namespace: src }, { 'captf-test/bulk': bulk });
      const used: string[] = [];
      if (i % 10 === 0) {
        await createConsumer(n1, 'terraformclusters', `c-${i}`, name);
        await createConsumer(n2, 'terraformmachines', `m-${i}`, name);
        used.push(n1, n2);
      }
      if (i % 25 === 0) {
        await createMirror(n3, name, data);
        used.push(n3);
      }
      expected.set(name, { reason: i % 3 === 0 ? 'SecretNotFound' : 'SecretFound', namespaces: used.sort() });
    });
    const t0 = performance.now();
    const r = await ping();
    const ms = Math.round(performance.now() - t0);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.ok((r.body.refreshed as number) >= 200);
    t.diagnostic(
      `one ping refreshed ${String(r.body.refreshed)} identities (${String(r.body.written)} written) in ${ms} ms with ${String(r.body.apiCalls)} API calls`,
    );
    const list = (await a.custom.listClusterCustomObject({
      group: GROUP,
      version: VERSION,
      plural: IDENTITY_PLURAL,
      labelSelector: `captf-test/bulk=${bulk}`,
    })) as { items: TerraformClusterIdentity[] };
    assert.equal(list.items.length, 200);
    for (const id of list.items) {
      const want = expected.get(id.metadata.name!)!;
      assert.equal(ready(id)?.reason, want.reason, id.metadata.name);
      assert.deepEqual(id.status?.namespaces, want.namespaces, id.metadata.name);
    }
    // A ping's API calls are a few lists plus one GET (and maybe one PATCH) per identity, not a list per identity.
    assert.ok((r.body.apiCalls as number) < 3 * (r.body.refreshed as number), `apiCalls ${String(r.body.apiCalls)}`);
    // Bounded concurrency, seen by the API server: the audit log's source-Secret GETs of this
    // ping never overlap more than CAPTF_STATUS_CONCURRENCY (8) at a time.
    const gets = await eventually(
      'the 200 source GETs in the audit log',
      async () => {
        const found = sourceGets(fnUserName, [`${bulk}-src`, `${bulk}-missing`]);
        return found.length >= 200 ? found : undefined;
      },
      30_000,
    );
    const overlap = maxOverlap(gets);
    t.diagnostic(`at most ${overlap} source GETs were in flight at once (limit 8)`);
    assert.ok(overlap >= 1 && overlap <= 8, `overlap ${overlap}`);
    const again = await ping();
    assert.equal(again.body.written, 0, 'nothing changed, nothing written');
    t.diagnostic(
      `a second ping with no change: ${String(again.body.written)} written, ${String(again.body.apiCalls)} API calls`,
    );
  });
}
