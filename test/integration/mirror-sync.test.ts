import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import {
  API_VERSION,
  DEFAULT_CONSUMER_KINDS,
  TERRAFORM_CLUSTER,
  TERRAFORM_MACHINE,
  type Consumer,
} from '../../functions/lib/api.ts';
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
import { consumerObjects } from '../../functions/lib/objects.ts';
import { isConflict } from '../../functions/lib/kube.ts';
import { Conflict } from '../../functions/mirror-sync/errors.ts';
import { writeConditions } from '../../functions/mirror-sync/status.ts';
import { eventually } from '../helpers/cluster.ts';
import { apiServerEvent } from '../helpers/events.ts';
import { startFaultProxy } from '../helpers/fault-proxy.ts';
import * as fx from '../helpers/fixtures.ts';
import { scanLater } from '../helpers/leaks.ts';
import { assertNoSecret, loggedAnswer, sentinel } from '../helpers/logs.ts';
import { EVENT_ANSWERS } from '../../functions/lib/http.ts';
import {
  consumerEvent,
  keyEvent,
  deliver,
  identityEvent,
  outcomes,
  mirrorSyncUnderTest,
  newIdentity,
  operatorSource,
  prepareManager,
  readCondition,
  refuseSecrets,
  type MirrorSyncUnderTest,
  type OperatorSource,
  type PrepareManager,
} from '../helpers/mirror-sync.ts';
import { prepareTarget } from '../helpers/prepare.ts';

const w = fx.world('ms');
const TC_RESOURCE = {
  group: TERRAFORM_CLUSTER.group,
  version: TERRAFORM_CLUSTER.version,
  plural: TERRAFORM_CLUSTER.plural,
};
const a = w.clients;
const SECRET_VALUES = [sentinel(), sentinel()];
const responses: string[] = [];
scanLater('HTTP answers', () => responses.join('\n'));
let ms: MirrorSyncUnderTest;
let source: OperatorSource;
/** The provider's manager: calls prepare with its audience-bound token (SPEC §5). */
let manager: PrepareManager;

const b64 = (s: string) => Buffer.from(s).toString('base64');
/** Sends an event and remembers the response text for the leak scan. */
async function send(...args: Parameters<typeof deliver>) {
  const r = await deliver(...args);
  responses.push(r.text);
  return r;
}
/** A condition type of another controller's own, which our status writes must keep. */
const PROVISIONED = {
  type: 'Provisioned',
  status: 'True' as const,
  reason: 'Applied',
  message: 'done',
  lastTransitionTime: '2026-01-01T00:00:00Z',
};
/** The Events (events.k8s.io) in `namespace` about the object named `name`. */
const eventsAbout = async (namespace: string, name: string) =>
  (await a.events.listNamespacedEvent({ namespace })).items.filter((e) => e.regarding?.name === name);

before(async () => {
  source = await operatorSource(
    w,
    fx.data({ AWS_ACCESS_KEY_ID: SECRET_VALUES[0]!, AWS_SECRET_ACCESS_KEY: SECRET_VALUES[1]! }),
  );
  ms = await mirrorSyncUnderTest(w);
  manager = await prepareManager(w, ms);
});
after(() => {
  const said = [...(ms?.log.lines ?? []), ...responses, ...(manager?.answers ?? [])].join('\n');
  assert.ok(!manager || !said.includes(manager.caller.token), 'the caller token appears in no log line or answer');
});

describe('mirror-sync reconcile (SPEC §4) through CloudEvents', () => {
  mirrorLifecycleTests();
  repairAndReleaseTests();
  conditionOwnershipTests();
});

/** A consumer's mirror: created, left alone when current, rotated, revoked. */
function mirrorLifecycleTests(): void {
  it('creating a consumer makes a mirror with exact labels, annotations, data and one owner reference', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const c = await w.create(fx.consumer('cluster-1', fx.inNamespace(n), fx.identityRef(id)));
    const r = await send(ms, consumerEvent(c, 'ref', 'add'));
    assert.equal(r.status, 200, r.text);
    const m = (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!;
    assert.equal(m.metadata!.name, `captf-creds-${id}`);
    assert.equal(m.type, 'Opaque');
    assert.deepEqual(m.metadata!.labels, { [LABEL_MIRRORED]: 'true', [LABEL_MANAGED]: 'true', [LABEL_MIRROR_OF]: id });
    const src = (await w.read(source.secret))!;
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
    const obj = (await w.read(c))!;
    assert.deepEqual(fx.conditionOf(obj, 'IdentityAllowed')?.reason, 'NamespaceAllowed');
    assert.equal(fx.conditionOf(obj, 'IdentityAllowed')?.status, 'True');
    assert.equal(fx.conditionOf(obj, 'CredentialsMirrored')?.status, 'True');
    assert.equal(fx.conditionOf(obj, 'CredentialsMirrored')?.reason, 'Mirrored');
    assert.equal(fx.conditionOf(obj, 'CredentialsMirrored')?.observedGeneration, obj.metadata.generation);
    // One Event for the reconcile (SPEC §4): the outcome's reason, every change in its note.
    const events = await eventsAbout(n, 'cluster-1');
    assert.deepEqual(
      events.map((e) => [e.reason, e.type, e.reportingController]),
      [['Mirrored', 'Normal', 'captf.io/mirror-sync']],
    );
    assert.match(events[0]!.note ?? '', /^CredentialsMirrored=True: .*; IdentityAllowed=True: /);
  });

  it('reconciles racing on one object record their change once', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const c = await w.create(fx.consumer('raced', fx.inNamespace(n), fx.identityRef(id)));
    const answers = await Promise.all(
      Array.from({ length: 6 }, (_, i) => send(ms, consumerEvent(c, i % 2 ? 'ref' : 'resource', 'add'))),
    );
    assert.deepEqual(
      answers.map((r) => r.status),
      [200, 200, 200, 200, 200, 200],
    );
    const reasons = (await eventsAbout(n, 'raced')).map((e) => e.reason);
    assert.deepEqual(reasons, ['Mirrored']);
  });

  it('repeated events write nothing: the echoes of our decision are recognised, a full reconcile changes nothing', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const c = await w.create(fx.consumer('steady', fx.inNamespace(n), fx.identityRef(id)));
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    assert.equal((await send(ms, consumerEvent(c))).status, 200);
    const m1 = (await w.read(mirror))!;
    const o1 = (await w.read(c))!;
    // Our conditions are current for the consumer's generation: each later event about it, in
    // either mode, is an echo (SPEC §12) — one read, no reconcile, answered as handled.
    for (let i = 0; i < 3; i++) {
      const r = await send(ms, consumerEvent(c, i % 2 ? 'resource' : 'ref'));
      assert.equal(r.status, 200, r.text);
      const [answer] = (JSON.parse(r.text) as { events: { skipped?: string; results: unknown[] }[] }).events;
      assert.match(answer!.skipped ?? '', /conditions on TerraformCluster .*steady are current for generation 1/);
      assert.deepEqual(answer!.results, []);
    }
    // The key's full reconcile re-reads everything and finds nothing to change.
    const full = await send(ms, keyEvent(n, id));
    assert.equal(full.status, 200, full.text);
    assert.deepEqual(outcomes(full.body), [[`${n}/steady`, 'mirrored']]);
    assert.equal((await w.read(mirror))!.metadata!.resourceVersion, m1.metadata!.resourceVersion);
    assert.equal((await w.read(c))!.metadata.resourceVersion, o1.metadata.resourceVersion);
    // Not asserted: that the first reconcile logged 'created'. Other test files' resyncs
    // (cluster-wide, on the same control plane) may reconcile this consumer between its
    // creation and our event and create the mirror first. Later reconciles change nothing.
    const lines = ms.log.entries().filter((e) => e.message === 'reconcile' && e.object === `${n}/steady`);
    assert.deepEqual(
      lines.slice(1).map((l) => l.mirrorAction),
      lines.slice(1).map(() => 'unchanged'),
    );
  });

  it('a rotated source reaches the mirror on the next reconcile', async () => {
    const n = await w.namespace();
    const rotating = fx.sourceSecret(w.name('rot'), fx.inNamespace(source.namespace), fx.data({ k: 'v1' }));
    await w.create(rotating);
    const id = await newIdentity(w, fx.secretRef(source.namespace, rotating.metadata!.name!), fx.allowList(n));
    const c = await w.create(fx.consumer('rot', fx.inNamespace(n), fx.identityRef(id)));
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    await send(ms, consumerEvent(c));
    assert.equal((await w.read(mirror))!.data!.k, b64('v1'));
    const { name, namespace: where } = rotating.metadata as { name: string; namespace: string };
    await a.core.replaceNamespacedSecret({
      name,
      namespace: where,
      body: fx.sourceSecret(name, fx.inNamespace(where), fx.data({ k: 'v2', extra: 'x' })),
    });
    // The consumer did not change (its own event would be an echo): the key's reconcile, as
    // the resync or the source-Secret fast path sends it, brings the rotation.
    await send(ms, keyEvent(n, id));
    const m = (await w.read(mirror))!;
    assert.deepEqual(m.data, { k: b64('v2'), extra: b64('x') });
    // Not asserted: that our reconcile logged 'updated'. Another test file's resync may
    // reconcile this consumer between the rotation and our event and write the new data
    // first; the mirror's content after our answer is what the rotation must achieve.
    assert.equal(m.metadata!.annotations![ANNOTATION_SOURCE_HASH], sourceHash(m.data));
  });

  it('narrowing the list revokes: the mirror is deleted and conditions say why', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n, 'elsewhere'));
    const c = await w.create(fx.consumer('narrowed', fx.inNamespace(n), fx.identityRef(id)));
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    await send(ms, consumerEvent(c));
    assert.ok(await w.read(mirror));
    const narrowed = await w.put(fx.identity(id, source.ref, fx.allowList('elsewhere')));
    const r = await send(ms, identityEvent(narrowed));
    assert.equal(r.status, 200, r.text);
    assert.equal(await w.read(mirror), undefined);
    const obj = (await w.read(c))!;
    assert.equal(fx.conditionOf(obj, 'IdentityAllowed')?.status, 'False');
    assert.equal(fx.conditionOf(obj, 'IdentityAllowed')?.reason, 'NamespaceNotAllowed');
    assert.equal(fx.conditionOf(obj, 'CredentialsMirrored'), undefined, 'no stale Mirrored=True after revocation');
    // The consumer's own event after the revocation (the echo of our status write) changes
    // nothing: one revocation, one Warning Event.
    assert.equal((await send(ms, consumerEvent(c))).status, 200);
    const events = await eventsAbout(n, 'narrowed');
    assert.equal(events.filter((e) => e.reason === 'NamespaceNotAllowed' && e.type === 'Warning').length, 1);
  });

  it('relabelling the namespace revokes a selector identity (namespace event fans out)', async () => {
    const label = { 'captf.io/tenant': w.name('tenant') };
    const n = await w.namespace(fx.labels(label));
    const id = await source.newIdentity(fx.allowSelector({ matchLabels: label }));
    const c = await w.create(fx.consumer('relabel', fx.inNamespace(n), fx.identityRef(id)));
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    await send(ms, consumerEvent(c));
    assert.ok(await w.read(mirror));
    const nsObj = (await w.read(fx.namespace(n)))!;
    nsObj.metadata!.labels = { 'captf.io/tenant': 'someone-else' };
    const updated = await a.core.replaceNamespace({ name: n, body: nsObj });
    const r = await send(ms, apiServerEvent(updated as never, 'resource', 'update', 'namespaces'));
    assert.equal(r.status, 200, r.text);
    assert.equal(await w.read(mirror), undefined);
    assert.equal((await readCondition(w, c, 'IdentityAllowed'))?.reason, 'NamespaceNotAllowed');
  });

  it('deleting the identity revokes: mirror deleted, IdentityNotFound, answered as handled (it waits for a person)', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const c = await w.create(fx.consumer('orphaned', fx.inNamespace(n), fx.identityRef(id)));
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    await send(ms, consumerEvent(c));
    assert.ok(await w.read(mirror));
    await w.delete(fx.identity(id));
    const r = await send(ms, identityEvent(fx.identity(id), 'ref', 'delete'), { retries: 0 });
    assert.equal(r.status, 200, 'IdentityNotFound waits for a person: a retry cannot fix it (SPEC §4)');
    assert.equal(await w.read(mirror), undefined);
    const cond = await readCondition(w, c, 'IdentityAllowed');
    assert.equal(cond?.status, 'False');
    assert.equal(cond?.reason, 'IdentityNotFound');
  });
}

/** Stale owners, hand edits, Secrets in the way, missing sources, and releasing a mirror. */
function repairAndReleaseTests(): void {
  it('an object deleted and recreated under the same name gets its stale owner reference replaced', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const keep = await w.create(
      fx.consumer('keeper', fx.inNamespace(n), fx.identityRef(id), fx.ofKind(TERRAFORM_MACHINE)),
    );
    const c1 = await w.create(fx.consumer('phoenix', fx.inNamespace(n), fx.identityRef(id)));
    await send(ms, [consumerEvent(keep), consumerEvent(c1)], { mode: 'batch' });
    await w.delete(c1);
    const c2 = await w.create(fx.consumer('phoenix', fx.inNamespace(n), fx.identityRef(id)));
    assert.notEqual(c1.metadata.uid, c2.metadata.uid);
    await send(ms, consumerEvent(c2, 'resource', 'add'));
    const refs = (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!.metadata!.ownerReferences!;
    const phoenix = refs.filter((r) => r.name === 'phoenix');
    assert.deepEqual(
      phoenix.map((r) => r.uid),
      [c2.metadata.uid],
    );
    assert.ok(refs.some((r) => r.name === 'keeper' && r.kind === 'TerraformMachine'));
  });

  it('a mirror deleted by hand is recreated; one edited by hand (annotation kept) is repaired', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const c = await w.create(fx.consumer('repair', fx.inNamespace(n), fx.identityRef(id)));
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    await send(ms, consumerEvent(c));
    const good = (await w.read(mirror))!;
    // Mirrors are not watched: the resync's key event repairs them (the consumer's own event,
    // its conditions current, is an echo).
    await w.delete(mirror);
    await send(ms, keyEvent(n, id));
    assert.deepEqual((await w.read(mirror))!.data, good.data);
    const m = (await w.read(mirror))!;
    m.data = { ...m.data, AWS_SECRET_ACCESS_KEY: b64('tampered') };
    await a.core.replaceNamespacedSecret({ name: mirrorName(id), namespace: n, body: m });
    assert.equal(
      (await w.read(mirror))!.metadata!.annotations![ANNOTATION_SOURCE_HASH],
      good.metadata!.annotations![ANNOTATION_SOURCE_HASH],
    );
    await send(ms, keyEvent(n, id));
    assert.deepEqual((await w.read(mirror))!.data, good.data);
  });

  it('a blocking non-mirror Secret is never written; MirrorFailed until it is removed, then the mirror appears', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    const blocker = await w.create(
      fx.mirrorOf(
        id,
        fx.inNamespace(n),
        fx.labels({ [LABEL_MIRRORED]: 'true' }),
        fx.annotations({ [ANNOTATION_IDENTITY]: 'some-other-identity' }),
        fx.data({ mine: 'hands off' }),
      ),
    );
    const c = await w.create(fx.consumer('blocked', fx.inNamespace(n), fx.identityRef(id)));
    const r = await send(ms, consumerEvent(c), { retries: 0 });
    assert.equal(r.status, 200, 'a blocking Secret needs a human, not a retry storm');
    const still = (await w.read(mirror))!;
    assert.equal(still.metadata!.resourceVersion, blocker.metadata!.resourceVersion);
    assert.ok(!isOurs(still, id, undefined));
    const cond = await readCondition(w, c, 'CredentialsMirrored');
    assert.equal(cond?.status, 'False');
    assert.equal(cond?.reason, 'MirrorFailed');
    assert.match(cond!.message, new RegExp(`Secret ${n}/${mirrorName(id)} exists and is not a mirror`));
    // Deleting the consumer must not delete someone else's Secret either.
    await w.delete(mirror);
    await send(ms, keyEvent(n, id));
    assert.ok(isOurs(await w.read(mirror), id, undefined));
    assert.equal((await readCondition(w, c, 'CredentialsMirrored'))?.reason, 'Mirrored');
  });

  it("an identity's pass finds a Secret in its mirror's way by name: never written, MirrorFailed", async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList('elsewhere'));
    const blocker = await w.create(fx.mirrorOf(id, fx.inNamespace(n), fx.data({ mine: 'hands off' })));
    const c = await w.create(fx.consumer('in-the-way', fx.inNamespace(n), fx.identityRef(id)));
    assert.equal((await send(ms, consumerEvent(c), { retries: 0 })).status, 200);
    const widened = await w.put(fx.identity(id, source.ref, fx.allowList('elsewhere', n)));
    const r = await send(ms, identityEvent(widened), { retries: 0 });
    assert.equal(r.status, 200, r.text);
    assert.equal(
      (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!.metadata!.resourceVersion,
      blocker.metadata!.resourceVersion,
    );
    const cond = await readCondition(w, c, 'CredentialsMirrored');
    assert.equal(cond?.reason, 'MirrorFailed');
    assert.match(cond!.message, /exists and is not a mirror/);
  });

  it('a missing source Secret gives SourceNotFound, answered as handled', async () => {
    const n = await w.namespace();
    const id = await newIdentity(w, fx.secretRef(source.namespace, 'does-not-exist'), fx.allowList(n));
    const c = await w.create(fx.consumer('nosource', fx.inNamespace(n), fx.identityRef(id)));
    const r = await send(ms, consumerEvent(c), { retries: 0 });
    assert.equal(r.status, 200, 'the source event (or the resync) brings the change, not a retry');
    const cond = await readCondition(w, c, 'CredentialsMirrored');
    assert.equal(cond?.reason, 'SourceNotFound');
    assert.match(cond!.message, /does-not-exist/);
    assert.equal(await w.read(fx.mirrorOf(id, fx.inNamespace(n))), undefined);
  });

  it("the last user's deletion deletes the mirror, but not while another user exists", async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const c1 = await w.create(fx.consumer('first', fx.inNamespace(n), fx.identityRef(id)));
    const c2 = await w.create(
      fx.consumer('second', fx.inNamespace(n), fx.identityRef(id), fx.ofKind(TERRAFORM_MACHINE)),
    );
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    await send(ms, [consumerEvent(c1), consumerEvent(c2)], { mode: 'batch' });
    assert.equal((await w.read(mirror))!.metadata!.ownerReferences!.length, 2);
    await w.delete(c1);
    await send(ms, consumerEvent(c1, 'resource', 'delete'));
    const m = await w.read(mirror);
    assert.ok(m, 'still used by the second consumer');
    assert.deepEqual(
      m.metadata!.ownerReferences!.map((r) => r.name),
      ['second'],
    );
    await w.delete(c2);
    await send(ms, consumerEvent(c2, 'ref', 'delete'));
    // Our delete, or the garbage collector's: either way the credentials are gone.
    await eventually('mirror deleted after the last user', async () => (await w.read(mirror)) === undefined);
  });

  it("removing identityRef releases the mirror and clears our conditions, keeping other writers' conditions", async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const c = await w.create(fx.consumer('quitter', fx.inNamespace(n), fx.identityRef(id)));
    await send(ms, consumerEvent(c));
    await fx.applyStatusAs(
      a,
      fx.consumer('quitter', fx.inNamespace(n), fx.conditions(PROVISIONED)),
      'provider-manager',
    );
    await send(ms, consumerEvent(c));
    assert.equal(
      (await readCondition(w, c, 'Provisioned'))?.reason,
      'Applied',
      "other writers' types survive our apply",
    );
    await w.put(fx.consumer('quitter', fx.inNamespace(n)));
    await send(ms, consumerEvent(c));
    const after = (await w.read(c))!;
    assert.equal(fx.conditionOf(after, 'CredentialsMirrored'), undefined);
    assert.equal(fx.conditionOf(after, 'IdentityAllowed'), undefined);
    assert.equal(fx.conditionOf(after, 'Provisioned')?.reason, 'Applied');
    assert.equal(await w.read(fx.mirrorOf(id, fx.inNamespace(n))), undefined, 'it was the only user');
  });

  it('a consumer that switches identity lets go of the old mirror', async () => {
    const n = await w.namespace();
    const id1 = await source.newIdentity(fx.allowList(n));
    const id2 = await source.newIdentity(fx.allowList(n));
    const c = await w.create(fx.consumer('switcher', fx.inNamespace(n), fx.identityRef(id1)));
    await send(ms, consumerEvent(c));
    await w.put(fx.consumer('switcher', fx.inNamespace(n), fx.identityRef(id2)));
    await send(ms, consumerEvent(c));
    assert.equal(await w.read(fx.mirrorOf(id1, fx.inNamespace(n))), undefined);
    assert.ok(await w.read(fx.mirrorOf(id2, fx.inNamespace(n))));
  });

  it('structured mode works too', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowSelector());
    const c = await w.create(fx.consumer('structured', fx.inNamespace(n), fx.identityRef(id)));
    const r = await send(ms, consumerEvent(c, 'resource', 'add'), { mode: 'structured' });
    assert.equal(r.status, 200, r.text);
    assert.ok(await w.read(fx.mirrorOf(id, fx.inNamespace(n))));
  });
}

describe('prepare (SPEC §5)', () => {
  it('answers 200 {mirror, sourceHash} on an allowed namespace, with the mirror current and owned', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const c = await w.create(fx.consumer('prep', fx.inNamespace(n), fx.identityRef(id)));
    const r = await manager.prepare(prepareTarget(c));
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const m = (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!;
    assert.equal(r.body.mirror, m.metadata!.name);
    assert.equal(r.body.sourceHash, sourceHash(m.data));
    assert.ok(m.metadata!.ownerReferences!.some((o) => o.uid === c.metadata.uid));
  });

  it('refuses a namespace that is not allowed; a deleting object shows ApplyJobSucceeded=False/IdentityNotAllowed and prepare keeps refusing', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const c = await w.create(
      fx.consumer('doomed', fx.inNamespace(n), fx.identityRef(id), fx.finalizers('captf.io/test-destroy')),
    );
    w.onCleanup(async () => {
      const o = await w.read(c);
      if (o) await w.put({ ...o, metadata: { ...o.metadata, finalizers: [] } });
    });
    assert.equal((await manager.prepare(prepareTarget(c))).status, 200);
    await w.put(fx.identity(id, source.ref, fx.allowList()));
    await w.delete(c);
    const r = await manager.prepare(prepareTarget(c));
    assert.equal(r.status, 403);
    assert.equal(r.body.reason, 'IdentityNotAllowed');
    assert.equal(await w.read(fx.mirrorOf(id, fx.inNamespace(n))), undefined);
    const obj = (await w.read(c))!;
    assert.ok(obj.metadata.deletionTimestamp);
    assert.equal(fx.conditionOf(obj, 'ApplyJobSucceeded')?.status, 'False');
    assert.equal(fx.conditionOf(obj, 'ApplyJobSucceeded')?.reason, 'IdentityNotAllowed');
    const ev = await send(ms, consumerEvent(c), { retries: 0 });
    assert.equal(ev.status, 200, 'the event is handled: the namespace waits for a person');
    assert.equal((await manager.prepare(prepareTarget(c))).status, 403, 'prepare keeps refusing the destroy');
    // The way out: allow the namespace again.
    await w.put(fx.identity(id, source.ref, fx.allowList(n)));
    assert.equal((await manager.prepare(prepareTarget(c))).status, 200);
    assert.equal(await readCondition(w, c, 'ApplyJobSucceeded'), undefined);
  });

  it('answers the other reasons with non-2xx JSON', async () => {
    const n = await w.namespace();
    assert.equal(
      (await manager.prepare(prepareTarget(fx.consumer('nope', fx.inNamespace(n))))).body.reason,
      'ObjectNotFound',
    );
    const lost = await w.create(fx.consumer('lost', fx.inNamespace(n), fx.identityRef(w.name('id-missing'))));
    const r = await manager.prepare(prepareTarget(lost));
    assert.equal(r.status, 404, 'IdentityNotFound waits for a person (SPEC §5)');
    assert.equal(r.body.reason, 'IdentityNotFound');
    const target = prepareTarget(fx.consumer('x', fx.inNamespace(n)));
    for (const bad of [
      'not json',
      '[]',
      { ...target, name: undefined },
      { ...target, apiVersion: 'v1', kind: 'Pod' },
    ]) {
      const b = await manager.prepare(bad);
      assert.equal(b.status, 400, JSON.stringify(bad));
      assert.ok(b.body.error);
    }
  });
});

/**
 * POSTs `body` to mirror-sync as is; remembers the answer for the leak scan. Its `error` is
 * what mirror-sync logged for the answer; the answer itself must be one of the fixed
 * sentences that name nothing (SPEC §12), or empty for a 200.
 */
async function post(headers: Record<string, string>, body: string) {
  const r = await fetch(ms.url, { method: 'POST', headers, body });
  const text = await r.text();
  responses.push(text);
  if (r.status === 200) assert.equal(text, '');
  else assert.ok(Object.values(EVENT_ANSWERS).includes((JSON.parse(text) as { error: string }).error), text);
  const detail = (await loggedAnswer(ms.log, r.headers)) as { error?: string };
  return { status: r.status, error: detail.error ?? '' };
}
/** Binary-mode CloudEvent headers of `type` with JSON content, less the header `without`. */
function ce(type: string, without?: string): Record<string, string> {
  const headers: Record<string, string> = {
    'ce-id': randomUUID(),
    'ce-source': 's',
    'ce-specversion': '1.0',
    'ce-type': type,
    'content-type': 'application/json',
  };
  if (without) delete headers[without];
  return headers;
}
const BATCH = { 'content-type': 'application/cloudevents-batch+json' };

describe('bad input (SPEC §15)', () => {
  const REF_ADD = 'dev.knative.apiserver.ref.add';
  fx.rows(
    [
      {
        name: 'no CloudEvent at all',
        headers: { 'content-type': 'application/json' },
        body: '{}',
        error: /not a CloudEvent/,
      },
      {
        name: 'structured, not JSON',
        headers: { 'content-type': 'application/cloudevents+json' },
        body: '{nope',
        error: /not a CloudEvent/,
      },
      { name: 'missing type', headers: ce('t', 'ce-type'), body: '{}', error: /lacks required header\(s\) ce-type/ },
      { name: 'missing id', headers: ce('t', 'ce-id'), body: '{}', error: /lacks required header\(s\) ce-id/ },
      { name: 'unknown type', headers: ce('com.example.other'), body: '{}', error: /unsupported event type/ },
      { name: 'ref event naming nothing', headers: ce(REF_ADD), body: '{}', error: /must name the object/ },
      {
        name: 'unknown kind',
        headers: ce(REF_ADD),
        body: '{"apiVersion":"v1","kind":"Pod","name":"p","namespace":"x"}',
        error: /does not handle/,
      },
      {
        name: 'source Secret event while the fast path is off',
        headers: ce('dev.knative.apiserver.ref.update'),
        body: '{"apiVersion":"v1","kind":"Secret","name":"p","namespace":"x"}',
        error: /fast path is off/,
      },
      { name: 'empty batch', headers: BATCH, body: '[]', error: /empty CloudEvents batch|not a CloudEvent/ },
      { name: 'key event without data', headers: ce(KEY_EVENT_TYPE), body: '{}', error: /must be \{"namespace"/ },
      {
        name: 'key event with a path in the namespace',
        headers: ce(KEY_EVENT_TYPE),
        body: '{"namespace":"../kube-system","identity":"aws"}',
        error: /must be \{"namespace"/,
      },
      {
        name: 'key event with a bad identity name',
        headers: ce(KEY_EVENT_TYPE),
        body: '{"namespace":"team","identity":".."}',
        error: /must be \{"namespace"/,
      },
      {
        name: 'key event whose data is not an object',
        headers: ce(KEY_EVENT_TYPE),
        body: '["team","aws"]',
        error: /data must be a JSON object/,
      },
    ],
    async ({ name, headers, body, error }) => {
      const r = await post(headers, body);
      assert.ok(r.status >= 400 && r.status < 500, `${name}: ${r.status}`);
      assert.match(r.error, error, name);
    },
  );

  it('a body over the limit gets 413, and the server keeps serving', async () => {
    const big = await fetch(ms.url, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: 'x'.repeat(5 * 1024 * 1024),
    });
    assert.equal(big.status, 413);
    assert.equal((await fetch(`${ms.url}healthz`)).status, 200);
  });
});

describe('names and batches (SPEC §12, §15)', () => {
  it('refuses names that are not Kubernetes names ("..", ".", selector syntax) with 400', async () => {
    // Ref-mode event data: apiVersion, kind, name and namespace of the object.
    const ref = (o: { apiVersion?: string; kind?: string; metadata?: { name?: string; namespace?: string } }) =>
      JSON.stringify({
        apiVersion: o.apiVersion,
        kind: o.kind,
        name: o.metadata?.name,
        namespace: o.metadata?.namespace,
      });
    const cases: [string, RegExp][] = [
      [ref(fx.namespace('..')), /not a valid Kubernetes object name/],
      [ref(fx.consumer('x', fx.inNamespace('..'))), /not a valid namespace name/],
      [ref(fx.identity('aws,metadata.namespace=x')), /not a valid Kubernetes object name/],
    ];
    for (const [data, re] of cases) {
      const r = await post(ce('dev.knative.apiserver.ref.update'), data);
      assert.equal(r.status, 400, data);
      assert.match(r.error, re);
    }
    const p = await manager.prepare(prepareTarget(fx.consumer('.', fx.inNamespace('team'))));
    assert.equal(p.status, 400);
    assert.match(p.body.error!, /not a valid object name/);
  });

  it('a mixed batch still processes its good events, and says which elements were bad', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const c = await w.create(fx.consumer('batched', fx.inNamespace(n), fx.identityRef(id)));
    const body = JSON.stringify([consumerEvent(c).toJSON(), { specversion: '1.0', id: 'x' }, 'not an object']);
    const r = await post(BATCH, body);
    assert.equal(r.status, 400);
    assert.match(r.error, /batch\[1\]: invalid CloudEvent: lacks required attribute\(s\) source, type/);
    assert.match(r.error, /batch\[2\]: invalid CloudEvent: not a JSON object/);
    assert.doesNotMatch(r.error, /instancePath|\n/);
    assert.ok(await w.read(fx.mirrorOf(id, fx.inNamespace(n))), 'the valid event was processed');
  });

  /** A batch of `count` PingSource ticks, as JSON. */
  const pings = (count: number) =>
    JSON.stringify(
      Array.from({ length: count }, (_, i) => ({
        specversion: '1.0',
        id: `p${i}`,
        source: 's',
        type: 'dev.knative.sources.ping',
      })),
    );

  it('refuses a batch over 100 events whole, and a batch that is not an array', async () => {
    const r = await post(BATCH, pings(101));
    assert.equal(r.status, 400);
    assert.match(r.error, /batch holds 101 events; at most 100/);
    assert.match((await post(BATCH, '{"specversion":"1.0"}')).error, /a batch must be a JSON array/);
  });

  it('a batch of 40 pings runs one resync, not 40', async () => {
    const resyncs = () => ms.log.entries().filter((e) => e.message === 'resync').length;
    const before = resyncs();
    assert.equal((await post(BATCH, pings(40))).status, 200);
    assert.equal(resyncs() - before, 1);
  });
});

describe('errors never carry Secret data (SPEC §15)', () => {
  it('a mirror write refused by a policy that quotes the data yields MirrorFailed without the values', async () => {
    const label = w.name('vap');
    const n = await w.namespace(fx.labels({ [label]: 'true' }));
    const id = await source.newIdentity(fx.allowList(n));
    // A careless policy whose message echoes the Secret's data back to the writer.
    w.onCleanup(
      await refuseSecrets(a, {
        label,
        operations: ['CREATE', 'UPDATE'],
        messageExpression: "'rejected data: ' + string(object.data)",
      }),
    );
    const c = await w.create(fx.consumer('refused', fx.inNamespace(n), fx.identityRef(id)));
    // The policy takes a moment to be enforced; until then the write may succeed.
    await eventually(
      'the policy to refuse the mirror write',
      async () => {
        await w.delete(fx.mirrorOf(id, fx.inNamespace(n)));
        // The key's reconcile: once the consumer is decided, its own event is only an echo.
        const r = await send(ms, keyEvent(n, id), { retries: 0 });
        // Refused for good: the condition says so and the event is not retried.
        return r.status === 200 && (await readCondition(w, c, 'CredentialsMirrored'))?.reason === 'MirrorFailed';
      },
      60_000,
    );
    const cond = (await readCondition(w, c, 'CredentialsMirrored'))!;
    // Code, reason and the request only: the policy's message is never quoted (SPEC §15).
    assert.match(
      cond.message,
      new RegExp(`: HTTP 422 Invalid \\(create secrets "${mirrorName(id)}" in namespace "${n}"\\)`),
    );
    const prep = await manager.prepare(prepareTarget(c));
    assert.equal(prep.status, 409);
    assert.equal(prep.body.reason, 'MirrorFailed');
    assertNoSecret(JSON.stringify(cond) + prep.text, SECRET_VALUES, 'condition and prepare answer');
  });
});

describe('never leak a secret (SPEC §15)', () => {
  it('planted values appear in no log line, response, Event or condition', async () => {
    assertNoSecret(ms.log.lines.join('\n'), SECRET_VALUES, 'mirror-sync logs');
    assertNoSecret([...responses, ...manager.answers].join('\n'), SECRET_VALUES, 'HTTP responses');
    const events = await a.events.listEventForAllNamespaces({});
    assertNoSecret(JSON.stringify(events.items), SECRET_VALUES, 'Events');
    for (const kind of DEFAULT_CONSUMER_KINDS) {
      const all = await consumerObjects(a, kind).list();
      assertNoSecret(JSON.stringify(all), SECRET_VALUES, `${kind.plural} status`);
    }
    assert.ok(ms.log.lines.length > 10, 'the scan saw the logs of the tests above');
  });
});

/** Whose conditions are whose (server-side apply's field managers, SPEC §4, §16). */
function conditionOwnershipTests(): void {
  describe('our conditions go even after a managedFields reset, and then nothing is written', () => {
    fx.rows(
      [
        {
          name: 'the namespace revoked',
          change: (id: string, n: string) => w.put(fx.identity(id, source.ref, fx.allowList(`${n}-other`))),
          // The consumer did not change: its own event would be an echo; the key's reconcile decides.
          trigger: (_c: Consumer, id: string, n: string) => keyEvent(n, id),
          left: ['IdentityAllowed', 'Provisioned'],
        },
        {
          name: 'spec.identityRef removed',
          change: (_id: string, n: string) => w.put(fx.consumer('reset', fx.inNamespace(n))),
          trigger: (c: Consumer) => consumerEvent(c),
          left: ['Provisioned'],
        },
      ],
      async ({ change, trigger, left }) => {
        const n = await w.namespace();
        const id = await source.newIdentity(fx.allowList(n));
        const c = await w.create(fx.consumer('reset', fx.inNamespace(n), fx.identityRef(id)));
        await send(ms, consumerEvent(c));
        await fx.applyStatusAs(a, fx.consumer('reset', fx.inNamespace(n), fx.conditions(PROVISIONED)), 'provider');
        // The documented reset: the API server forgets every owner, then gives all to
        // `before-first-apply` at the next apply.
        await a.custom.patchNamespacedCustomObject(
          { ...TC_RESOURCE, namespace: n, name: 'reset', body: { metadata: { managedFields: [{}] } } },
          setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
        );
        await change(id, n);
        const statusWrites: string[] = [];
        const proxy = await startFaultProxy((method, url) => {
          if (method === 'PATCH' && url.includes(`/namespaces/${n}/terraformclusters/reset/status`))
            statusWrites.push(url);
          return undefined;
        });
        try {
          const through = await mirrorSyncUnderTest(w, { kubeconfig: proxy.kubeconfigPath, log: ms.log });
          assert.equal((await send(through, trigger(c, id, n))).status, 200);
          const types = (await w.read(c))!.status!.conditions!.map((x) => x.type).sort();
          assert.deepEqual(types, left, 'our stale condition is gone; the other writer’s stays');
          statusWrites.length = 0;
          assert.equal((await send(through, trigger(c, id, n))).status, 200);
          assert.deepEqual(statusWrites, [], 'the reconcile after the removal writes no status');
        } finally {
          proxy.close();
        }
      },
    );
  });

  /** `IdentityAllowed=False/IdentityNotFound` with `message`, decided for generation 1. */
  const identityNotFound = (message: string) => ({
    type: 'IdentityAllowed',
    status: 'False' as const,
    reason: 'IdentityNotFound',
    message,
    observedGeneration: 1,
  });

  it('conditions decided for a consumer never land on one recreated under its name (resourceVersion precondition)', async () => {
    const n = await w.namespace();
    const old = await w.create(fx.consumer('phoenix-status', fx.inNamespace(n), fx.identityRef('some-identity')));
    await w.delete(old);
    const recreated = await w.create(fx.consumer('phoenix-status', fx.inNamespace(n), fx.identityRef('some-identity')));
    const decided = identityNotFound('m');
    await assert.rejects(
      writeConditions(a, { kind: TERRAFORM_CLUSTER, consumer: old }, [decided], {
        now: new Date(),
        logger: ms.log.logger,
      }),
      (err: unknown) => err instanceof Conflict && isConflict(err),
      'a conflict: the reconcile decides again from a fresh read',
    );
    assert.equal((await w.read(recreated))!.status?.conditions, undefined, 'nothing written on the new object');
  });

  it('a condition write that meets a 409 because another instance wrote the same decision is done, not decided again', async () => {
    const n = await w.namespace();
    const c = await w.create(fx.consumer('twice', fx.inNamespace(n), fx.identityRef('no-such-identity')));
    const decided = identityNotFound('TerraformClusterIdentity no-such-identity does not exist');
    const write = (d: typeof decided) =>
      writeConditions(a, { kind: TERRAFORM_CLUSTER, consumer: c }, [d], { now: new Date(), logger: ms.log.logger });
    assert.equal(await write(decided), true, 'the first instance writes');
    assert.equal(await write(decided), false, 'the second, from the same read, meets a 409 and finds it written');
    await assert.rejects(
      write({ ...decided, message: 'another decision' }),
      (err: unknown) => err instanceof Conflict,
      'a different decision from an old read is decided again',
    );
  });

  it('a condition of our type that another controller also claims is left alone, with no write', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const c = await w.create(fx.consumer('shared', fx.inNamespace(n), fx.identityRef(id)));
    await send(ms, consumerEvent(c));
    const theirs = { ...PROVISIONED, type: 'ApplyJobSucceeded', reason: 'JobCompleted' };
    await fx.applyStatusAs(a, fx.consumer('shared', fx.inNamespace(n), fx.conditions(theirs)), 'provider');
    const before = (await w.read(c))!;
    // A full reconcile of the key (the consumer's own event would be an echo).
    assert.equal((await send(ms, keyEvent(n, id))).status, 200);
    const after = (await w.read(c))!;
    assert.equal(fx.conditionOf(after, 'ApplyJobSucceeded')?.reason, 'JobCompleted');
    assert.equal(after.metadata.resourceVersion, before.metadata.resourceVersion, 'no write');
  });
}
