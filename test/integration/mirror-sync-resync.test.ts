import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { API_VERSION } from '../../functions/lib/api.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { desiredMirror } from '../../functions/lib/mirror.ts';
import { start } from '../../functions/mirror-sync/index.ts';
import { admin, controlPlaneDir, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { spawnFunction } from '../helpers/process.ts';
import { apiServerEvent, pingEvent, startSink } from '../helpers/events.ts';
import { captureLogger } from '../helpers/logs.ts';
import {
  conditionOf, consumerEvent, createConsumer, deleteIdentity, deliver, getConsumer, getMirror, putIdentity,
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
  await a.core.createNamespacedSecret({ namespace: source.namespace, body: { metadata: { name: source.name }, data: { token: b64('t0') } } });
  fn = await start({ port: 0, host: '127.0.0.1', kubeconfig: a.kc, logger: log.logger, env: { CAPTF_CONCURRENCY: '16' } });
  url = `http://127.0.0.1:${fn.port}/`;
});
after(async () => {
  await fn?.close();
});

describe('concurrency (SPEC §15)', () => {
  it('50 consumers in one namespace, events duplicated and reordered: exactly 50 owner references, no error left', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const consumers = await Promise.all(Array.from({ length: 50 }, (_, i) => createConsumer(a, n, `c-${i}`, id, i % 2 ? 'TerraformMachine' : 'TerraformCluster')));
    // Each consumer's add event twice, once per mode, shuffled, sent all at once in
    // separate requests (as a Broker would), with Knative-style retries on 5xx.
    const events = consumers.flatMap((c) => [consumerEvent(c, 'ref', 'add'), consumerEvent(c, 'resource', 'add'), consumerEvent(c, 'ref', 'update')]);
    for (let i = events.length - 1; i > 0; i--) {
      const j = Math.floor(Math.random() * (i + 1));
      [events[i], events[j]] = [events[j]!, events[i]!];
    }
    const answers = await Promise.all(events.map((e) => deliver(url, e, { retries: 10 })));
    assert.deepEqual(answers.filter((r) => r.status !== 200).map((r) => r.text), []);
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
    await Promise.all(doomed.map((c) => a.custom.deleteNamespacedCustomObject({ group: 'infrastructure.cluster.x-k8s.io', version: 'v1beta2', plural: 'terraformclusters', namespace: n, name: c.metadata.name! })));
    const answers = await Promise.all(doomed.map((c) => deliver(url, consumerEvent(c, 'resource', 'delete'), { retries: 10 })));
    assert.deepEqual(answers.filter((r) => r.status !== 200).map((r) => r.text), []);
    const m = await getMirror(a, n, id);
    assert.ok(m, 'the survivor still uses the mirror');
    assert.deepEqual(m.metadata!.ownerReferences!.map((r) => r.uid), [survivor.metadata.uid]);
  });
});

describe('resync on a ping (SPEC §6, §12)', () => {
  it('reconciles every consumer and garbage-collects orphaned mirrors', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    // A consumer whose add event was lost: only the resync can mirror for it.
    await createConsumer(a, n, 'missed', id);
    // An orphan: a mirror of ours left with no user at all (lost delete events). Without
    // owner references Kubernetes' garbage collector never touches it: only the resync can.
    const orphanId = `id-${suffix()}`;
    const orphan = desiredMirror(orphanId, n, { k: b64('v') }, { apiVersion: API_VERSION, kind: 'TerraformCluster', name: 'long-gone', uid: '00000000-0000-0000-0000-000000000001' });
    orphan.metadata.ownerReferences = [];
    await a.core.createNamespacedSecret({ namespace: n, body: orphan });
    // A Secret that only looks like a mirror (not ours: wrong identity annotation) is left alone.
    const foreign = desiredMirror(`other-${suffix()}`, n, {}, { apiVersion: 'v1', kind: 'ConfigMap', name: 'x', uid: '1' });
    foreign.metadata.annotations = {};
    foreign.metadata.ownerReferences = []; // else Kubernetes' own garbage collector removes it
    foreign.metadata.name = `lookalike-${suffix()}`;
    await a.core.createNamespacedSecret({ namespace: n, body: foreign });
    const r = await deliver(url, pingEvent());
    assert.equal(r.status, 200, r.text);
    const summary = (r.body as { events: { resync: { consumers: number; orphanedMirrorsDeleted: number } }[] }).events[0]!.resync;
    assert.ok(summary.consumers >= 1);
    assert.ok(summary.orphanedMirrorsDeleted >= 1);
    assert.ok(await getMirror(a, n, id), 'the missed consumer got its mirror');
    assert.equal(await getMirror(a, n, orphanId), undefined, 'orphan deleted');
    assert.ok(await a.core.readNamespacedSecret({ name: foreign.metadata.name, namespace: n }), 'not ours: untouched');
    const resyncLine = log.entries().find((e) => e.message === 'resync');
    assert.ok(resyncLine && typeof resyncLine.durationMs === 'number');
  });

  it('never collects a mirror owned by a kind this instance is not configured for', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const m = await createConsumer(a, n, 'machine-owner', id, 'TerraformMachine');
    await deliver(url, consumerEvent(m));
    const narrow = await start({ port: 0, host: '127.0.0.1', kubeconfig: a.kc, logger: captureLogger('mirror-sync').logger, env: { CAPTF_CONSUMER_KINDS: 'infrastructure.cluster.x-k8s.io/v1beta2/TerraformCluster' } });
    try {
      assert.equal((await deliver(`http://127.0.0.1:${narrow.port}/`, pingEvent())).status, 200);
      assert.ok(await getMirror(a, n, id), 'still used by a TerraformMachine the narrow instance does not know');
    } finally {
      await narrow.close();
    }
  });

  it('with K_SINK set, sends one CloudEvent per consumer to the sink instead of reconciling', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    await createConsumer(a, n, 'sunk-1', id);
    await createConsumer(a, n, 'sunk-2', id, 'TerraformMachine');
    const { url: sinkUrl, received, server: sink } = await startSink();
    const fanout = await start({ port: 0, host: '127.0.0.1', kubeconfig: a.kc, logger: captureLogger('mirror-sync').logger, env: { K_SINK: sinkUrl } });
    try {
      const r = await deliver(`http://127.0.0.1:${fanout.port}/`, pingEvent());
      assert.equal(r.status, 200, r.text);
      const mine = received.filter((x) => x.headers['ce-namespace'] === n);
      assert.equal(mine.length, 2);
      for (const x of mine) {
        assert.equal(x.headers['ce-type'], 'dev.knative.apiserver.ref.update');
        assert.equal(x.headers['ce-specversion'], '1.0');
        const data = JSON.parse(x.body) as { name: string; namespace: string; apiVersion: string };
        assert.equal(data.namespace, n);
        assert.equal(data.apiVersion, API_VERSION);
      }
      assert.equal(await getMirror(a, n, id), undefined, 'nothing reconciled in-process');
      // The sink's events, delivered back, are ordinary Reference-mode events.
      for (const x of mine) {
        const back = await fetch(url, { method: 'POST', headers: Object.fromEntries(Object.entries(x.headers).filter(([k]) => k.startsWith('ce-') || k === 'content-type')) as Record<string, string>, body: x.body });
        assert.equal(back.status, 200);
      }
      assert.equal((await getMirror(a, n, id))!.metadata!.ownerReferences!.length, 2);
    } finally {
      await fanout.close();
      sink.close();
    }
  });
});

describe('source-Secret fast path (SPEC §8, opt-in)', () => {
  it('a labelled source change fans out to the identity\'s consumers', async () => {
    const srcNs = await ns.create();
    const src = { name: `fast-${suffix()}`, namespace: srcNs };
    const secret = await a.core.createNamespacedSecret({ namespace: srcNs, body: { metadata: { name: src.name, labels: { 'captf.io/identity-source': 'true' } }, data: { k: b64('one') } } });
    const n = await ns.create();
    const id = await newIdentity({ list: [n] }, src);
    const c = await createConsumer(a, n, 'fast', id);
    const fast = await start({ port: 0, host: '127.0.0.1', kubeconfig: a.kc, logger: captureLogger('mirror-sync').logger, env: { CAPTF_SOURCE_SECRET_EVENTS: 'true' } });
    try {
      const furl = `http://127.0.0.1:${fast.port}/`;
      await deliver(furl, consumerEvent(c));
      secret.data = { k: b64('two') };
      const updated = await a.core.replaceNamespacedSecret({ name: src.name, namespace: srcNs, body: secret });
      // Resource mode carries the labels; the event itself carries no data we use.
      const r = await deliver(furl, apiServerEvent({ apiVersion: 'v1', kind: 'Secret', metadata: { name: src.name, namespace: srcNs, labels: updated.metadata!.labels } }, 'resource', 'update', 'secrets'));
      assert.equal(r.status, 200, r.text);
      assert.equal((await getMirror(a, n, id))!.data!.k, b64('two'));
    } finally {
      await fast.close();
    }
  });
});

describe('configuration', () => {
  it('refuses bad settings at start with the variable named', async () => {
    await assert.rejects(start({ port: 0, kubeconfig: a.kc, env: { CAPTF_CONCURRENCY: '0' } }), /CAPTF_CONCURRENCY=0/);
    await assert.rejects(start({ port: 0, kubeconfig: a.kc, env: { CAPTF_SOURCE_SECRET_EVENTS: 'yes' } }), /CAPTF_SOURCE_SECRET_EVENTS=yes/);
    await assert.rejects(start({ port: 0, kubeconfig: a.kc, env: { CAPTF_CONSUMER_KINDS: 'TerraformCluster' } }), /CAPTF_CONSUMER_KINDS/);
    await assert.rejects(start({ port: 0, kubeconfig: a.kc, env: { K_SINK: 'not a url' } }), /Invalid URL/);
  });

  it('an extra consumer kind from configuration is reconciled like the shipped ones', async () => {
    // TerraformMachine only, as if an installation listed a single kind.
    const only = await start({ port: 0, host: '127.0.0.1', kubeconfig: a.kc, logger: captureLogger('mirror-sync').logger, env: { CAPTF_CONSUMER_KINDS: 'infrastructure.cluster.x-k8s.io/v1beta2/TerraformMachine' } });
    try {
      const n = await ns.create();
      const id = await newIdentity({ list: [n] });
      const m = await createConsumer(a, n, 'machine', id, 'TerraformMachine');
      const c = await createConsumer(a, n, 'cluster', id, 'TerraformCluster');
      const u = `http://127.0.0.1:${only.port}/`;
      assert.equal((await deliver(u, consumerEvent(m))).status, 200);
      assert.equal((await deliver(u, consumerEvent(c), { retries: 0 })).status, 400, 'TerraformCluster is not configured here');
      assert.deepEqual((await getMirror(a, n, id))!.metadata!.ownerReferences!.map((r) => r.kind), ['TerraformMachine']);
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
    const proc = await spawnFunction('mirror-sync', { KUBECONFIG: `${controlPlaneDir()}/admin.kubeconfig`, CAPTF_CONCURRENCY: '2' });
    try {
      assert.equal((await fetch(`http://127.0.0.1:${proc.port}/healthz`)).status, 200);
      const pending = deliver(`http://127.0.0.1:${proc.port}/`, pingEvent(), { retries: 0 });
      await eventually('the resync to be in flight', async () => proc.output().includes('"reconcile"'), 30_000);
      proc.child.kill('SIGTERM');
      const r = await pending;
      assert.equal(r.status, 200, r.text);
      assert.equal(await proc.exited, 0, proc.output());
      assert.match(proc.output(), /"message":"stopped"/);
      assert.equal((await getMirror(a, n, id))!.metadata!.ownerReferences!.length, 15, 'the resync ran to the end');
      for (const line of proc.output().split('\n').filter(Boolean)) JSON.parse(line);
    } finally {
      proc.kill();
    }
  });
});
