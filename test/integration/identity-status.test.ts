/**
 * identity-status against the real control plane (SPEC §9, §12): the function runs in-process
 * as its ServiceAccount with the RBAC the rendered manifests give it, less `get` on Secrets
 * cluster-wide (granted back in one namespace only, so a Secret elsewhere gives a real 403),
 * driven over HTTP with CloudEvents shaped as Knative sends them. Its pings are scoped to this
 * file's identities with CAPTF_STATUS_IDENTITY_SELECTOR so other test files' identities are
 * never touched.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { RbacAuthorizationV1Api, type V1PolicyRule, type V1Secret } from '@kubernetes/client-node';
import { CloudEvent } from 'cloudevents';
import pLimit from 'p-limit';
import {
  DEFAULT_CONSUMER_KINDS,
  IDENTITY_RESOURCE,
  TERRAFORM_CLUSTER,
  TERRAFORM_MACHINE,
  type Condition,
  type Consumer,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import { getCondition } from '../../functions/lib/conditions.ts';
import { EVENT_ANSWER_ID_HEADER, EVENT_ANSWERS, type FunctionHandle } from '../../functions/lib/http.ts';
import { apiStatus, METADATA, METADATA_LIST } from '../../functions/lib/kube.ts';
import { ANNOTATION_IDENTITY, LABEL_MIRRORED, desiredMirror, mirrorName } from '../../functions/lib/mirror.ts';
import { identities } from '../../functions/lib/objects.ts';
import { start } from '../../functions/identity-status/index.ts';
import { refreshIdentity } from '../../functions/identity-status/refresh.ts';
import { controlPlaneDir, eventually, suffix } from '../helpers/cluster.ts';
import { apiServerEvent, pingEvent, postEvents, UNSIGNED_EVENTS, type EventObject } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';
import { spawnFunction } from '../helpers/process.ts';
import { assertNoSecret, captureLogger, loggedAnswer, sentinel } from '../helpers/logs.ts';
import { scanLater } from '../helpers/leaks.ts';

const w = fx.world('idst');
const a = w.clients;
const run = suffix();
const SCOPE_LABEL = 'captf-test/identity-status';
const cap = captureLogger('identity-status');
const planted: string[] = [];
const responses: string[] = [];
scanLater('HTTP answers', () => responses.join('\n'));
/** The function's ServiceAccount: it may list Secrets everywhere and get them only in `src`. */
let account: fx.AccountClients;
let fn: FunctionHandle;
let url: string;
/** The function as a test posts events to it: its answers' detail is read from its log. */
const target = {
  get url() {
    return url;
  },
  log: cap,
};
let src: string; // namespace of readable source Secrets
let locked: string; // namespace whose Secrets the function may list but not get

/** The rendered rules less `get` on Secrets (a Role gives it back in `src` only). */
const withoutSecretGet = (rules: V1PolicyRule[]): V1PolicyRule[] =>
  rules.map((r) => (r.resources?.includes('secrets') ? { ...r, verbs: r.verbs.filter((v) => v !== 'get') } : r));

/** An identity in this file's scope (its label) allowing every namespace, with source `<namespace>/<name>-src`. */
const scoped = (name: string, namespace = src, ...mods: fx.Modifier<TerraformClusterIdentity>[]) =>
  fx.identity(
    name,
    fx.secretRef(namespace, `${name}-src`),
    fx.allowSelector(),
    fx.labels({ [SCOPE_LABEL]: run }),
    ...mods,
  );

/** A consumer `name` of `kind` in `namespace` using identity `id`. */
const consumerOf = (
  namespace: string,
  name: string,
  id: string,
  kind = TERRAFORM_CLUSTER,
  ...mods: fx.Modifier<Consumer>[]
) => fx.consumer(name, fx.inNamespace(namespace), fx.ofKind(kind), fx.identityRef(id), ...mods);

/** A source Secret holding two fresh values that no output may show; returns it as stored. */
async function createSource(namespace: string, name: string): Promise<V1Secret> {
  const values = { AWS_SECRET_ACCESS_KEY: sentinel(), TF_VAR_token: sentinel() };
  planted.push(...Object.values(values));
  return w.create(fx.sourceSecret(name, fx.inNamespace(namespace), fx.data(values)));
}

/** A fresh identity in this file's scope and its source Secret, both created. */
async function sourcedIdentity(what: string, namespace = src) {
  const id = scoped(w.name(what), namespace);
  const source = await createSource(namespace, id.spec.secretRef.name);
  return { name: id.metadata.name!, id, created: await w.create(id), source };
}

/** The identity as the API server has it now. */
const reread = async (id: TerraformClusterIdentity) => (await w.read(id))!;

/** A mirror as mirror-sync would write it, created directly as admin, owned by a ConfigMap that stays. */
async function createMirror(namespace: string, idName: string, source: V1Secret): Promise<V1Secret> {
  const cm = await a.core.createNamespacedConfigMap({ namespace, body: { metadata: { name: `holder-${suffix()}` } } });
  const owner = { apiVersion: 'v1', kind: 'ConfigMap', name: cm.metadata!.name!, uid: cm.metadata!.uid! };
  return w.create(desiredMirror(idName, namespace, source.data, owner) as V1Secret);
}

async function ping(): Promise<{ status: number; body: Record<string, unknown> }> {
  const r = await postEvents(target, pingEvent('identity-status'));
  responses.push(r.text);
  return { status: r.status, body: r.body as Record<string, unknown> };
}

type Mode = 'resource' | 'ref';
type Verb = 'add' | 'update' | 'delete';
/** An ApiServerSource event about a built object. */
const eventAbout = (o: object, mode: Mode, verb: Verb, plural: string) =>
  apiServerEvent(o as EventObject, mode, verb, plural);
/** An ApiServerSource event about identity `id` as given. */
const idEvent = (id: TerraformClusterIdentity, mode: Mode, verb: Verb) =>
  eventAbout(id, mode, verb, IDENTITY_RESOURCE.plural);
/** An ApiServerSource event about a consumer (not identity-status's to take). */
const consumerEvent = () => eventAbout(fx.consumer('c', fx.inNamespace(src)), 'ref', 'add', TERRAFORM_CLUSTER.plural);

/** Posts an event about identity `id`; in `resource` mode it carries the identity as it is now (or as given, when gone). */
async function identityEvent(id: TerraformClusterIdentity, mode: Mode = 'ref', verb: Verb = 'update') {
  const r = await postEvents(target, idEvent(mode === 'resource' ? ((await w.read(id)) ?? id) : id, mode, verb));
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
async function namespacesSettle(
  id: TerraformClusterIdentity,
  want: string[],
  send: () => Promise<unknown>,
): Promise<void> {
  const name = id.metadata.name!;
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
    const got = (await reread(id)).status?.namespaces;
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
    src = await w.namespace();
    locked = await w.namespace();
    account = await w.account('captf-identity-status', withoutSecretGet);
    const rbac = a.kc.makeApiClient(RbacAuthorizationV1Api);
    await rbac.createNamespacedRole({
      namespace: src,
      body: { metadata: { name: 'get-sources' }, rules: [{ apiGroups: [''], resources: ['secrets'], verbs: ['get'] }] },
    });
    await rbac.createNamespacedRoleBinding({
      namespace: src,
      body: {
        metadata: { name: 'get-sources' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'get-sources' },
        subjects: [{ kind: 'User', name: account.user, apiGroup: 'rbac.authorization.k8s.io' }],
      },
    });
    await createSource(src, 'rbac-probe');
    await eventually(
      'RBAC to let the function get Secrets in the source namespace',
      async () =>
        (await account.clients.core.readNamespacedSecret({ namespace: src, name: 'rbac-probe' })).metadata?.name ===
        'rbac-probe',
    );
    fn = await start({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: account.clients.kc,
      logger: cap.logger,
      env: {
        ...UNSIGNED_EVENTS,
        CAPTF_STATUS_IDENTITY_SELECTOR: `${SCOPE_LABEL}=${run}`,
        CAPTF_STATUS_CONCURRENCY: '8',
      },
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
    const { name, id, created, source } = await sourcedIdentity('present');
    const r = await ping();
    assert.equal(r.status, 200, JSON.stringify(r.body));
    let got = await reread(id);
    assert.equal(ready(got)?.status, 'True');
    assert.equal(ready(got)?.reason, 'SecretFound');
    assert.equal(ready(got)?.observedGeneration, created.metadata.generation);
    assert.match(ready(got)!.message, new RegExp(`${src}/${name}-src`));
    assert.deepEqual(got.status?.namespaces, []);

    // A spec change bumps the generation; the next refresh reports it as observed.
    await w.put(scoped(name, src, fx.allowList('x')));
    await identityEvent(id, 'resource', 'update');
    got = await reread(id);
    assert.equal(ready(got)?.observedGeneration, (created.metadata.generation ?? 1) + 1);

    await w.delete(source);
    const ev = await identityEvent(id, 'ref', 'update');
    assert.equal(ev.status, 200, JSON.stringify(ev.body));
    got = await reread(id);
    assert.equal(ready(got)?.status, 'False');
    assert.equal(ready(got)?.reason, 'SecretNotFound');

    await createSource(src, `${name}-src`);
    await ping();
    assert.equal(ready(await reread(id))?.reason, 'SecretFound');
  });

  it('sets Ready=False/SecretUnreadable when the function may list but not get the source (a real 403)', async () => {
    const { name, id } = await sourcedIdentity('locked', locked);
    await assert.rejects(
      account.clients.core.readNamespacedSecret({ namespace: locked, name: `${name}-src` }),
      (e: unknown) => apiStatus(e) === 403,
    );
    const r = await identityEvent(id, 'resource', 'add');
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const c = ready(await reread(id));
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
    const { name, id } = await sourcedIdentity('users');
    const [n1, n2, n3] = [await w.namespace(), await w.namespace(), await w.namespace()];
    const c1 = await w.create(consumerOf(n1, 'c1', name));
    const m1 = await w.create(consumerOf(n2, 'm1', name, TERRAFORM_MACHINE));
    const c2 = await w.create(consumerOf(n2, 'c2', name));
    await w.create(consumerOf(n3, 'm-other', `someone-else-${run}`, TERRAFORM_MACHINE));
    await ping();
    assert.deepEqual((await reread(id)).status?.namespaces, [n1, n2].sort());

    const c3 = await w.create(consumerOf(n3, 'c3', name));
    await identityEvent(id);
    assert.deepEqual((await reread(id)).status?.namespaces, [n1, n2, n3].sort());

    await w.delete(m1);
    await ping();
    assert.deepEqual((await reread(id)).status?.namespaces, [n1, n2, n3].sort(), 'n2 still has c2');
    await w.delete(c2);
    await w.delete(c1);
    await namespacesSettle(id, [n3], ping);
    await w.delete(c3);
    await namespacesSettle(id, [], () => identityEvent(id, 'resource', 'update'));
    const lines = cap.entries().filter((e) => e.message === 'identity refreshed' && e.identity === name);
    assert.ok(lines.some((l) => (l.changed as string[]).includes('namespaces')));
  });

  it('a deleting consumer still counts until it is gone', async () => {
    const { name, id } = await sourcedIdentity('deleting');
    const n = await w.namespace();
    const dying = consumerOf(n, 'dying', name, TERRAFORM_MACHINE);
    await w.create(consumerOf(n, 'dying', name, TERRAFORM_MACHINE, fx.finalizers('captf.io/test-hold')));
    await w.delete(dying);
    assert.ok((await w.read(dying))?.metadata.deletionTimestamp, 'the consumer is deleting');
    await ping();
    assert.deepEqual((await reread(id)).status?.namespaces, [n]);
    await identityEvent(id);
    assert.deepEqual((await reread(id)).status?.namespaces, [n], 'the single-identity path counts it too');

    await w.put(dying); // without the finalizer
    await eventually('the consumer to be gone', async () => (await w.read(dying)) === undefined);
    await namespacesSettle(id, [], ping);
  });

  it('a namespace that only still holds a mirror counts; Secrets that are not its mirror do not; mirrors are never changed', async () => {
    const { name, id, source } = await sourcedIdentity('mirror');
    const [withMirror, notOurs, otherIdentity] = [await w.namespace(), await w.namespace(), await w.namespace()];
    const mirror = await createMirror(withMirror, name, source);
    // Same name without the mirrored label: someone else's Secret.
    await w.create(
      fx.sourceSecret(
        mirrorName(name),
        fx.inNamespace(notOurs),
        fx.annotations({ [ANNOTATION_IDENTITY]: name }),
        fx.dataOf(source),
      ),
    );
    // Labeled, but annotated for another identity.
    await w.create(
      fx.sourceSecret(
        mirrorName(name),
        fx.inNamespace(otherIdentity),
        fx.labels({ [LABEL_MIRRORED]: 'true' }),
        fx.annotations({ [ANNOTATION_IDENTITY]: `other-${run}` }),
        fx.dataOf(source),
      ),
    );

    await ping();
    assert.deepEqual((await reread(id)).status?.namespaces, [withMirror]);
    await identityEvent(id, 'ref', 'add');
    assert.deepEqual((await reread(id)).status?.namespaces, [withMirror], 'the single-identity path agrees');
    assert.equal(
      (await w.read(mirror))?.metadata?.resourceVersion,
      mirror.metadata?.resourceVersion,
      'the mirror was not written',
    );

    // The function reads Secrets as metadata only: the API server never sends it their data.
    const asList = await account.clients.core.listSecretForAllNamespaces(
      { labelSelector: `${LABEL_MIRRORED}=true`, fieldSelector: `metadata.name=${mirrorName(name)}` },
      METADATA_LIST,
    );
    assert.deepEqual(asList.items.map((s) => s.metadata?.namespace).sort(), [withMirror, otherIdentity].sort());
    assert.ok(asList.items.every((s) => s.data === undefined && s.metadata?.annotations?.[ANNOTATION_IDENTITY]));
    const one = await account.clients.core.readNamespacedSecret({ namespace: src, name: `${name}-src` }, METADATA);
    assert.equal(one.metadata?.name, `${name}-src`);
    assert.equal(one.data, undefined);

    await w.delete(mirror);
    await ping();
    assert.deepEqual((await reread(id)).status?.namespaces, []);
  });
}

/** How the status is written: no empty writes, other writers' conditions kept, conflicts redone. */
function writeTests(): void {
  it('repeated refreshes with no change leave the identity resourceVersion unchanged', async () => {
    const { name, id, source } = await sourcedIdentity('steady');
    const n = await w.namespace();
    await w.create(consumerOf(n, 'c', name));
    await createMirror(await w.namespace(), name, source);
    await ping();
    const first = await reread(id);
    assert.equal(first.status?.namespaces?.length, 2);
    for (const send of [ping, () => identityEvent(id, 'ref'), () => identityEvent(id, 'resource'), ping]) {
      const r = await send();
      assert.equal(r.status, 200);
    }
    const later = await reread(id);
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
    const { name, id, source } = await sourcedIdentity('others');
    await ping();
    const audited: Condition = {
      type: 'Audited',
      status: 'True',
      reason: 'Checked',
      message: 'ok',
      lastTransitionTime: '2026-01-01T00:00:00Z',
    };
    await fx.applyStatusAs(a, scoped(name, src, fx.conditions(audited)), 'another-controller');
    await w.delete(source);
    await identityEvent(id);
    const got = await reread(id);
    assert.equal(ready(got)?.reason, 'SecretNotFound');
    assert.equal(getCondition(got.status?.conditions, 'Audited')?.reason, 'Checked');
  });

  it('a write on a stale read conflicts and is redone from fresh lookups (resourceVersion precondition)', async () => {
    const { name, id, created: stale } = await sourcedIdentity('stale');
    const n = await w.namespace();
    await w.create(consumerOf(n, 'c', name));
    // Someone writes the identity after our read: its resourceVersion moves on.
    await w.put(scoped(name, src, fx.annotations({ touched: 'yes' })));
    const result = await refreshIdentity(
      {
        clients: account.clients,
        consumerKinds: DEFAULT_CONSUMER_KINDS,
        concurrency: 1,
        identitySelector: `${SCOPE_LABEL}=${run}`,
        logger: cap.logger,
      },
      stale,
      { consumerNamespaces: ['stale-namespace'], mirrorNamespaces: [] },
    );
    assert.equal(result.outcome, 'refreshed');
    const got = await reread(id);
    assert.deepEqual(got.status?.namespaces, [n], 'the stale usage was never written');
    assert.equal(ready(got)?.reason, 'SecretFound');
  });
}

/** What the function answers a request that is no CloudEvent it takes. */
const badRequests: [string, () => Promise<{ status: number; text: string }>, number, RegExp][] = [
  ['no CloudEvent', () => post({ 'content-type': 'application/json' }, '{}'), 400, /CloudEvent/],
  [
    'binary event without ce-id',
    () => post({ 'ce-type': 'dev.knative.sources.ping', 'ce-source': '/x', 'ce-specversion': '1.0' }, ''),
    400,
    /lacks required header\(s\) ce-id/,
  ],
  ['malformed JSON', () => post({ 'content-type': 'application/cloudevents+json' }, '{"specversion":'), 400, /./],
  ['unknown type', () => postEvent('com.example.nope', {}), 400, /unsupported event type/],
  ['event naming no object', () => postEvent('dev.knative.apiserver.ref.add', { foo: 1 }), 400, /must name the object/],
  ['event about a consumer', () => postEvents(target, consumerEvent()), 422, /TerraformClusterIdentity/],
  ['too large', () => post({ 'content-type': 'application/json' }, 'x'.repeat(4 * 1024 * 1024)), 413, /too large/],
];

/** POSTs a CloudEvent of `type` carrying `data` to the function. */
const postEvent = (type: string, data: unknown) =>
  postEvents(
    target,
    new CloudEvent<unknown>({
      specversion: '1.0',
      id: '1',
      source: '/x',
      type,
      datacontenttype: 'application/json',
      data,
    }),
  );

/**
 * POSTs `body` with `headers` to the function; returns the status and text of its answer, or,
 * for an answer to events, the detail it logged for it.
 */
async function post(
  headers: Record<string, string>,
  body: string,
): Promise<{ status: number; text: string; sent: string }> {
  const r = await fetch(url, { method: 'POST', headers, body });
  const sent = await r.text();
  responses.push(sent);
  if (!r.headers.has(EVENT_ANSWER_ID_HEADER)) return { status: r.status, text: sent, sent };
  return { status: r.status, text: JSON.stringify(await loggedAnswer(cap, r.headers)), sent };
}

/** The function's HTTP interface. */
function httpTests(): void {
  it('answers over HTTP: binary, structured and batch events, healthz, 4xx with a reason, gone identities', async () => {
    const { name, id } = await sourcedIdentity('http');
    const structured = await postEvents(target, idEvent(id, 'ref', 'add'), 'structured');
    assert.equal(structured.status, 200, structured.text);
    assert.equal(ready(await reread(id))?.reason, 'SecretFound');

    const missing = fx.identity(`missing-${run}`);
    const batch = await postEvents(
      target,
      [idEvent(id, 'ref', 'update'), idEvent(missing, 'resource', 'delete')],
      'batch',
    );
    responses.push(batch.text);
    assert.equal(batch.status, 200, batch.text);
    assert.equal(batch.sent.text, '', 'a 200 to events has no body (SPEC §12)');
    const body = batch.body as { refreshed: number; gone: number; identities: { identity: string; outcome: string }[] };
    assert.equal(body.refreshed, 1);
    assert.equal(body.gone, 1);
    assert.deepEqual(
      body.identities.map((i) => i.outcome),
      ['refreshed', 'gone'],
    );

    // SPEC §12 batch policy: a bad element (no type) and an event about another kind do not
    // drop the good event; the answer is 400 naming them, with the good one's result.
    const good = idEvent(id, 'ref', 'update').toJSON() as Record<string, unknown>;
    const noType = { ...good, id: 'bad-1', type: undefined };
    const mixed = await post(
      { 'content-type': 'application/cloudevents-batch+json' },
      JSON.stringify([good, noType, consumerEvent().toJSON()]),
    );
    responses.push(mixed.text);
    assert.equal(mixed.status, 400, mixed.text);
    const mixedBody = JSON.parse(mixed.text) as {
      error: string;
      refreshed: number;
      identities: { identity: string }[];
    };
    assert.equal(mixedBody.refreshed, 1);
    assert.deepEqual(
      mixedBody.identities.map((i) => i.identity),
      [name],
    );
    assert.match(mixedBody.error, /batch\[1\]/);
    assert.match(mixedBody.error, /TerraformCluster/);
    assert.deepEqual(JSON.parse(mixed.sent), { error: EVENT_ANSWERS['bad-input'] }, 'the answer itself names nothing');

    // An identity outside the configured selector is out of scope, like a gone one.
    const outside = await w.create(fx.identity(`idst-outside-${run}`, fx.secretRef(src, 'x')));
    const out = await identityEvent(outside);
    assert.equal((out.body as { gone: number }).gone, 1);
    assert.equal((await reread(outside)).status, undefined, 'out-of-scope identity untouched');

    const health = await fetch(`${url}healthz`);
    assert.equal(health.status, 200);

    for (const [what, send, status, message] of badRequests) {
      const r = await send();
      responses.push(r.text);
      assert.equal(r.status, status, `${what}: ${r.text}`);
      assert.match(JSON.parse(r.text).error, message, what);
    }
    // Still serving after all of that.
    assert.equal((await identityEvent(id)).status, 200);
  });
}

/** As a process, and at scale. */
function processTests(): void {
  it('runs as a process (npm run function -- identity-status): PORT, JSON logs, and SIGTERM lets an in-flight ping finish', async () => {
    const { id } = await sourcedIdentity('process');
    const fn = await spawnFunction('identity-status', {
      KUBECONFIG: account.kubeconfigPath,
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
      assert.equal(ready(await reread(id))?.reason, 'SecretFound');
      cap.lines.push(...fn.output().split('\n').filter(Boolean)); // scanned for planted values in after()
    } finally {
      fn.kill();
    }
  });

  it('refreshes 200 identities in one ping with bounded concurrency', async (t) => {
    const bulk = `bulk-${run}`;
    const source = await createSource(src, `${bulk}-src`);
    const [n1, n2, n3] = [await w.namespace(), await w.namespace(), await w.namespace()];
    const names = Array.from({ length: 200 }, (_, i) => `idst-${bulk}-${String(i).padStart(3, '0')}`);
    const expected = new Map<string, { reason: string; namespaces: string[] }>();
    const limit = pLimit(10);
    await limit.map(names, async (name, i) => {
      // Every third identity points at a missing Secret; every 10th has consumers; every 25th a mirror.
      const secret = i % 3 === 0 ? `${bulk}-missing` : `${bulk}-src`;
      await w.create(scoped(name, src, fx.secretRef(src, secret), fx.labels({ 'captf-test/bulk': bulk })));
      const used: string[] = [];
      if (i % 10 === 0) {
        await w.create(consumerOf(n1, `c-${i}`, name));
        await w.create(consumerOf(n2, `m-${i}`, name, TERRAFORM_MACHINE));
        used.push(n1, n2);
      }
      if (i % 25 === 0) {
        await createMirror(n3, name, source);
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
    const list = await identities(a).list({ labelSelector: `captf-test/bulk=${bulk}` });
    assert.equal(list.items?.length, 200);
    for (const id of list.items ?? []) {
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
        const found = sourceGets(account.user, [`${bulk}-src`, `${bulk}-missing`]);
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
