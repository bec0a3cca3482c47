import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { API_VERSION, GROUP, VERSION } from '../../functions/lib/api.ts';
import { KEY_EVENT_TYPE } from '../../functions/lib/cloudevents.ts';
import {
  isOurs,
  mirrorName,
  sourceHash,
  ANNOTATION_IDENTITY,
  ANNOTATION_SOURCE_HASH,
  LABEL_MANAGED,
  LABEL_MIRRORED,
  LABEL_MIRROR_OF,
} from '../../functions/lib/mirror.ts';
import { start } from '../../functions/mirror-sync/index.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { admin, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { apiServerEvent } from '../helpers/events.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';
import {
  conditionOf,
  consumerEvent,
  createConsumer,
  deleteConsumer,
  deleteIdentity,
  deliver,
  getConsumer,
  getMirror,
  putIdentity,
  refuseSecrets,
} from '../helpers/mirror-sync.ts';
import { scanLater } from '../helpers/leaks.ts';
import { manager, postPrepare } from '../helpers/prepare.ts';
import type { PrepareCaller } from '../../scripts/lib/serviceaccount.ts';

const a = admin();
const ns = namespaces('ms');
const log = captureLogger('mirror-sync');
const SECRET_VALUES = [sentinel(), sentinel()];
const responses: string[] = [];
scanLater('HTTP answers', () => responses.join('\n'));
let fn: FunctionHandle;
let url: string;
let sourceNs: string;
/** The provider's manager: calls prepare with its audience-bound token (SPEC §5). */
let caller: PrepareCaller;
const source = { name: 'cloud-creds', namespace: '' };

const b64 = (s: string) => Buffer.from(s).toString('base64');
/** Sends an event and remembers the response text for the leak scan. */
async function send(...args: Parameters<typeof deliver>) {
  const r = await deliver(...args);
  responses.push(r.text);
  return r;
}
async function newIdentity(allowed: Parameters<typeof putIdentity>[3]) {
  const name = `id-${suffix()}`;
  ns.onCleanup(() => deleteIdentity(a, name));
  await putIdentity(a, name, source, allowed);
  return name;
}

before(async () => {
  sourceNs = await ns.create();
  source.namespace = sourceNs;
  await a.core.createNamespacedSecret({
    namespace: sourceNs,
    body: {
      metadata: { name: source.name },
      data: { AWS_ACCESS_KEY_ID: b64(SECRET_VALUES[0]!), AWS_SECRET_ACCESS_KEY: b64(SECRET_VALUES[1]!) },
    },
  });
  fn = await start({ port: 0, host: '127.0.0.1', kubeconfig: a.kc, logger: log.logger, env: {} });
  url = `http://127.0.0.1:${fn.port}`;
  caller = await manager(ns);
});
after(async () => {
  await fn?.close();
  const said = [...log.lines, ...responses].join('\n');
  assert.ok(!caller || !said.includes(caller.token), 'the caller token appears in no log line or answer');
});

describe('mirror-sync reconcile (SPEC §4) through CloudEvents', () => {
  mirrorLifecycleTests();
  repairAndReleaseTests();
});

/** A consumer's mirror: created, left alone when current, rotated, revoked. */
function mirrorLifecycleTests(): void {
  it('creating a consumer makes a mirror with exact labels, annotations, data and one owner reference', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const c = await createConsumer(a, n, 'cluster-1', id);
    const r = await send(`${url}/`, consumerEvent(c, 'ref', 'add'));
    assert.equal(r.status, 200, r.text);
    const m = (await getMirror(a, n, id))!;
    assert.equal(m.metadata!.name, `captf-creds-${id}`);
    assert.equal(m.type, 'Opaque');
    assert.deepEqual(m.metadata!.labels, { [LABEL_MIRRORED]: 'true', [LABEL_MANAGED]: 'true', [LABEL_MIRROR_OF]: id });
    const src = await a.core.readNamespacedSecret({ name: source.name, namespace: sourceNs });
    assert.deepEqual(m.metadata!.annotations, {
      [ANNOTATION_SOURCE_HASH]: sourceHash(src.data),
      [ANNOTATION_IDENTITY]: id,
    });
    assert.deepEqual(m.data, src.data);
    assert.equal(m.metadata!.ownerReferences!.length, 1);
    const ref = m.metadata!.ownerReferences![0]!;
    assert.deepEqual(
      { apiVersion: ref.apiVersion, kind: ref.kind, name: ref.name, uid: ref.uid },
      { apiVersion: API_VERSION, kind: 'TerraformCluster', name: 'cluster-1', uid: c.metadata.uid },
    );
    assert.equal(ref.controller, undefined);
    assert.equal(ref.blockOwnerDeletion, undefined);
    const obj = await getConsumer(a, n, 'cluster-1');
    assert.deepEqual(conditionOf(obj, 'IdentityAllowed')?.reason, 'NamespaceAllowed');
    assert.equal(conditionOf(obj, 'IdentityAllowed')?.status, 'True');
    assert.equal(conditionOf(obj, 'CredentialsMirrored')?.status, 'True');
    assert.equal(conditionOf(obj, 'CredentialsMirrored')?.reason, 'Mirrored');
    assert.equal(
      (obj.status!.conditions!.find((x) => x.type === 'CredentialsMirrored') as { observedGeneration?: number })
        .observedGeneration,
      obj.metadata.generation,
    );
    const events = {
      items: (await a.events.listNamespacedEvent({ namespace: n })).items.filter(
        (e) => e.regarding?.name === 'cluster-1',
      ),
    };
    assert.deepEqual(events.items.map((e) => e.reason).sort(), ['Mirrored', 'NamespaceAllowed']);
    assert.ok(events.items.every((e) => e.reportingController === 'captf.io/mirror-sync'));
  });

  it('reconciles racing on one object record each condition change once', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const c = await createConsumer(a, n, 'raced', id);
    const answers = await Promise.all(
      Array.from({ length: 6 }, (_, i) => send(`${url}/`, consumerEvent(c, i % 2 ? 'ref' : 'resource', 'add'))),
    );
    assert.deepEqual(
      answers.map((r) => r.status),
      [200, 200, 200, 200, 200, 200],
    );
    const reasons = (await a.events.listNamespacedEvent({ namespace: n })).items
      .filter((e) => e.regarding?.name === 'raced')
      .map((e) => e.reason)
      .sort();
    assert.deepEqual(reasons, ['Mirrored', 'NamespaceAllowed']);
  });

  it('repeated no-op reconciles write nothing: mirror and object resourceVersions stay the same', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const c = await createConsumer(a, n, 'steady', id);
    assert.equal((await send(`${url}/`, consumerEvent(c))).status, 200);
    const m1 = (await getMirror(a, n, id))!;
    const o1 = await getConsumer(a, n, 'steady');
    for (let i = 0; i < 3; i++) {
      assert.equal((await send(`${url}/`, consumerEvent(c, i % 2 ? 'resource' : 'ref'))).status, 200);
    }
    assert.equal((await getMirror(a, n, id))!.metadata!.resourceVersion, m1.metadata!.resourceVersion);
    assert.equal((await getConsumer(a, n, 'steady')).metadata.resourceVersion, o1.metadata.resourceVersion);
    const lines = log.entries().filter((e) => e.message === 'reconcile' && e.object === `${n}/steady`);
    assert.ok(lines.length >= 4);
    const last = lines.at(-1)!;
    assert.equal(last.outcome, 'mirrored');
    assert.equal(last.identity, id);
    // Not asserted: that the first reconcile logged 'created'. Other test files' resyncs
    // (cluster-wide, on the same control plane) may reconcile this consumer between its
    // creation and our event and create the mirror first. After our first answer the
    // mirror is current, so every later reconcile, ours or theirs, changes nothing.
    assert.deepEqual(
      lines.slice(1).map((l) => l.mirrorAction),
      lines.slice(1).map(() => 'unchanged'),
    );
    assert.equal(typeof last.durationMs, 'number');
    assert.equal(typeof last.apiCalls, 'number');
    // Events are hints: every reconcile re-reads. The event's own lookup read the object and
    // the namespace's mirrors; the reconcile then read the identity, namespace and source.
    assert.ok((last.apiCalls as number) >= 3, 'identity, namespace, source');
  });

  it('a rotated source reaches the mirror on the next reconcile', async () => {
    const n = await ns.create();
    const srcName = `rot-${suffix()}`;
    await a.core.createNamespacedSecret({
      namespace: sourceNs,
      body: { metadata: { name: srcName }, data: { k: b64('v1') } },
    });
    const id = `id-${suffix()}`;
    ns.onCleanup(() => deleteIdentity(a, id));
    await putIdentity(a, id, { name: srcName, namespace: sourceNs }, { list: [n] });
    const c = await createConsumer(a, n, 'rot', id);
    await send(`${url}/`, consumerEvent(c));
    assert.equal((await getMirror(a, n, id))!.data!.k, b64('v1'));
    await a.core.replaceNamespacedSecret({
      name: srcName,
      namespace: sourceNs,
      body: { metadata: { name: srcName }, data: { k: b64('v2'), extra: b64('x') } },
    });
    await send(`${url}/`, consumerEvent(c));
    const m = (await getMirror(a, n, id))!;
    assert.deepEqual(m.data, { k: b64('v2'), extra: b64('x') });
    // Not asserted: that our reconcile logged 'updated'. Another test file's resync may
    // reconcile this consumer between the rotation and our event and write the new data
    // first; the mirror's content after our answer is what the rotation must achieve.
    assert.equal(m.metadata!.annotations![ANNOTATION_SOURCE_HASH], sourceHash(m.data));
  });

  it('narrowing the list revokes: the mirror is deleted and conditions say why', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n, 'elsewhere'] });
    const c = await createConsumer(a, n, 'narrowed', id);
    await send(`${url}/`, consumerEvent(c));
    assert.ok(await getMirror(a, n, id));
    const ident = await putIdentity(a, id, source, { list: ['elsewhere'] });
    const r = await send(`${url}/`, apiServerEvent(ident as never, 'ref', 'update', 'terraformclusteridentities'));
    assert.equal(r.status, 200, r.text);
    assert.equal(await getMirror(a, n, id), undefined);
    const obj = await getConsumer(a, n, 'narrowed');
    assert.equal(conditionOf(obj, 'IdentityAllowed')?.status, 'False');
    assert.equal(conditionOf(obj, 'IdentityAllowed')?.reason, 'NamespaceNotAllowed');
    assert.equal(conditionOf(obj, 'CredentialsMirrored'), undefined, 'no stale Mirrored=True after revocation');
    // The consumer's own event after the revocation (the echo of our status write) changes
    // nothing: one revocation, one Warning Event.
    assert.equal((await send(`${url}/`, consumerEvent(c))).status, 200);
    const events = {
      items: (await a.events.listNamespacedEvent({ namespace: n })).items.filter(
        (e) => e.regarding?.name === 'narrowed',
      ),
    };
    assert.equal(events.items.filter((e) => e.reason === 'NamespaceNotAllowed' && e.type === 'Warning').length, 1);
  });

  it('relabelling the namespace revokes a selector identity (namespace event fans out)', async () => {
    const label = `tenant-${suffix()}`;
    const n = await ns.create({ 'captf.io/tenant': label });
    const id = await newIdentity({ selector: { matchLabels: { 'captf.io/tenant': label } } });
    const c = await createConsumer(a, n, 'relabel', id);
    await send(`${url}/`, consumerEvent(c));
    assert.ok(await getMirror(a, n, id));
    const nsObj = await a.core.readNamespace({ name: n });
    nsObj.metadata!.labels = { 'captf.io/tenant': 'someone-else' };
    const updated = await a.core.replaceNamespace({ name: n, body: nsObj });
    const r = await send(`${url}/`, apiServerEvent(updated as never, 'resource', 'update', 'namespaces'));
    assert.equal(r.status, 200, r.text);
    assert.equal(await getMirror(a, n, id), undefined);
    assert.equal(conditionOf(await getConsumer(a, n, 'relabel'), 'IdentityAllowed')?.reason, 'NamespaceNotAllowed');
  });

  it('deleting the identity revokes: mirror deleted, IdentityNotFound, answered as handled (it waits for a person)', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const c = await createConsumer(a, n, 'orphaned', id);
    await send(`${url}/`, consumerEvent(c));
    assert.ok(await getMirror(a, n, id));
    await deleteIdentity(a, id);
    const r = await send(
      `${url}/`,
      apiServerEvent(
        { apiVersion: API_VERSION, kind: 'TerraformClusterIdentity', metadata: { name: id } },
        'ref',
        'delete',
        'terraformclusteridentities',
      ),
      { retries: 0 },
    );
    assert.equal(r.status, 200, 'IdentityNotFound waits for a person: a retry cannot fix it (SPEC §4)');
    assert.equal(await getMirror(a, n, id), undefined);
    const cond = conditionOf(await getConsumer(a, n, 'orphaned'), 'IdentityAllowed');
    assert.equal(cond?.status, 'False');
    assert.equal(cond?.reason, 'IdentityNotFound');
  });
}

/** Stale owners, hand edits, Secrets in the way, missing sources, and releasing a mirror. */
function repairAndReleaseTests(): void {
  it('an object deleted and recreated under the same name gets its stale owner reference replaced', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const keep = await createConsumer(a, n, 'keeper', id, 'TerraformMachine');
    const c1 = await createConsumer(a, n, 'phoenix', id);
    await send(`${url}/`, [consumerEvent(keep), consumerEvent(c1)], { mode: 'batch' });
    await deleteConsumer(a, n, 'phoenix');
    const c2 = await createConsumer(a, n, 'phoenix', id);
    assert.notEqual(c1.metadata.uid, c2.metadata.uid);
    await send(`${url}/`, consumerEvent(c2, 'resource', 'add'));
    const refs = (await getMirror(a, n, id))!.metadata!.ownerReferences!;
    const phoenix = refs.filter((r) => r.name === 'phoenix');
    assert.deepEqual(
      phoenix.map((r) => r.uid),
      [c2.metadata.uid],
    );
    assert.ok(refs.some((r) => r.name === 'keeper' && r.kind === 'TerraformMachine'));
  });

  it('a mirror deleted by hand is recreated; one edited by hand (annotation kept) is repaired', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const c = await createConsumer(a, n, 'repair', id);
    await send(`${url}/`, consumerEvent(c));
    const good = (await getMirror(a, n, id))!;
    await a.core.deleteNamespacedSecret({ name: mirrorName(id), namespace: n });
    await send(`${url}/`, consumerEvent(c));
    assert.deepEqual((await getMirror(a, n, id))!.data, good.data);
    const m = (await getMirror(a, n, id))!;
    m.data = { ...m.data, AWS_SECRET_ACCESS_KEY: b64('tampered') };
    await a.core.replaceNamespacedSecret({ name: mirrorName(id), namespace: n, body: m });
    assert.equal(
      (await getMirror(a, n, id))!.metadata!.annotations![ANNOTATION_SOURCE_HASH],
      good.metadata!.annotations![ANNOTATION_SOURCE_HASH],
    );
    await send(`${url}/`, consumerEvent(c));
    assert.deepEqual((await getMirror(a, n, id))!.data, good.data);
  });

  it('a blocking non-mirror Secret is never written; MirrorFailed until it is removed, then the mirror appears', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const blocker = await a.core.createNamespacedSecret({
      namespace: n,
      body: {
        metadata: {
          name: mirrorName(id),
          labels: { [LABEL_MIRRORED]: 'true' },
          annotations: { [ANNOTATION_IDENTITY]: 'some-other-identity' },
        },
        data: { mine: b64('hands off') },
      },
    });
    const c = await createConsumer(a, n, 'blocked', id);
    const r = await send(`${url}/`, consumerEvent(c), { retries: 0 });
    assert.equal(r.status, 200, 'a blocking Secret needs a human, not a retry storm');
    const still = (await getMirror(a, n, id))!;
    assert.equal(still.metadata!.resourceVersion, blocker.metadata!.resourceVersion);
    assert.ok(!isOurs(still, id, undefined));
    const cond = conditionOf(await getConsumer(a, n, 'blocked'), 'CredentialsMirrored');
    assert.equal(cond?.status, 'False');
    assert.equal(cond?.reason, 'MirrorFailed');
    assert.match(cond!.message, new RegExp(`Secret ${n}/${mirrorName(id)} exists and is not a mirror`));
    // Deleting the consumer must not delete someone else's Secret either.
    await a.core.deleteNamespacedSecret({ name: mirrorName(id), namespace: n });
    await send(`${url}/`, consumerEvent(c));
    assert.ok(isOurs(await getMirror(a, n, id), id, undefined));
    assert.equal(conditionOf(await getConsumer(a, n, 'blocked'), 'CredentialsMirrored')?.reason, 'Mirrored');
  });

  it('a missing source Secret gives SourceNotFound, answered as handled', async () => {
    const n = await ns.create();
    const id = `id-${suffix()}`;
    ns.onCleanup(() => deleteIdentity(a, id));
    await putIdentity(a, id, { name: 'does-not-exist', namespace: sourceNs }, { list: [n] });
    const c = await createConsumer(a, n, 'nosource', id);
    const r = await send(`${url}/`, consumerEvent(c), { retries: 0 });
    assert.equal(r.status, 200, 'the source event (or the resync) brings the change, not a retry');
    const cond = conditionOf(await getConsumer(a, n, 'nosource'), 'CredentialsMirrored');
    assert.equal(cond?.reason, 'SourceNotFound');
    assert.match(cond!.message, /does-not-exist/);
    assert.equal(await getMirror(a, n, id), undefined);
  });

  it("the last user's deletion deletes the mirror, but not while another user exists", async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const c1 = await createConsumer(a, n, 'first', id);
    const c2 = await createConsumer(a, n, 'second', id, 'TerraformMachine');
    await send(`${url}/`, [consumerEvent(c1), consumerEvent(c2)], { mode: 'batch' });
    assert.equal((await getMirror(a, n, id))!.metadata!.ownerReferences!.length, 2);
    await deleteConsumer(a, n, 'first');
    await send(`${url}/`, consumerEvent(c1, 'resource', 'delete'));
    const m = await getMirror(a, n, id);
    assert.ok(m, 'still used by the second consumer');
    assert.deepEqual(
      m.metadata!.ownerReferences!.map((r) => r.name),
      ['second'],
    );
    await deleteConsumer(a, n, 'second', 'TerraformMachine');
    await send(`${url}/`, consumerEvent(c2, 'ref', 'delete'));
    // Our delete, or the garbage collector's: either way the credentials are gone.
    await eventually('mirror deleted after the last user', async () => (await getMirror(a, n, id)) === undefined);
  });

  it("removing identityRef releases the mirror and clears our conditions, keeping other writers' conditions", async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const c = await createConsumer(a, n, 'quitter', id);
    await send(`${url}/`, consumerEvent(c));
    // Another controller owns a condition type of its own on the same object.
    await a.custom.patchNamespacedCustomObjectStatus(
      {
        group: GROUP,
        version: VERSION,
        plural: 'terraformclusters',
        namespace: n,
        name: 'quitter',
        fieldManager: 'provider-manager',
        force: true,
        body: {
          apiVersion: API_VERSION,
          kind: 'TerraformCluster',
          metadata: { name: 'quitter', namespace: n },
          status: {
            conditions: [
              {
                type: 'Provisioned',
                status: 'True',
                reason: 'Applied',
                message: 'done',
                lastTransitionTime: '2026-01-01T00:00:00Z',
              },
            ],
          },
        },
      },
      (await import('@kubernetes/client-node')).setHeaderOptions('Content-Type', 'application/apply-patch+yaml'),
    );
    await send(`${url}/`, consumerEvent(c));
    assert.equal(
      conditionOf(await getConsumer(a, n, 'quitter'), 'Provisioned')?.reason,
      'Applied',
      "other writers' types survive our apply",
    );
    const obj = await getConsumer(a, n, 'quitter');
    obj.spec = {};
    await a.custom.replaceNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      plural: 'terraformclusters',
      namespace: n,
      name: 'quitter',
      body: obj,
    });
    await send(`${url}/`, consumerEvent(c));
    const after = await getConsumer(a, n, 'quitter');
    assert.equal(conditionOf(after, 'CredentialsMirrored'), undefined);
    assert.equal(conditionOf(after, 'IdentityAllowed'), undefined);
    assert.equal(conditionOf(after, 'Provisioned')?.reason, 'Applied');
    assert.equal(await getMirror(a, n, id), undefined, 'it was the only user');
  });

  it('a consumer that switches identity lets go of the old mirror', async () => {
    const n = await ns.create();
    const id1 = await newIdentity({ list: [n] });
    const id2 = await newIdentity({ list: [n] });
    const c = await createConsumer(a, n, 'switcher', id1);
    await send(`${url}/`, consumerEvent(c));
    const obj = await getConsumer(a, n, 'switcher');
    obj.spec = { identityRef: { name: id2 } };
    await a.custom.replaceNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      plural: 'terraformclusters',
      namespace: n,
      name: 'switcher',
      body: obj,
    });
    await send(`${url}/`, consumerEvent(c));
    assert.equal(await getMirror(a, n, id1), undefined);
    assert.ok(await getMirror(a, n, id2));
  });

  it('structured mode works too', async () => {
    const n = await ns.create();
    const id = await newIdentity({ selector: {} });
    const c = await createConsumer(a, n, 'structured', id);
    const r = await send(`${url}/`, consumerEvent(c, 'resource', 'add'), { mode: 'structured' });
    assert.equal(r.status, 200, r.text);
    assert.ok(await getMirror(a, n, id));
  });
}

describe('prepare (SPEC §5)', () => {
  const prepare = async (body: unknown) => {
    const r = await postPrepare(url, body, caller);
    responses.push(r.text);
    return r;
  };

  it('answers 200 {mirror, sourceHash} on an allowed namespace, with the mirror current and owned', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const c = await createConsumer(a, n, 'prep', id);
    const r = await prepare({ apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: n, name: 'prep' });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const m = (await getMirror(a, n, id))!;
    assert.equal(r.body.mirror, m.metadata!.name);
    assert.equal(r.body.sourceHash, sourceHash(m.data));
    assert.ok(m.metadata!.ownerReferences!.some((o) => o.uid === c.metadata.uid));
  });

  it('refuses a namespace that is not allowed; a deleting object shows ApplyJobSucceeded=False/IdentityNotAllowed and prepare keeps refusing', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const c = await createConsumer(a, n, 'doomed', id, 'TerraformCluster', { finalizers: ['captf.io/test-destroy'] });
    ns.onCleanup(async () => {
      const o = await getConsumer(a, n, 'doomed').catch(() => undefined);
      if (o) {
        o.metadata.finalizers = [];
        await a.custom.replaceNamespacedCustomObject({
          group: GROUP,
          version: VERSION,
          plural: 'terraformclusters',
          namespace: n,
          name: 'doomed',
          body: o,
        });
      }
    });
    assert.equal(
      (await prepare({ apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: n, name: 'doomed' })).status,
      200,
    );
    await putIdentity(a, id, source, { list: [] });
    await deleteConsumer(a, n, 'doomed');
    const r = await prepare({ apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: n, name: 'doomed' });
    assert.equal(r.status, 403);
    assert.equal(r.body.reason, 'IdentityNotAllowed');
    assert.equal(await getMirror(a, n, id), undefined);
    const obj = await getConsumer(a, n, 'doomed');
    assert.ok(obj.metadata.deletionTimestamp);
    assert.equal(conditionOf(obj, 'ApplyJobSucceeded')?.status, 'False');
    assert.equal(conditionOf(obj, 'ApplyJobSucceeded')?.reason, 'IdentityNotAllowed');
    const ev = await send(`${url}/`, consumerEvent(c), { retries: 0 });
    assert.equal(ev.status, 200, 'the event is handled: the namespace waits for a person');
    assert.equal(
      (await prepare({ apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: n, name: 'doomed' })).status,
      403,
      'prepare keeps refusing the destroy',
    );
    // The way out: allow the namespace again.
    await putIdentity(a, id, source, { list: [n] });
    assert.equal(
      (await prepare({ apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: n, name: 'doomed' })).status,
      200,
    );
    assert.equal(conditionOf(await getConsumer(a, n, 'doomed'), 'ApplyJobSucceeded'), undefined);
  });

  it('answers the other reasons with non-2xx JSON', async () => {
    const n = await ns.create();
    assert.equal(
      (await prepare({ apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: n, name: 'nope' })).body.reason,
      'ObjectNotFound',
    );
    const missing = `id-missing-${suffix()}`;
    await createConsumer(a, n, 'lost', missing);
    const r = await prepare({ apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: n, name: 'lost' });
    assert.equal(r.status, 404, 'IdentityNotFound waits for a person (SPEC §5)');
    assert.equal(r.body.reason, 'IdentityNotFound');
    for (const bad of [
      'not json',
      '[]',
      { apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: n },
      { apiVersion: 'v1', kind: 'Pod', namespace: n, name: 'x' },
    ]) {
      const b = await prepare(bad);
      assert.equal(b.status, 400, JSON.stringify(bad));
      assert.ok(b.body.error);
    }
  });
});

describe('bad input (SPEC §15)', () => {
  it('malformed and unknown events get 4xx with a reason, and the server keeps serving', async () => {
    const post = async (headers: Record<string, string>, body: string) => {
      const r = await fetch(`${url}/`, { method: 'POST', headers, body });
      const text = await r.text();
      responses.push(text);
      return { status: r.status, body: JSON.parse(text) as { error: string } };
    };
    const cases: [string, Record<string, string>, string, RegExp][] = [
      ['no CloudEvent at all', { 'content-type': 'application/json' }, '{}', /not a CloudEvent/],
      ['structured, not JSON', { 'content-type': 'application/cloudevents+json' }, '{nope', /not a CloudEvent/],
      [
        'missing type',
        { 'ce-id': '1', 'ce-source': 's', 'ce-specversion': '1.0', 'content-type': 'application/json' },
        '{}',
        /lacks required header\(s\) ce-type/,
      ],
      [
        'missing id',
        { 'ce-type': 't', 'ce-source': 's', 'ce-specversion': '1.0', 'content-type': 'application/json' },
        '{}',
        /lacks required header\(s\) ce-id/,
      ],
      [
        'unknown type',
        {
          'ce-id': '1',
          'ce-source': 's',
          'ce-specversion': '1.0',
          'ce-type': 'com.example.other',
          'content-type': 'application/json',
        },
        '{}',
        /unsupported event type/,
      ],
      [
        'ref event naming nothing',
        {
          'ce-id': '1',
          'ce-source': 's',
          'ce-specversion': '1.0',
          'ce-type': 'dev.knative.apiserver.ref.add',
          'content-type': 'application/json',
        },
        '{}',
        /must name the object/,
      ],
      [
        'unknown kind',
        {
          'ce-id': '1',
          'ce-source': 's',
          'ce-specversion': '1.0',
          'ce-type': 'dev.knative.apiserver.ref.add',
          'content-type': 'application/json',
        },
        '{"apiVersion":"v1","kind":"Pod","name":"p","namespace":"x"}',
        /does not handle/,
      ],
      [
        'source Secret event while the fast path is off',
        {
          'ce-id': '1',
          'ce-source': 's',
          'ce-specversion': '1.0',
          'ce-type': 'dev.knative.apiserver.ref.update',
          'content-type': 'application/json',
        },
        '{"apiVersion":"v1","kind":"Secret","name":"p","namespace":"x"}',
        /fast path is off/,
      ],
      [
        'empty batch',
        { 'content-type': 'application/cloudevents-batch+json' },
        '[]',
        /empty CloudEvents batch|not a CloudEvent/,
      ],
      [
        'key event without data',
        {
          'ce-id': '1',
          'ce-source': 's',
          'ce-specversion': '1.0',
          'ce-type': KEY_EVENT_TYPE,
          'content-type': 'application/json',
        },
        '{}',
        /must be \{"namespace"/,
      ],
      [
        'key event with a path in the namespace',
        {
          'ce-id': '1',
          'ce-source': 's',
          'ce-specversion': '1.0',
          'ce-type': KEY_EVENT_TYPE,
          'content-type': 'application/json',
        },
        '{"namespace":"../kube-system","identity":"aws"}',
        /must be \{"namespace"/,
      ],
      [
        'key event with a bad identity name',
        {
          'ce-id': '1',
          'ce-source': 's',
          'ce-specversion': '1.0',
          'ce-type': KEY_EVENT_TYPE,
          'content-type': 'application/json',
        },
        '{"namespace":"team","identity":".."}',
        /must be \{"namespace"/,
      ],
      [
        'key event whose data is not an object',
        {
          'ce-id': '1',
          'ce-source': 's',
          'ce-specversion': '1.0',
          'ce-type': KEY_EVENT_TYPE,
          'content-type': 'application/json',
        },
        '["team","aws"]',
        /data must be a JSON object/,
      ],
    ];
    for (const [what, headers, body, re] of cases) {
      const r = await post(headers, body);
      assert.ok(r.status >= 400 && r.status < 500, `${what}: ${r.status}`);
      assert.match(r.body.error, re, what);
    }
    const big = await fetch(`${url}/`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: 'x'.repeat(5 * 1024 * 1024),
    });
    assert.equal(big.status, 413);
    assert.equal((await fetch(`${url}/healthz`)).status, 200);
  });
});

describe('names and batches (SPEC §12, §15)', () => {
  const ce = (type: string, data: object) => ({
    'ce-id': String(Math.random()),
    'ce-source': 's',
    'ce-specversion': '1.0',
    'ce-type': type,
    'content-type': 'application/json',
    _body: JSON.stringify(data),
  });
  const post = async (h: ReturnType<typeof ce>) => {
    const { _body, ...headers } = h;
    const r = await fetch(`${url}/`, { method: 'POST', headers, body: _body });
    const text = await r.text();
    responses.push(text);
    return { status: r.status, body: JSON.parse(text) as { error: string } };
  };
  it('refuses names that are not Kubernetes names ("..", ".", selector syntax) with 400', async () => {
    const cases: [object, RegExp][] = [
      [{ apiVersion: 'v1', kind: 'Namespace', name: '..' }, /not a valid Kubernetes object name/],
      [{ apiVersion: API_VERSION, kind: 'TerraformCluster', name: 'x', namespace: '..' }, /not a valid namespace name/],
      [
        { apiVersion: API_VERSION, kind: 'TerraformClusterIdentity', name: 'aws,metadata.namespace=x' },
        /not a valid Kubernetes object name/,
      ],
    ];
    for (const [data, re] of cases) {
      const r = await post(ce('dev.knative.apiserver.ref.update', data));
      assert.equal(r.status, 400, JSON.stringify(data));
      assert.match(r.body.error, re);
    }
    const p = await postPrepare(
      url,
      { apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: 'team', name: '.' },
      caller,
    );
    responses.push(p.text);
    assert.equal(p.status, 400);
    assert.match(p.body.error!, /not a valid object name/);
  });

  it('a mixed batch still processes its good events, and says which elements were bad', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const c = await createConsumer(a, n, 'batched', id);
    const body = JSON.stringify([consumerEvent(c).toJSON(), { specversion: '1.0', id: 'x' }, 'not an object']);
    const r = await fetch(`${url}/`, {
      method: 'POST',
      headers: { 'content-type': 'application/cloudevents-batch+json' },
      body,
    });
    const text = await r.text();
    responses.push(text);
    assert.equal(r.status, 400);
    const err = (JSON.parse(text) as { error: string }).error;
    assert.match(err, /batch\[1\]: invalid CloudEvent: lacks required attribute\(s\) source, type/);
    assert.match(err, /batch\[2\]: invalid CloudEvent: not a JSON object/);
    assert.doesNotMatch(err, /instancePath|\n/);
    assert.ok(await getMirror(a, n, id), 'the valid event was processed');
  });

  it('refuses a batch over 100 events whole, and a batch that is not an array', async () => {
    const big = JSON.stringify(
      Array.from({ length: 101 }, () => ({
        specversion: '1.0',
        id: '1',
        source: 's',
        type: 'dev.knative.sources.ping',
      })),
    );
    const r = await fetch(`${url}/`, {
      method: 'POST',
      headers: { 'content-type': 'application/cloudevents-batch+json' },
      body: big,
    });
    assert.equal(r.status, 400);
    assert.match(((await r.json()) as { error: string }).error, /batch holds 101 events; at most 100/);
    const obj = await fetch(`${url}/`, {
      method: 'POST',
      headers: { 'content-type': 'application/cloudevents-batch+json' },
      body: '{"specversion":"1.0"}',
    });
    assert.match(((await obj.json()) as { error: string }).error, /a batch must be a JSON array/);
  });

  it('a batch of 40 pings runs one resync, not 40', async () => {
    const before = log.entries().filter((e) => e.message === 'resync').length;
    const body = JSON.stringify(
      Array.from({ length: 40 }, (_, i) => ({
        specversion: '1.0',
        id: `p${i}`,
        source: 's',
        type: 'dev.knative.sources.ping',
      })),
    );
    const r = await fetch(`${url}/`, {
      method: 'POST',
      headers: { 'content-type': 'application/cloudevents-batch+json' },
      body,
    });
    responses.push(await r.text());
    assert.equal(r.status, 200);
    assert.equal(log.entries().filter((e) => e.message === 'resync').length - before, 1);
  });
});

describe('errors never carry Secret data (SPEC §15)', () => {
  it('a mirror write refused by a policy that quotes the data yields MirrorFailed without the values', async () => {
    const label = `captf-test-vap-${suffix()}`;
    const n = await ns.create({ [label]: 'true' });
    const id = await newIdentity({ list: [n] });
    // A careless policy whose message echoes the Secret's data back to the writer.
    ns.onCleanup(
      await refuseSecrets(a, {
        label,
        operations: ['CREATE', 'UPDATE'],
        messageExpression: "'rejected data: ' + string(object.data)",
      }),
    );
    const c = await createConsumer(a, n, 'refused', id);
    // The policy takes a moment to be enforced; until then the write may succeed.
    await eventually(
      'the policy to refuse the mirror write',
      async () => {
        await a.core.deleteNamespacedSecret({ name: mirrorName(id), namespace: n }).catch(() => undefined);
        const r = await send(`${url}/`, consumerEvent(c), { retries: 0 });
        // Refused for good: the condition says so and the event is not retried.
        return (
          r.status === 200 &&
          conditionOf(await getConsumer(a, n, 'refused'), 'CredentialsMirrored')?.reason === 'MirrorFailed'
        );
      },
      60_000,
    );
    const cond = conditionOf(await getConsumer(a, n, 'refused'), 'CredentialsMirrored')!;
    // Code, reason and the request only: the policy's message is never quoted (SPEC §15).
    assert.match(
      cond.message,
      new RegExp(`: HTTP 422 Invalid \\(create secrets "${mirrorName(id)}" in namespace "${n}"\\)`),
    );
    const prep = await postPrepare(
      url,
      { apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: n, name: 'refused' },
      caller,
    );
    const prepText = prep.text;
    responses.push(prepText);
    assert.equal(prep.status, 409);
    assert.equal(prep.body.reason, 'MirrorFailed');
    assertNoSecret(JSON.stringify(cond) + prepText, SECRET_VALUES, 'condition and prepare answer');
  });
});

describe('never leak a secret (SPEC §15)', () => {
  it('planted values appear in no log line, response, Event or condition', async () => {
    assertNoSecret(log.lines.join('\n'), SECRET_VALUES, 'mirror-sync logs');
    assertNoSecret(responses.join('\n'), SECRET_VALUES, 'HTTP responses');
    const events = await a.events.listEventForAllNamespaces({});
    assertNoSecret(JSON.stringify(events.items), SECRET_VALUES, 'Events');
    for (const plural of ['terraformclusters', 'terraformmachines']) {
      const all = await a.custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural });
      assertNoSecret(JSON.stringify(all), SECRET_VALUES, `${plural} status`);
    }
    assert.ok(log.lines.length > 10, 'the scan saw the logs of the tests above');
  });
});
