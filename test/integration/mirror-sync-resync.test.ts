import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { before, describe, it } from 'node:test';
import type { V1Secret } from '@kubernetes/client-node';
import { TERRAFORM_CLUSTER, TERRAFORM_MACHINE, type Consumer } from '../../functions/lib/api.ts';
import { KEY_EVENT_TYPE } from '../../functions/lib/cloudevents.ts';
import { desiredMirror, mirrorName, ownerReferenceFor } from '../../functions/lib/mirror.ts';
import { controlPlaneDir, eventually } from '../helpers/cluster.ts';
import { apiServerEvent, pingEvent, startSink } from '../helpers/events.ts';
import { startFaultProxy } from '../helpers/fault-proxy.ts';
import * as fx from '../helpers/fixtures.ts';
import {
  alternatingKinds,
  consumerEvent,
  consumerKindsSetting,
  createConsumers,
  deliver,
  deliverAll,
  mirrorSyncUnderTest,
  newIdentity,
  operatorSource,
  outcomes,
  readCondition,
  type MirrorSyncUnderTest,
  type OperatorSource,
} from '../helpers/mirror-sync.ts';
import { assertNoSecret, loggedAnswer, sentinel } from '../helpers/logs.ts';
import { spawnFunction } from '../helpers/process.ts';

const w = fx.world('msr');
const a = w.clients;
let ms: MirrorSyncUnderTest;
let source: OperatorSource;
const b64 = (s: string) => Buffer.from(s).toString('base64');

before(async () => {
  source = await operatorSource(w, fx.data({ token: 't0' }));
  ms = await mirrorSyncUnderTest(w, { env: { CAPTF_CONCURRENCY: '16' } });
});

describe('concurrency (SPEC §15)', () => {
  it('50 consumers in one namespace, events duplicated and reordered: exactly 50 owner references, no error left', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const consumers = await createConsumers(w, n, id, 'c', 50, alternatingKinds);
    // Each consumer's add event twice, once per mode, shuffled, sent all at once in
    // separate requests (as a Broker would), with Knative-style retries on 5xx.
    const events = consumers.flatMap((c) => [
      consumerEvent(c, 'ref', 'add'),
      consumerEvent(c, 'resource', 'add'),
      consumerEvent(c, 'ref', 'update'),
    ]);
    for (let i = events.length - 1; i > 0; i--) {
      const j = Math.floor(Math.random() * (i + 1));
      [events[i], events[j]] = [events[j]!, events[i]!];
    }
    await deliverAll(ms.url, events);
    const m = (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!;
    const refs = m.metadata!.ownerReferences!;
    assert.equal(refs.length, 50);
    assert.deepEqual(new Set(refs.map((r) => r.uid)), new Set(consumers.map((c) => c.metadata.uid)));
    for (const c of consumers) {
      assert.equal((await readCondition(w, c, 'CredentialsMirrored'))?.reason, 'Mirrored', c.metadata.name);
    }
  });

  it('50 consumers deleted at once never delete the mirror while one still uses it', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const consumers = await createConsumers(w, n, id, 'd', 20);
    await Promise.all(consumers.map((c) => deliver(ms, consumerEvent(c), { retries: 10 })));
    const survivor = consumers[0]!;
    const doomed = consumers.slice(1);
    await Promise.all(doomed.map((c) => w.delete(c)));
    await deliverAll(
      ms.url,
      doomed.map((c) => consumerEvent(c, 'resource', 'delete')),
    );
    const m = await w.read(fx.mirrorOf(id, fx.inNamespace(n)));
    assert.ok(m, 'the survivor still uses the mirror');
    assert.deepEqual(
      m.metadata!.ownerReferences!.map((r) => r.uid),
      [survivor.metadata.uid],
    );
  });
});

describe('resync on a ping (SPEC §6, §12)', () => {
  // The resync is cluster-wide and every test file shares one control plane: other files'
  // pings (running at the same time) reconcile these consumers and collect these orphans
  // too. So these tests assert end states and what this instance itself said or logged,
  // never the cluster-wide counters of the summary (which another file's work changes).
  it('reconciles every consumer and garbage-collects orphaned mirrors', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    // A consumer whose add event was lost: only a resync can mirror for it.
    const missed = await w.create(fx.consumer('missed', fx.inNamespace(n), fx.identityRef(id)));
    // An orphan: a mirror of ours left with no user at all (lost delete events). Without
    // owner references Kubernetes' garbage collector never touches it, and no object event
    // maps to its key (no consumer names its identity): only a resync can delete it. Whose
    // resync does (this ping's, or another test file's running at the same time) does not
    // matter: it is the same code; if resyncs stopped collecting orphans it would stay.
    const orphanId = w.name('id');
    const orphan = desiredMirror(
      orphanId,
      n,
      { k: b64('v') },
      ownerReferenceFor(fx.consumer('long-gone', fx.uid('00000000-0000-0000-0000-000000000001'))),
    );
    orphan.metadata.ownerReferences = [];
    await w.create(orphan as V1Secret);
    // A Secret that only looks like a mirror (not ours: no identity annotation) is left alone.
    const foreign = desiredMirror(w.name('other'), n, {}, { apiVersion: 'v1', kind: 'ConfigMap', name: 'x', uid: '1' });
    foreign.metadata.annotations = {};
    foreign.metadata.ownerReferences = []; // else Kubernetes' own garbage collector removes it
    foreign.metadata.name = w.name('lookalike');
    const foreignBefore = await w.create(foreign as V1Secret);
    const r = await deliver(ms, pingEvent());
    assert.equal(r.status, 200, r.text);
    // The answer carries this resync's summary; its counts cover the whole cluster, where
    // other files work concurrently, so only its presence is checked here.
    const summary = (r.body as { events: { resync?: Record<string, unknown> }[] }).events[0]!.resync;
    assert.equal(typeof summary?.orphanedMirrorsDeleted, 'number', r.text);
    // The ping is answered after the work: this pass listed 'missed' after it was created.
    const m = await w.read(fx.mirrorOf(id, fx.inNamespace(n)));
    assert.ok(m, 'the missed consumer got its mirror');
    assert.deepEqual(
      m.metadata!.ownerReferences!.map((o) => o.uid),
      [missed.metadata.uid],
    );
    assert.equal((await readCondition(w, missed, 'CredentialsMirrored'))?.reason, 'Mirrored');
    await eventually(
      'the orphaned mirror to be collected',
      async () => (await w.read(fx.mirrorOf(orphanId, fx.inNamespace(n)))) === undefined,
    );
    const foreignAfter = (await w.read(foreign as V1Secret))!;
    assert.equal(
      foreignAfter.metadata!.resourceVersion,
      foreignBefore.metadata!.resourceVersion,
      'not ours: untouched',
    );
    const resyncLine = ms.log.entries().findLast((e) => e.message === 'resync');
    assert.ok(resyncLine && typeof resyncLine.durationMs === 'number');
  });

  it('never collects a mirror owned by a kind this instance is not configured for', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    const m = await w.create(
      fx.consumer('machine-owner', fx.inNamespace(n), fx.identityRef(id), fx.ofKind(TERRAFORM_MACHINE)),
    );
    await deliver(ms, consumerEvent(m));
    const before = (await w.read(mirror))!;
    const narrow = await mirrorSyncUnderTest(w, {
      env: { CAPTF_CONSUMER_KINDS: consumerKindsSetting(TERRAFORM_CLUSTER) },
    });
    assert.equal((await deliver(narrow, pingEvent())).status, 200);
    // The same Secret, not one recreated since: another file's resync reconciling the
    // TerraformMachine at the same time would recreate a mirror the narrow one deleted.
    assert.equal(
      (await w.read(mirror))?.metadata!.uid,
      before.metadata!.uid,
      'still used by a TerraformMachine the narrow instance does not know',
    );
  });

  it('with K_SINK set, sends one CloudEvent per mirror key to the sink instead of reconciling, signed once a SinkBinding mounted a token', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    await w.create(fx.consumer('sunk-1', fx.inNamespace(n), fx.identityRef(id)));
    await w.create(fx.consumer('sunk-2', fx.inNamespace(n), fx.identityRef(id), fx.ofKind(TERRAFORM_MACHINE)));
    const { url: sinkUrl, received, server: sink } = await startSink();
    w.onCleanup(async () => sink.close());
    const dir = mkdtempSync(join(tmpdir(), 'captf-sink-token-'));
    w.onCleanup(async () => rmSync(dir, { recursive: true, force: true }));
    const tokenFile = join(dir, 'token');
    const fanout = await mirrorSyncUnderTest(w, { env: { K_SINK: sinkUrl, CAPTF_SINK_TOKEN_FILE: tokenFile } });
    const r = await deliver(fanout, pingEvent());
    assert.equal(r.status, 200, r.text);
    // Two consumers, one key: one event for it.
    const ofKey = () => received.filter((x) => (JSON.parse(x.body) as { namespace?: string }).namespace === n);
    const mine = ofKey();
    assert.equal(mine.length, 1);
    const x = mine[0]!;
    // No token mounted (Eventing without sender identity): unsigned.
    assert.equal(x.headers.authorization, undefined);
    // The SinkBinding's token, read at the next resync.
    const token = `sink-token-${sentinel()}`;
    writeFileSync(tokenFile, `${token}\n`);
    assert.equal((await deliver(fanout, pingEvent())).status, 200);
    assert.deepEqual(
      ofKey()
        .slice(1)
        .map((e) => e.headers.authorization),
      [`Bearer ${token}`],
    );
    assertNoSecret(fanout.log.lines.join('\n'), [token], "the fan-out instance's log");
    assert.equal(x.headers['ce-type'], KEY_EVENT_TYPE);
    assert.equal(x.headers['ce-specversion'], '1.0');
    assert.deepEqual(JSON.parse(x.body), { namespace: n, identity: id });
    // Nothing reconciled in-process. (Whether the mirror exists says nothing here: other
    // test files' resyncs reconcile every key of the cluster, this one included.)
    const summary = (r.body as { events: { resync: { changed: number; sent: number } }[] }).events[0]!.resync;
    assert.equal(summary.changed, 0, 'a fan-out instance reconciles nothing itself, whatever the cluster holds');
    assert.ok(summary.sent >= 1);
    assert.deepEqual(
      fanout.log.entries().filter((e) => e.message === 'reconcile'),
      [],
    );
    // The sink's event, delivered back (as the Trigger routes it), reconciles the key.
    const back = await fetch(ms.url, {
      method: 'POST',
      headers: Object.fromEntries(
        Object.entries(x.headers).filter(([k]) => k.startsWith('ce-') || k === 'content-type'),
      ) as Record<string, string>,
      body: x.body,
    });
    assert.equal(back.status, 200, await back.text());
    assert.deepEqual(outcomes(await loggedAnswer(ms.log, back.headers)).sort(), [
      [`${n}/sunk-1`, 'mirrored'],
      [`${n}/sunk-2`, 'mirrored'],
    ]);
    assert.equal((await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!.metadata!.ownerReferences!.length, 2);
  });
});

describe('a resync writes nothing that cannot succeed (SPEC §3, §4)', () => {
  it('a Secret in the way gets no create, and a pass that changes nothing writes nothing there', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    await w.create(fx.sourceSecret(mirrorName(id), fx.inNamespace(n)));
    const c = await w.create(fx.consumer('blocked', fx.inNamespace(n), fx.identityRef(id)));
    assert.equal((await deliver(ms, consumerEvent(c))).status, 200);
    assert.equal((await readCondition(w, c, 'CredentialsMirrored'))?.reason, 'MirrorFailed');
    // Every request that would change something in the namespace, as this instance sends it.
    const writes: string[] = [];
    const proxy = await startFaultProxy((method, url) => {
      if (method !== 'GET' && url.includes(`/namespaces/${n}/`)) writes.push(`${method} ${url.split('?')[0]}`);
      return undefined;
    });
    try {
      const resyncs = await mirrorSyncUnderTest(w, { kubeconfig: proxy.kubeconfigPath });
      for (const _ of [1, 2]) assert.equal((await deliver(resyncs, pingEvent(), { retries: 0 })).status, 200);
      assert.deepEqual(writes, [], 'no create of the mirror, no condition, no Event');
      assert.equal((await readCondition(w, c, 'CredentialsMirrored'))?.reason, 'MirrorFailed');
    } finally {
      proxy.close();
    }
  });

  it('a resync decides new keys a few at a time, and leaves nothing for the next one to write', async () => {
    // Deciding many new keys at once sends all their reads and writes together (the API server
    // answers 429 to some, and their consumers wait for the next resync).
    const namespaces = await Promise.all(Array.from({ length: 20 }, () => w.namespace()));
    const id = await source.newIdentity(fx.allowList(...namespaces));
    // Consumers whose events were lost: only a resync mirrors them.
    await Promise.all(namespaces.map((n) => createConsumers(w, n, id, 'lost', 5, alternatingKinds)));
    const ours = (url: string) => namespaces.find((n) => url.includes(`/namespaces/${n}/`));
    const writes: string[] = [];
    // The namespaces whose key had started (its consumers listed) before the first mirror was created.
    const startedBeforeFirstCreate = new Set<string>();
    let created = false;
    let recording = false;
    const proxy = await startFaultProxy((method, url) => {
      const n = ours(url);
      if (!n) return undefined;
      if (method === 'POST' && url.includes('/secrets')) created = true;
      if (!created && method === 'GET' && url.includes('fieldSelector=')) startedBeforeFirstCreate.add(n);
      if (recording && method !== 'GET') writes.push(`${method} ${url.split('?')[0]}`);
      return undefined;
    });
    try {
      const concurrency = 4;
      const resyncs = await mirrorSyncUnderTest(w, {
        kubeconfig: proxy.kubeconfigPath,
        env: { CAPTF_CONCURRENCY: String(concurrency) },
      });
      assert.equal((await deliver(resyncs, pingEvent(), { retries: 0 })).status, 200);
      assert.ok(
        startedBeforeFirstCreate.size <= concurrency,
        `${startedBeforeFirstCreate.size} keys started before the first create`,
      );
      for (const n of namespaces) {
        const m = await w.read(fx.mirrorOf(id, fx.inNamespace(n)));
        assert.equal(m?.metadata?.ownerReferences?.length, 5, `the mirror in ${n} has every consumer`);
      }
      recording = true;
      assert.equal((await deliver(resyncs, pingEvent(), { retries: 0 })).status, 200);
      assert.deepEqual(writes, [], 'the second resync found everything current');
    } finally {
      proxy.close();
    }
  });

  it('a namespace being deleted gets no create of a mirror, from an event or a resync; the condition says why', async () => {
    const n = await w.namespace();
    // Allowed only once the namespace is Terminating, so no resync (of any file) mirrors it before.
    const id = await source.newIdentity(fx.allowList(w.name('elsewhere')));
    // A finalizer keeps the consumer, and so the namespace, Terminating while the test looks.
    const held = (...mods: fx.Modifier<Consumer>[]) =>
      fx.consumer('held', fx.inNamespace(n), fx.identityRef(id), fx.finalizers('test.captf.io/hold'), ...mods);
    const c = await w.create(held());
    w.onCleanup(async () => void (await w.put(held(fx.finalizers()))));
    await a.core.deleteNamespace({ name: n });
    await eventually(
      'the namespace to be Terminating',
      async () => (await a.core.readNamespace({ name: n })).status?.phase === 'Terminating',
    );
    await w.put(fx.identity(id, source.ref, fx.allowList(n)));
    const creates: string[] = [];
    const proxy = await startFaultProxy((method, url) => {
      if (method === 'POST' && url.includes(`/namespaces/${n}/secrets`)) creates.push(url.split('?')[0]!);
      return undefined;
    });
    try {
      const through = await mirrorSyncUnderTest(w, { kubeconfig: proxy.kubeconfigPath });
      // Another file's resync may have decided the consumer already: then its event is an echo, and the pings decide.
      assert.equal((await deliver(through, consumerEvent(c), { retries: 0 })).status, 200);
      for (const _ of [1, 2]) assert.equal((await deliver(through, pingEvent(), { retries: 0 })).status, 200);
      assert.deepEqual(creates, [], 'no create that the API server would refuse');
      const cond = await readCondition(w, c, 'CredentialsMirrored');
      assert.equal(cond?.reason, 'MirrorFailed');
      assert.match(cond!.message, new RegExp(`namespace ${n} is being deleted \\(NamespaceTerminating\\)`));
      assert.equal(await w.read(fx.mirrorOf(id, fx.inNamespace(n))), undefined);
      const warnings = through.log
        .entries()
        .filter((e) => (e.level === 'warn' || e.level === 'error') && JSON.stringify(e).includes(n));
      assert.deepEqual(warnings, [], 'nothing a person must look at (not even the refused Event)');
    } finally {
      proxy.close();
    }
  });
});

describe('source-Secret fast path (SPEC §8, opt-in)', () => {
  it("a labelled source change fans out to the identity's consumers", async () => {
    const srcNs = await w.namespace();
    const name = w.name('fast');
    const sourceLabel = fx.labels({ 'captf.io/identity-source': 'true' });
    await w.create(fx.sourceSecret(name, fx.inNamespace(srcNs), sourceLabel, fx.data({ k: 'one' })));
    const n = await w.namespace();
    const id = await newIdentity(w, fx.secretRef(srcNs, name), fx.allowList(n));
    const c = await w.create(fx.consumer('fast', fx.inNamespace(n), fx.identityRef(id)));
    const fast = await mirrorSyncUnderTest(w, { env: { CAPTF_SOURCE_SECRET_EVENTS: 'true' } });
    await deliver(fast, consumerEvent(c));
    const updated = await a.core.replaceNamespacedSecret({
      name,
      namespace: srcNs,
      body: fx.sourceSecret(name, fx.inNamespace(srcNs), sourceLabel, fx.data({ k: 'two' })),
    });
    // Resource mode carries the labels; the event itself carries no data we use.
    const r = await deliver(
      fast,
      apiServerEvent(
        { apiVersion: 'v1', kind: 'Secret', metadata: { name, namespace: srcNs, labels: updated.metadata!.labels } },
        'resource',
        'update',
        'secrets',
      ),
    );
    assert.equal(r.status, 200, r.text);
    // This instance reconciled the consumer because of the Secret event (other files'
    // resyncs may reconcile it too, so the mirror's data alone would not prove that).
    assert.deepEqual(outcomes(r.body), [[`${n}/fast`, 'mirrored']]);
    assert.equal((await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!.data!.k, b64('two'));
  });
});

describe('configuration', () => {
  it('refuses bad settings at start with the variable named', async () => {
    for (const [env, error] of [
      [{ CAPTF_CONCURRENCY: '0' }, /CAPTF_CONCURRENCY=0/],
      [{ CAPTF_SOURCE_SECRET_EVENTS: 'yes' }, /CAPTF_SOURCE_SECRET_EVENTS=yes/],
      [{ CAPTF_CONSUMER_KINDS: 'TerraformCluster' }, /CAPTF_CONSUMER_KINDS/],
      [{ K_SINK: 'not a url' }, /Invalid URL/],
      // Discovery at start (the API server's answer, not a guess from the name).
      [
        { CAPTF_CONSUMER_KINDS: 'nothing.captf.test/v1/TerraformNothing' },
        /nothing\.captf\.test\/v1\/TerraformNothing is not served by the API server; install its CRD/,
      ],
      [
        { CAPTF_CONSUMER_KINDS: `${fx.apiVersionOf(TERRAFORM_CLUSTER)}/TerraformNothing` },
        /TerraformNothing is not served by the API server/,
      ],
      [
        { CAPTF_CONSUMER_KINDS: `${fx.apiVersionOf(TERRAFORM_CLUSTER)}/TerraformCluster/clusters` },
        /served as "terraformclusters", not "clusters"; write .*\/TerraformCluster\/terraformclusters/,
      ],
    ] as const)
      await assert.rejects(mirrorSyncUnderTest(w, { env }), error);
  });

  it('takes nothing from a discovery answer it cannot use, and repeats none of its text', async () => {
    const planted = `evil-${'A'.repeat(300)} <planted>`;
    const resources = [
      { kind: TERRAFORM_CLUSTER.kind, name: planted, namespaced: true },
      { kind: TERRAFORM_MACHINE.kind, name: TERRAFORM_MACHINE.plural, namespaced: 'false' },
    ];
    const proxy = await startFaultProxy((method, url) =>
      method === 'GET' && url.split('?')[0] === `/apis/${fx.apiVersionOf(TERRAFORM_CLUSTER)}`
        ? { status: 200, contentType: 'application/json', body: JSON.stringify({ kind: 'APIResourceList', resources }) }
        : undefined,
    );
    try {
      for (const kind of [TERRAFORM_CLUSTER, TERRAFORM_MACHINE]) {
        const env = { CAPTF_CONSUMER_KINDS: consumerKindsSetting(kind) };
        const err = await mirrorSyncUnderTest(w, { env, kubeconfig: proxy.kubeconfigPath }).then(
          () => assert.fail('started on an unusable discovery answer'),
          (e: Error) => e,
        );
        assert.match(err.message, new RegExp(`discovery answer for .*/${kind.kind} is not usable`));
        assert.doesNotMatch(err.message, /planted|AAAA/);
      }
    } finally {
      proxy.close();
    }
  });

  it('an extra consumer kind from configuration is reconciled like the shipped ones', async () => {
    // TerraformMachine only, as if an installation listed a single kind.
    const only = await mirrorSyncUnderTest(w, {
      env: { CAPTF_CONSUMER_KINDS: consumerKindsSetting(TERRAFORM_MACHINE) },
    });
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const m = await w.create(
      fx.consumer('machine', fx.inNamespace(n), fx.identityRef(id), fx.ofKind(TERRAFORM_MACHINE)),
    );
    const c = await w.create(fx.consumer('cluster', fx.inNamespace(n), fx.identityRef(id)));
    assert.equal((await deliver(only, consumerEvent(m))).status, 200);
    assert.equal(
      (await deliver(only, consumerEvent(c), { retries: 0 })).status,
      400,
      'TerraformCluster is not configured here',
    );
    // The TerraformMachine's reference is on the mirror. Other test files' resyncs (all
    // kinds configured) may add the TerraformCluster's meanwhile, so what this instance
    // did not do is read from its own log, not from the mirror's owner list.
    assert.ok(
      (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!.metadata!.ownerReferences!.some(
        (r) => r.kind === 'TerraformMachine' && r.uid === m.metadata.uid,
      ),
    );
    const reconciled = only.log
      .entries()
      .filter((e) => e.message === 'reconcile')
      .map((e) => e.object);
    assert.deepEqual([...new Set(reconciled)], [`${n}/machine`]);
  });
});

describe('the real process (functions/main.ts mirror-sync)', () => {
  it('listens on PORT, logs JSON, and on SIGTERM finishes an in-flight resync before exiting 0', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    await createConsumers(w, n, id, 'p', 15);
    const proc = await spawnFunction('mirror-sync', {
      KUBECONFIG: `${controlPlaneDir()}/admin.kubeconfig`,
      CAPTF_CONCURRENCY: '2',
      LOG_LEVEL: 'debug',
    });
    try {
      assert.equal((await fetch(`http://127.0.0.1:${proc.port}/healthz`)).status, 200);
      const pending = deliver(`http://127.0.0.1:${proc.port}/`, pingEvent(), { retries: 0 });
      await eventually('the resync to be in flight', async () => proc.output().includes('"resync started"'), 30_000);
      proc.child.kill('SIGTERM');
      const r = await pending;
      assert.equal(r.status, 200, r.text);
      const answer = (await loggedAnswer(proc, r.headers)) as { events: { resync?: { consumers: number } }[] };
      const summary = answer.events[0]!.resync!;
      assert.ok(summary.consumers >= 15, 'the answer is the finished resync');
      assert.equal(await proc.exited, 0, proc.output());
      assert.match(proc.output(), /"message":"stopped"/);
      for (const l of proc.output().split('\n').filter(Boolean)) JSON.parse(l);
      // The end state (whichever instance's resync did the work: other files resync too).
      assert.equal((await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!.metadata!.ownerReferences!.length, 15);
    } finally {
      proc.kill();
    }
  });
});
