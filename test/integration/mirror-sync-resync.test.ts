import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { API_VERSION } from '../../functions/lib/api.ts';
import { KEY_EVENT_TYPE } from '../../functions/lib/cloudevents.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { desiredMirror } from '../../functions/lib/mirror.ts';
import { start } from '../../functions/mirror-sync/index.ts';
import { admin, controlPlaneDir, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { spawnFunction } from '../helpers/process.ts';
import { apiServerEvent, pingEvent, startSink } from '../helpers/events.ts';
import { captureLogger } from '../helpers/logs.ts';
import {
  conditionOf,
  consumerEvent,
  createConsumer,
  deleteIdentity,
  deliver,
  getConsumer,
  getMirror,
  putIdentity,
} from '../helpers/mirror-sync.ts';

const a = admin();
const ns = namespaces('msr');
const log = captureLogger('mirror-sync');
let fn: FunctionHandle;
let url: string;
const source = { name: 'creds', namespace: '' };
const b64 = (s: string) => Buffer.from(s).toString('base64');

async function newIdentity(allowed: Parameters<typeof putIdentity>[3], ref = source) {
  const name = `id-${suffix()}`;
  ns.onCleanup(() => deleteIdentity(a, name));
  await putIdentity(a, name, ref, allowed);
  return name;
}

before(async () => {
  source.namespace = await ns.create();
  await a.core.createNamespacedSecret({
    namespace: source.namespace,
    body: { metadata: { name: source.name }, data: { token: b64('t0') } },
  });
  fn = await start({
    port: 0,
    host: '127.0.0.1',
    kubeconfig: a.kc,
    logger: log.logger,
    env: { CAPTF_CONCURRENCY: '16' },
  });
  url = `http://127.0.0.1:${fn.port}/`;
});
after(async () => {
  await fn?.close();
});

describe('concurrency (SPEC §15)', () => {
  it('50 consumers in one namespace, events duplicated and reordered: exactly 50 owner references, no error left', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const consumers = await Promise.all(
      Array.from({ length: 50 }, (_, i) =>
        createConsumer(a, n, `c-${i}`, id, i % 2 ? 'TerraformMachine' : 'TerraformCluster'),
      ),
    );
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
    const answers = await Promise.all(events.map((e) => deliver(url, e, { retries: 10 })));
    assert.deepEqual(
      answers.filter((r) => r.status !== 200).map((r) => r.text),
      [],
    );
    const m = (await getMirror(a, n, id))!;
    const refs = m.metadata!.ownerReferences!;
    assert.equal(refs.length, 50);
    assert.deepEqual(new Set(refs.map((r) => r.uid)), new Set(consumers.map((c) => c.metadata.uid)));
    for (const c of consumers) {
      const obj = await getConsumer(a, n, c.metadata.name!, c.kind);
      assert.equal(conditionOf(obj, 'CredentialsMirrored')?.reason, 'Mirrored', c.metadata.name);
    }
  });

  it('50 consumers deleted at once never delete the mirror while one still uses it', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const consumers = await Promise.all(Array.from({ length: 20 }, (_, i) => createConsumer(a, n, `d-${i}`, id)));
    await Promise.all(consumers.map((c) => deliver(url, consumerEvent(c), { retries: 10 })));
    const survivor = consumers[0]!;
    const doomed = consumers.slice(1);
    await Promise.all(
      doomed.map((c) =>
        a.custom.deleteNamespacedCustomObject({
          group: 'infrastructure.cluster.x-k8s.io',
          version: 'v1beta2',
          plural: 'terraformclusters',
          namespace: n,
          name: c.metadata.name!,
        }),
      ),
    );
    const answers = await Promise.all(
      doomed.map((c) => deliver(url, consumerEvent(c, 'resource', 'delete'), { retries: 10 })),
    );
    assert.deepEqual(
      answers.filter((r) => r.status !== 200).map((r) => r.text),
      [],
    );
    const m = await getMirror(a, n, id);
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
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    // A consumer whose add event was lost: only a resync can mirror for it.
    const missed = await createConsumer(a, n, 'missed', id);
    // An orphan: a mirror of ours left with no user at all (lost delete events). Without
    // owner references Kubernetes' garbage collector never touches it, and no object event
    // maps to its key (no consumer names its identity): only a resync can delete it. Whose
    // resync does (this ping's, or another test file's running at the same time) does not
    // matter: it is the same code; if resyncs stopped collecting orphans it would stay.
    const orphanId = `id-${suffix()}`;
    const orphan = desiredMirror(
      orphanId,
      n,
      { k: b64('v') },
      {
        apiVersion: API_VERSION,
        kind: 'TerraformCluster',
        name: 'long-gone',
        uid: '00000000-0000-0000-0000-000000000001',
      },
    );
    orphan.metadata.ownerReferences = [];
    await a.core.createNamespacedSecret({ namespace: n, body: orphan });
    // A Secret that only looks like a mirror (not ours: no identity annotation) is left alone.
    const foreign = desiredMirror(
      `other-${suffix()}`,
      n,
      {},
      { apiVersion: 'v1', kind: 'ConfigMap', name: 'x', uid: '1' },
    );
    foreign.metadata.annotations = {};
    foreign.metadata.ownerReferences = []; // else Kubernetes' own garbage collector removes it
    foreign.metadata.name = `lookalike-${suffix()}`;
    const foreignBefore = await a.core.createNamespacedSecret({ namespace: n, body: foreign });
    const r = await deliver(url, pingEvent());
    assert.equal(r.status, 200, r.text);
    // The answer carries this resync's summary; its counts cover the whole cluster, where
    // other files work concurrently, so only its presence is checked here.
    const summary = (r.body as { events: { resync?: Record<string, unknown> }[] }).events[0]!.resync;
    assert.equal(typeof summary?.orphanedMirrorsDeleted, 'number', r.text);
    // The ping is answered after the work: this pass listed 'missed' after it was created.
    const m = await getMirror(a, n, id);
    assert.ok(m, 'the missed consumer got its mirror');
    assert.deepEqual(
      m.metadata!.ownerReferences!.map((o) => o.uid),
      [missed.metadata.uid],
    );
    assert.equal(conditionOf(await getConsumer(a, n, 'missed'), 'CredentialsMirrored')?.reason, 'Mirrored');
    await eventually(
      'the orphaned mirror to be collected',
      async () => (await getMirror(a, n, orphanId)) === undefined,
    );
    const foreignAfter = await a.core.readNamespacedSecret({ name: foreign.metadata.name, namespace: n });
    assert.equal(
      foreignAfter.metadata!.resourceVersion,
      foreignBefore.metadata!.resourceVersion,
      'not ours: untouched',
    );
    const resyncLine = log.entries().findLast((e) => e.message === 'resync');
    assert.ok(resyncLine && typeof resyncLine.durationMs === 'number');
  });

  it('never collects a mirror owned by a kind this instance is not configured for', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const m = await createConsumer(a, n, 'machine-owner', id, 'TerraformMachine');
    await deliver(url, consumerEvent(m));
    const before = (await getMirror(a, n, id))!;
    const narrow = await start({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: a.kc,
      logger: captureLogger('mirror-sync').logger,
      env: { CAPTF_CONSUMER_KINDS: 'infrastructure.cluster.x-k8s.io/v1beta2/TerraformCluster' },
    });
    try {
      assert.equal((await deliver(`http://127.0.0.1:${narrow.port}/`, pingEvent())).status, 200);
      // The same Secret, not one recreated since: another file's resync reconciling the
      // TerraformMachine at the same time would recreate a mirror the narrow one deleted.
      assert.equal(
        (await getMirror(a, n, id))?.metadata!.uid,
        before.metadata!.uid,
        'still used by a TerraformMachine the narrow instance does not know',
      );
    } finally {
      await narrow.close();
    }
  });

  it('with K_SINK set, sends one CloudEvent per mirror key to the sink instead of reconciling', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    await createConsumer(a, n, 'sunk-1', id);
    await createConsumer(a, n, 'sunk-2', id, 'TerraformMachine');
    const { url: sinkUrl, received, server: sink } = await startSink();
    const fanoutLog = captureLogger('mirror-sync');
    const fanout = await start({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: a.kc,
      logger: fanoutLog.logger,
      env: { K_SINK: sinkUrl },
    });
    try {
      const r = await deliver(`http://127.0.0.1:${fanout.port}/`, pingEvent());
      assert.equal(r.status, 200, r.text);
      // Two consumers, one key: one event for it.
      const mine = received.filter((x) => (JSON.parse(x.body) as { namespace?: string }).namespace === n);
      assert.equal(mine.length, 1);
      const x = mine[0]!;
      assert.equal(x.headers['ce-type'], KEY_EVENT_TYPE);
      assert.equal(x.headers['ce-specversion'], '1.0');
      assert.deepEqual(JSON.parse(x.body), { namespace: n, identity: id });
      // Nothing reconciled in-process. (Whether the mirror exists says nothing here: other
      // test files' resyncs reconcile every key of the cluster, this one included.)
      const summary = (r.body as { events: { resync: { changed: number; sent: number } }[] }).events[0]!.resync;
      assert.equal(summary.changed, 0, 'a fan-out instance reconciles nothing itself, whatever the cluster holds');
      assert.ok(summary.sent >= 1);
      assert.deepEqual(
        fanoutLog.entries().filter((e) => e.message === 'reconcile'),
        [],
      );
      // The sink's event, delivered back (as the Trigger routes it), reconciles the key.
      const back = await fetch(url, {
        method: 'POST',
        headers: Object.fromEntries(
          Object.entries(x.headers).filter(([k]) => k.startsWith('ce-') || k === 'content-type'),
        ) as Record<string, string>,
        body: x.body,
      });
      const text = await back.text();
      assert.equal(back.status, 200, text);
      const results = (
        JSON.parse(text) as { events: { results?: { object: string; outcome: string }[] }[] }
      ).events.flatMap((e) => e.results ?? []);
      assert.deepEqual(results.map((res) => [res.object, res.outcome]).sort(), [
        [`${n}/sunk-1`, 'mirrored'],
        [`${n}/sunk-2`, 'mirrored'],
      ]);
      assert.equal((await getMirror(a, n, id))!.metadata!.ownerReferences!.length, 2);
    } finally {
      await fanout.close();
      sink.close();
    }
  });
});

describe('source-Secret fast path (SPEC §8, opt-in)', () => {
  it("a labelled source change fans out to the identity's consumers", async () => {
    const srcNs = await ns.create();
    const src = { name: `fast-${suffix()}`, namespace: srcNs };
    const secret = await a.core.createNamespacedSecret({
      namespace: srcNs,
      body: { metadata: { name: src.name, labels: { 'captf.io/identity-source': 'true' } }, data: { k: b64('one') } },
    });
    const n = await ns.create();
    const id = await newIdentity({ list: [n] }, src);
    const c = await createConsumer(a, n, 'fast', id);
    const fast = await start({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: a.kc,
      logger: captureLogger('mirror-sync').logger,
      env: { CAPTF_SOURCE_SECRET_EVENTS: 'true' },
    });
    try {
      const furl = `http://127.0.0.1:${fast.port}/`;
      await deliver(furl, consumerEvent(c));
      secret.data = { k: b64('two') };
      const updated = await a.core.replaceNamespacedSecret({ name: src.name, namespace: srcNs, body: secret });
      // Resource mode carries the labels; the event itself carries no data we use.
      const r = await deliver(
        furl,
        apiServerEvent(
          {
            apiVersion: 'v1',
            kind: 'Secret',
            metadata: { name: src.name, namespace: srcNs, labels: updated.metadata!.labels },
          },
          'resource',
          'update',
          'secrets',
        ),
      );
      assert.equal(r.status, 200, r.text);
      // This instance reconciled the consumer because of the Secret event (other files'
      // resyncs may reconcile it too, so the mirror's data alone would not prove that).
      const results = (r.body as { events: { results?: { object: string; outcome: string }[] }[] }).events.flatMap(
        (e) => e.results ?? [],
      );
      assert.deepEqual(
        results.map((x) => [x.object, x.outcome]),
        [[`${n}/fast`, 'mirrored']],
      );
      assert.equal((await getMirror(a, n, id))!.data!.k, b64('two'));
    } finally {
      await fast.close();
    }
  });
});

describe('configuration', () => {
  it('refuses bad settings at start with the variable named', async () => {
    await assert.rejects(start({ port: 0, kubeconfig: a.kc, env: { CAPTF_CONCURRENCY: '0' } }), /CAPTF_CONCURRENCY=0/);
    await assert.rejects(
      start({ port: 0, kubeconfig: a.kc, env: { CAPTF_SOURCE_SECRET_EVENTS: 'yes' } }),
      /CAPTF_SOURCE_SECRET_EVENTS=yes/,
    );
    await assert.rejects(
      start({ port: 0, kubeconfig: a.kc, env: { CAPTF_CONSUMER_KINDS: 'TerraformCluster' } }),
      /CAPTF_CONSUMER_KINDS/,
    );
    await assert.rejects(start({ port: 0, kubeconfig: a.kc, env: { K_SINK: 'not a url' } }), /Invalid URL/);
  });

  it('an extra consumer kind from configuration is reconciled like the shipped ones', async () => {
    // TerraformMachine only, as if an installation listed a single kind.
    const onlyLog = captureLogger('mirror-sync');
    const only = await start({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: a.kc,
      logger: onlyLog.logger,
      env: { CAPTF_CONSUMER_KINDS: 'infrastructure.cluster.x-k8s.io/v1beta2/TerraformMachine' },
    });
    try {
      const n = await ns.create();
      const id = await newIdentity({ list: [n] });
      const m = await createConsumer(a, n, 'machine', id, 'TerraformMachine');
      const c = await createConsumer(a, n, 'cluster', id, 'TerraformCluster');
      const u = `http://127.0.0.1:${only.port}/`;
      assert.equal((await deliver(u, consumerEvent(m))).status, 200);
      assert.equal(
        (await deliver(u, consumerEvent(c), { retries: 0 })).status,
        400,
        'TerraformCluster is not configured here',
      );
      // The TerraformMachine's reference is on the mirror. Other test files' resyncs (all
      // kinds configured) may add the TerraformCluster's meanwhile, so what this instance
      // did not do is read from its own log, not from the mirror's owner list.
      assert.ok(
        (await getMirror(a, n, id))!.metadata!.ownerReferences!.some(
          (r) => r.kind === 'TerraformMachine' && r.uid === m.metadata.uid,
        ),
      );
      const reconciled = onlyLog
        .entries()
        .filter((e) => e.message === 'reconcile')
        .map((e) => e.object);
      assert.deepEqual([...new Set(reconciled)], [`${n}/machine`]);
    } finally {
      await only.close();
    }
  });
});

describe('the real process (functions/main.ts mirror-sync)', () => {
  it('listens on PORT, logs JSON, and on SIGTERM finishes an in-flight resync before exiting 0', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    await Promise.all(Array.from({ length: 15 }, (_, i) => createConsumer(a, n, `p-${i}`, id)));
    const proc = await spawnFunction('mirror-sync', {
      KUBECONFIG: `${controlPlaneDir()}/admin.kubeconfig`,
      CAPTF_CONCURRENCY: '2',
    });
    try {
      assert.equal((await fetch(`http://127.0.0.1:${proc.port}/healthz`)).status, 200);
      const pending = deliver(`http://127.0.0.1:${proc.port}/`, pingEvent(), { retries: 0 });
      await eventually('the resync to be in flight', async () => proc.output().includes('"resync started"'), 30_000);
      proc.child.kill('SIGTERM');
      const r = await pending;
      assert.equal(r.status, 200, r.text);
      const summary = (r.body as { events: { resync?: { consumers: number } }[] }).events[0]!.resync!;
      assert.ok(summary.consumers >= 15, 'the answer is the finished resync');
      assert.equal(await proc.exited, 0, proc.output());
      assert.match(proc.output(), /"message":"stopped"/);
      for (const l of proc.output().split('\n').filter(Boolean)) JSON.parse(l);
      // The end state (whichever instance's resync did the work: other files resync too).
      assert.equal((await getMirror(a, n, id))!.metadata!.ownerReferences!.length, 15);
    } finally {
      proc.kill();
    }
  });
});
