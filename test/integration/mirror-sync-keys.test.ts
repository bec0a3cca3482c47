/**
 * The mirror is the unit of work (SPEC §4, §12): bursts of events for one mirror coalesce
 * into a few reconciles with a bounded number of mirror writes, on one instance or two;
 * consumers switching identities mid-burst end on the right mirrors; and the resync is made
 * of lists that survive an expired continue token (restart) and never take a partial list
 * for the whole (a live consumer's mirror is never collected). Every test ends with the
 * invariant (test/helpers/invariant.ts) in its namespaces. Mirror writes are counted from
 * the API server's audit log, per user: each mirror-sync here runs as a user of its own.
 */
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { before, describe, it } from 'node:test';
import type { V1Secret } from '@kubernetes/client-node';
import pLimit from 'p-limit';
import { DEFAULT_CONSUMER_KINDS, TERRAFORM_CLUSTER, type Consumer } from '../../functions/lib/api.ts';
import { decide, type ConsumerName, type Snapshot } from '../../functions/mirror-sync/decide.ts';
import { observe } from '../../functions/mirror-sync/observe.ts';
import { act, contextOf } from '../../functions/mirror-sync/act.ts';
import { Conflict } from '../../functions/mirror-sync/errors.ts';
import { reconcileKey } from '../../functions/mirror-sync/reconcile.ts';
import { desiredMirror, mirrorName } from '../../functions/lib/mirror.ts';
import { AuditLog } from '../../scripts/bench/measure.ts';
import { asUser, controlPlaneDir, eventually, suffix } from '../helpers/cluster.ts';
import { apiServerEvent, pingEvent } from '../helpers/events.ts';
import { startFaultProxy } from '../helpers/fault-proxy.ts';
import * as fx from '../helpers/fixtures.ts';
import { invariantViolations, foreignSecrets } from '../helpers/invariant.ts';
import {
  alternatingKinds,
  consumerEvent,
  createConsumers,
  deliver,
  deliverAll,
  keyEvent,
  mirrorSyncUnderTest,
  newIdentity,
  operatorSource,
  readCondition,
  type OperatorSource,
} from '../helpers/mirror-sync.ts';
import { captureLogger, type CapturedLog } from '../helpers/logs.ts';

const w = fx.world('msk');
// "zz" namespaces sort late: their consumers are on the last pages of a cluster-wide list.
const late = fx.world('zzk');
const a = w.clients;
const audit = new AuditLog(join(controlPlaneDir(), 'logs', 'audit.log'));
let source: OperatorSource;

before(async () => {
  source = await operatorSource(w, fx.data({ token: 'keys' }));
});

/**
 * A mirror-sync instance in this process, as a user of its own (in system:masters), or as the
 * user of `kubeconfigPath` (a fault proxy's); returns its URL and username.
 */
async function instance(
  env: Record<string, string> = {},
  kubeconfigPath?: string,
): Promise<{ url: string; user: string; log: CapturedLog }> {
  const user = `mirror-sync-${suffix()}`;
  const kubeconfig = kubeconfigPath ?? (await asUser(user, ['system:masters'])).kubeconfigPath;
  const { url, log } = await mirrorSyncUnderTest(w, { env, kubeconfig });
  return { url, user, log };
}

/** A consumer as an event names it (kind and name, no UID). */
const nameOf = (c: Consumer): ConsumerName => ({ apiVersion: c.apiVersion!, kind: c.kind!, name: c.metadata.name! });

/** How long the garbage collector may take to act on an owner that is gone (ms): generous, the machine is shared. */
const GARBAGE_COLLECTED = 180_000;

/** A logger for the write path called directly (its lines are not what these tests read). */
const quiet = () => captureLogger('mirror-sync').logger;

/** The warnings `log` has of lists restarted after their continue token expired. */
const restarts = (log: CapturedLog) =>
  log.entries().filter((e) => e.level === 'warn' && String(e.message).startsWith('list restarted'));

/** Delivers each consumer's event, `inFlight` at a time, round-robin over `urls`, retrying 5xx like a Trigger. */
const burst = (urls: string[], consumers: Consumer[], inFlight: number) =>
  deliverAll(
    urls,
    consumers.map((c) => consumerEvent(c)),
    inFlight,
  );

/** Asserts that every one of `consumers` says CredentialsMirrored=Mirrored. */
async function allMirrored(consumers: Consumer[]): Promise<void> {
  for (const c of consumers)
    assert.equal((await readCondition(w, c, 'CredentialsMirrored'))?.reason, 'Mirrored', c.metadata.name);
}

describe('a burst of events for one mirror (SPEC §4 coalescing)', () => {
  it('60 consumers, 8 events in flight to one instance: exactly 60 owner references, few mirror writes', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const foreign = await foreignSecrets(a, [n]);
    const consumers = await createConsumers(w, n, id, 'b', 60);
    const { url, user } = await instance();
    const mark = audit.mark();
    await burst([url], consumers, 8);
    const writes = audit.countFor(user, mark);
    assert.equal((await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!.metadata!.ownerReferences!.length, 60);
    await allMirrored(consumers);
    // One reconcile per event would write the mirror 60 times; coalesced, a handful of
    // reconciles each add every consumer that arrived meanwhile.
    assert.ok(writes.mirrorWrites <= 30, `${writes.mirrorWrites} mirror writes for 60 consumers`);
    assert.deepEqual(await invariantViolations(a, [n], foreign), []);
  });

  it('the same burst split over two instances converges to exactly the live consumers', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const consumers = await createConsumers(w, n, id, 't', 40, alternatingKinds);
    const one = await instance();
    const two = await instance();
    await burst([one.url, two.url], consumers, 8);
    const refs = (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!.metadata!.ownerReferences!;
    assert.deepEqual(refs.map((r) => r.uid).sort(), consumers.map((c) => c.metadata.uid).sort());
    assert.deepEqual(await invariantViolations(a, [n]), []);
  });

  it('consumers switching identities during a burst end on the mirror they name', async () => {
    const n = await w.namespace();
    const idA = await source.newIdentity(fx.allowList(n));
    const idB = await source.newIdentity(fx.allowList(n));
    const consumers = await createConsumers(w, n, idA, 's', 20);
    const { url } = await instance();
    const first = burst([url], consumers, 8);
    // Five switch to B while their A events are still being delivered.
    const switched = await Promise.all(
      consumers.slice(0, 5).map((c) => w.put(fx.consumer(c.metadata.name!, fx.inNamespace(n), fx.identityRef(idB)))),
    );
    await first;
    await burst([url], switched, 8);
    assert.deepEqual(
      (await w.read(fx.mirrorOf(idA, fx.inNamespace(n))))!.metadata!.ownerReferences!.map((r) => r.name).sort(),
      consumers
        .slice(5)
        .map((c) => c.metadata.name!)
        .sort(),
    );
    assert.deepEqual(
      (await w.read(fx.mirrorOf(idB, fx.inNamespace(n))))!.metadata!.ownerReferences!.map((r) => r.name).sort(),
      switched.map((c) => c.metadata.name!).sort(),
    );
    assert.deepEqual(await invariantViolations(a, [n]), []);
  });
});

describe('instances writing one mirror at once (SPEC §4: writes that commute are merges)', () => {
  it('four instances adding 60 consumers to one mirror: one reference each, no repeated UID, no conflict on the mirror', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const foreign = await foreignSecrets(a, [n]);
    const [first, ...rest] = await createConsumers(w, n, id, 'f', 61, alternatingKinds);
    const instances = await Promise.all([instance(), instance(), instance(), instance()]);
    // The mirror exists first: the burst is all adds (a create race is decided again, by design).
    await burst([instances[0]!.url], [first!], 1);
    const mark = audit.mark();
    await burst(
      instances.map((i) => i.url),
      rest,
      16,
    );
    const counts = instances.map((i) => audit.countFor(i.user, mark));
    const refs = (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!.metadata!.ownerReferences!;
    assert.deepEqual(refs.map((r) => r.uid).sort(), [first!, ...rest].map((c) => c.metadata.uid).sort());
    assert.equal(new Set(refs.map((r) => r.uid)).size, refs.length, 'no UID twice');
    // Only the mirror's: another file's resync may write these consumers' conditions at the same
    // moment (a status 409 is then settled with one read), and two reconciles that saw the same
    // state record one Event (the second create answers 409 by design).
    assert.deepEqual(
      counts.map((c) => c.conflictsOn.secrets ?? 0),
      [0, 0, 0, 0],
      'no 409 on the mirror',
    );
    await allMirrored([first!, ...rest]);
    assert.deepEqual(await invariantViolations(a, [n], foreign), []);
  });

  it('a removal decided for a mirror that was since deleted and created again changes nothing (its UID guards it)', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const [stays, goes] = await createConsumers(w, n, id, 'g', 2);
    const { url } = await instance();
    await burst([url], [stays!, goes!], 1);
    const before = (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!;
    await w.delete(goes!);
    // The mirror is replaced meanwhile (deleted by hand, made again by the next reconcile of its key).
    await a.core.deleteNamespacedSecret({ name: mirrorName(id), namespace: n });
    assert.equal((await deliver(url, keyEvent(n, id))).status, 200);
    const replaced = (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!;
    assert.notEqual(replaced.metadata!.uid, before.metadata!.uid);
    const ctx = contextOf({ kc: a.kc, kinds: DEFAULT_CONSUMER_KINDS, logger: quiet() });
    // Decided from the old mirror: remove `goes` (looked at by name, gone).
    const plan = decide(
      {
        ...(await observe(ctx.clients, ctx.kinds, { key: { namespace: n, identity: id }, scope: [nameOf(goes!)] })),
        mirror: before as Snapshot['mirror'],
      },
      ctx.kinds,
    );
    assert.equal(plan.mirror.action, 'merge');
    const [acted] = await act(ctx, [plan], { limit: pLimit(1), conditions: 'write' });
    assert.ok(acted && 'conflict' in acted && acted.conflict instanceof Conflict, 'a conflict: decided again');
    const after = (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))!;
    assert.equal(after.metadata!.resourceVersion, replaced.metadata!.resourceVersion, 'the new mirror is untouched');
  });

  it('two removals decided from one read of the mirror: the second conflicts (its resourceVersion), and deciding again deletes the mirror its users left', async () => {
    const deps = { kc: a.kc, kinds: DEFAULT_CONSUMER_KINDS, logger: quiet() };
    const ctx = contextOf(deps);
    const { url } = await instance();
    const one = { limit: pLimit(1), conditions: 'write' } as const;
    // Another file's resync may reconcile this key between the read and the first removal (it
    // sees the switched consumers too): then the first removal conflicts for a reason outside
    // this test, and the scenario runs again on a fresh key, at most three times.
    for (let attempt = 1; ; attempt++) {
      const n = await w.namespace();
      const id = await source.newIdentity(fx.allowList(n));
      const [c1, c2] = await createConsumers(w, n, id, 'r', 2);
      await burst([url], [c1!, c2!], 1);
      const read = (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))! as Snapshot['mirror'];
      // Both switch to another identity (deleted, the garbage collector would edit the mirror first).
      const other = await source.newIdentity(fx.allowList(n));
      for (const c of [c1!, c2!]) await w.put(fx.consumer(c.metadata.name!, fx.inNamespace(n), fx.identityRef(other)));
      const key = { namespace: n, identity: id };
      // Two pods, each with one consumer's event, both decided from the same read of the mirror.
      const planFor = async (c: Consumer) =>
        decide({ ...(await observe(ctx.clients, ctx.kinds, { key, scope: [nameOf(c)] })), mirror: read }, ctx.kinds);
      const [p1, p2] = [await planFor(c1!), await planFor(c2!)];
      assert.deepEqual([p1.mirror.action, p2.mirror.action], ['merge', 'merge'], 'each keeps the other’s reference');
      const [first] = await act(ctx, [p1], one);
      const untouched = (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))?.metadata?.resourceVersion;
      if (!(first && 'outcome' in first) && untouched !== read?.metadata?.resourceVersion && attempt < 3) continue;
      assert.ok(first && 'outcome' in first, 'the first removal lands');
      const [second] = await act(ctx, [p2], one);
      assert.ok(second && 'conflict' in second, 'the second meets the first: decided again, not merged blindly');
      // Deciding again: no owner is left, so the mirror goes (SPEC §6), whoever decides it.
      await reconcileKey(deps, key, [nameOf(c2!)]);
      assert.equal(await w.read(fx.mirrorOf(id, fx.inNamespace(n))), undefined);
      return;
    }
  });

  it('an add for a consumer deleted meanwhile leaves the mirror as SPEC §6 wants (the garbage collector drops the reference, or the mirror when it was the only one)', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const [live, doomed] = await createConsumers(w, n, id, 'd', 2);
    const { url } = await instance();
    await burst([url], [live!], 1);
    const deps = { kc: a.kc, kinds: DEFAULT_CONSUMER_KINDS, logger: quiet() };
    // Its event read it, then it was deleted before the add landed.
    await w.delete(doomed!);
    const shared = await reconcileKey(deps, { namespace: n, identity: id }, [nameOf(doomed!)], {
      consumers: [doomed!],
    });
    // Not asserted: that this call made the add (another file's resync may have made it first).
    assert.equal(shared.retry, false);
    await eventually(
      'the garbage collector drops the reference to the deleted consumer',
      async () => {
        const refs = (await w.read(fx.mirrorOf(id, fx.inNamespace(n))))?.metadata?.ownerReferences ?? [];
        return refs.length === 1 && refs[0]!.uid === live!.metadata.uid;
      },
      GARBAGE_COLLECTED,
    );
    // The only user: the mirror it was added to is collected whole.
    const alone = await w.namespace();
    const id2 = await source.newIdentity(fx.allowList(alone));
    const [only] = await createConsumers(w, alone, id2, 'o', 1);
    await w.delete(only!);
    const created = await reconcileKey(deps, { namespace: alone, identity: id2 }, [nameOf(only!)], {
      consumers: [only!],
    });
    assert.equal(created.retry, false);
    await eventually(
      'the garbage collector deletes the mirror whose only owner is gone',
      async () => (await w.read(fx.mirrorOf(id2, fx.inNamespace(alone)))) === undefined,
      GARBAGE_COLLECTED,
    );
  });
});

/**
 * A proxy that answers 410 Gone — "continue token expired", as the API server does after etcd
 * compaction — to the first `times` cluster-wide TerraformCluster list pages that carry a
 * continue token.
 */
const clusterWideList = `/apis/${TERRAFORM_CLUSTER.group}/${TERRAFORM_CLUSTER.version}/${TERRAFORM_CLUSTER.plural}`;
async function expiringProxy(
  times: number,
): Promise<{ kubeconfigPath: string; expired: () => number; close: () => void }> {
  const proxy = await startFaultProxy((method, url) => {
    if (method !== 'GET' || !url.startsWith(`${clusterWideList}?`) || !/[?&]continue=/.test(url)) return undefined;
    if (proxy && proxy.faults() >= times) return undefined;
    return {
      status: 410,
      reason: 'Expired',
      message:
        'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.',
    };
  });
  return { kubeconfigPath: proxy.kubeconfigPath, expired: proxy.faults, close: proxy.close };
}

describe('the resync is made of lists (SPEC §12)', () => {
  it('an expired continue token restarts the list; a consumer on a later page is mirrored and its mirror kept', async () => {
    const n = await late.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    const kept = await w.create(fx.consumer('kept', fx.inNamespace(n), fx.identityRef(id)));
    const { url } = await instance();
    assert.equal((await deliver(url, consumerEvent(kept))).status, 200);
    const before = (await w.read(mirror))!;
    // No event: only the resync can mirror it.
    const fresh = await w.create(fx.consumer('fresh', fx.inNamespace(n), fx.identityRef(id)));
    const proxy = await expiringProxy(1);
    try {
      const resync = await instance({ CAPTF_PAGE_SIZE: '2' }, proxy.kubeconfigPath);
      const r = await deliver(resync, pingEvent('captf-resync'), { retries: 0 });
      assert.equal(r.status, 200, r.text);
      assert.equal(proxy.expired(), 1, 'the proxy expired one continue token');
      assert.deepEqual(
        restarts(resync.log).map((e) => [e.list, e.attempt, e.attempts]),
        [[`${TERRAFORM_CLUSTER.plural}.${TERRAFORM_CLUSTER.group}`, 2, 3]],
        'one warning naming the list and the attempt',
      );
      const m = (await w.read(mirror))!;
      assert.equal(m.metadata!.uid, before.metadata!.uid, 'the mirror of the live consumer was never collected');
      assert.deepEqual(
        m.metadata!.ownerReferences!.map((o) => o.uid).sort(),
        [kept.metadata.uid, fresh.metadata.uid].sort(),
      );
      assert.deepEqual(await invariantViolations(a, [n]), []);
    } finally {
      proxy.close();
    }
  });

  it("never collects a look-alike: a labelled Secret whose name is not its identity's mirror name", async () => {
    const n = await w.namespace();
    const idA = await source.newIdentity(fx.allowList(n));
    const idB = await source.newIdentity(fx.allowList(n));
    // Labelled and annotated like B's mirror, no owners, but named like A's: not a mirror of B.
    const lookalike = desiredMirror(idB, n, {}, { apiVersion: 'v1', kind: 'ConfigMap', name: 'x', uid: '1' });
    lookalike.metadata.name = mirrorName(idA);
    lookalike.metadata.ownerReferences = [];
    const before = await w.create(lookalike as V1Secret);
    const foreign = await foreignSecrets(a, [n]);
    const { url } = await instance();
    assert.equal((await deliver(url, pingEvent('captf-resync'))).status, 200);
    const after = (await w.read(lookalike as V1Secret))!;
    assert.equal(after.metadata!.resourceVersion, before.metadata!.resourceVersion);
    assert.deepEqual(await invariantViolations(a, [n], foreign), []);
  });

  it('a list that keeps expiring fails the ping with 5xx and deletes nothing', async () => {
    const n = await late.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    const c = await w.create(fx.consumer('only', fx.inNamespace(n), fx.identityRef(id)));
    const { url } = await instance();
    assert.equal((await deliver(url, consumerEvent(c))).status, 200);
    const before = (await w.read(mirror))!;
    const proxy = await expiringProxy(1000);
    try {
      const resync = await instance({ CAPTF_PAGE_SIZE: '2' }, proxy.kubeconfigPath);
      const r = await deliver(resync, pingEvent('captf-resync'), { retries: 0 });
      assert.ok(r.status >= 500, `${r.status} ${r.text}`);
      assert.ok(proxy.expired() >= 3, 'restarted before giving up');
      assert.deepEqual(
        restarts(resync.log).map((e) => e.attempt),
        [2, 3],
      );
      assert.equal((await w.read(mirror))!.metadata!.resourceVersion, before.metadata!.resourceVersion, 'untouched');
    } finally {
      proxy.close();
    }
  });
});

describe("a namespace's pass (SPEC §7)", () => {
  it("a source that cannot be read fails its own key only: another identity's revocation there still happens", async () => {
    const label = { 'captf.io/tenant': w.name('pass') };
    const n = await w.namespace(fx.labels(label));
    const own = fx.sourceSecret(w.name('src'), fx.inNamespace(source.namespace), fx.data({ k: 'v' }));
    await w.create(own);
    const stays = await newIdentity(w, fx.secretRef(source.namespace, own.metadata!.name!), fx.allowList(n));
    const revoked = await source.newIdentity(fx.allowSelector({ matchLabels: label }));
    const cs = await w.create(fx.consumer('stays', fx.inNamespace(n), fx.identityRef(stays)));
    const cr = await w.create(fx.consumer('revoked', fx.inNamespace(n), fx.identityRef(revoked)));
    const plain = await instance();
    assert.equal((await deliver(plain, [consumerEvent(cs), consumerEvent(cr)], { mode: 'batch' })).status, 200);
    assert.ok(await w.read(fx.mirrorOf(revoked, fx.inNamespace(n))));
    const failing = `/api/v1/namespaces/${source.namespace}/secrets/${own.metadata!.name}`;
    const proxy = await startFaultProxy((method, u) =>
      method === 'GET' && u.startsWith(failing) ? { status: 500, reason: 'InternalError', message: 'boom' } : undefined,
    );
    try {
      const { url } = await instance({}, proxy.kubeconfigPath);
      const nsObj = (await w.read(fx.namespace(n)))!;
      nsObj.metadata!.labels = { 'captf.io/tenant': 'someone-else' };
      const updated = await a.core.replaceNamespace({ name: n, body: nsObj });
      const r = await deliver(url, apiServerEvent(updated as never, 'ref', 'update', 'namespaces'), { retries: 0 });
      assert.equal(r.status, 503, `the unreadable source is retried: ${r.text}`);
      assert.ok(proxy.faults() >= 1);
      assert.equal(await w.read(fx.mirrorOf(revoked, fx.inNamespace(n))), undefined, 'revoked all the same');
      assert.equal((await readCondition(w, cr, 'IdentityAllowed'))?.reason, 'NamespaceNotAllowed');
      assert.ok(await w.read(fx.mirrorOf(stays, fx.inNamespace(n))), 'the other key keeps its last good copy');
    } finally {
      proxy.close();
    }
  });
});

describe('a failure a retry can fix changes no condition (SPEC §4, §16)', () => {
  const unavailable = {
    status: 503,
    reason: 'ServiceUnavailable',
    message: 'the server is currently unable to handle the request',
  };

  /** A mirror-sync instance behind a fault proxy, as a user of its own (its requests are told apart in the audit log). */
  async function behindProxy(
    fault: (method: string, url: string) => boolean,
    answer: typeof unavailable = unavailable,
  ) {
    const user = `flaky-${suffix()}`;
    const u = await asUser(user, ['system:masters']);
    const proxy = await startFaultProxy((method, url) => (fault(method, url) ? answer : undefined), {
      kubeconfigPath: u.kubeconfigPath,
    });
    const { url } = await instance({}, proxy.kubeconfigPath);
    return { user, url, proxy };
  }

  for (const answer of [
    unavailable,
    { status: 429, reason: 'TooManyRequests', message: 'too many requests, please try again later' },
  ])
    it(`a ${answer.status} reading the mirror answers 503 and writes no condition and no Event`, async () => {
      const n = await w.namespace();
      const id = await source.newIdentity(fx.allowList(n));
      await w.create(fx.consumer('flaky-read', fx.inNamespace(n), fx.identityRef(id)));
      const { user, url, proxy } = await behindProxy(
        (method, u) => method === 'GET' && u.startsWith(`/api/v1/namespaces/${n}/secrets/${mirrorName(id)}`),
        answer,
      );
      try {
        const mark = audit.mark();
        // The key's reconcile reads the mirror whatever another file's resync decided meanwhile
        // (the consumer's own event would then only be an echo).
        const r = await deliver(url, keyEvent(n, id), { retries: 0 });
        assert.equal(r.status, 503, r.text);
        assert.ok(proxy.faults() >= 1);
        const mine = audit.countFor(user, mark);
        assert.equal(mine.verbs.patch ?? 0, 0, 'no status write');
        assert.equal(mine.verbs.create ?? 0, 0, 'no mirror, no Event');
      } finally {
        proxy.close();
      }
    });

  it('a 503 writing the mirror answers 503 and writes no condition and no Event; the retry mirrors', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const c = await w.create(fx.consumer('flaky-write', fx.inNamespace(n), fx.identityRef(id)));
    const { user, url, proxy } = await behindProxy(
      (method, u) => (method === 'POST' || method === 'PUT') && u.startsWith(`/api/v1/namespaces/${n}/secrets`),
    );
    try {
      const mark = audit.mark();
      const r = await deliver(url, consumerEvent(c), { retries: 0 });
      // Another file's resync (cluster-wide, same control plane) may have mirrored this
      // consumer first; then this instance has nothing to write and answers 200.
      if (proxy.faults() > 0) {
        assert.equal(r.status, 503, r.text);
        const mine = audit.countFor(user, mark);
        assert.equal(mine.verbs.patch ?? 0, 0, 'no status write');
        assert.equal(mine.verbs.create ?? 0, 0, 'no Event');
      } else {
        assert.equal(r.status, 200, r.text);
      }
    } finally {
      proxy.close();
    }
    const { url: healthy } = await instance();
    assert.equal((await deliver(healthy, consumerEvent(c))).status, 200);
    assert.equal((await readCondition(w, c, 'CredentialsMirrored'))?.reason, 'Mirrored');
    assert.deepEqual(await invariantViolations(a, [n]), []);
  });
});
