/**
 * KeyQueue (SPEC §4 coalescing), with a stand-in reconcile: requests for a key that is being
 * reconciled share one follow-up that starts after it ends; the follow-up looks at the one
 * consumer named, or lists the key when several were; other keys run at once; a failing
 * reconcile rejects its callers and never leaves an unhandled rejection or a stuck key.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { TERRAFORM_CLUSTER } from '../../functions/lib/api.ts';
import type { ConsumerName, MirrorKey, Snapshot } from '../../functions/mirror-sync/decide.ts';
import { KeyQueue, PassQueue } from '../../functions/mirror-sync/queue.ts';
import type { KeyResult, ReconcileDeps } from '../../functions/mirror-sync/reconcile.ts';
import * as fx from '../helpers/fixtures.ts';

const key = { namespace: 'team', identity: 'aws' };
/** The queue hands these to its reconcile; the stand-ins below never use them. */
const DEPS = { kc: undefined, kinds: [], logger: undefined } as unknown as ReconcileDeps;
/** A TerraformCluster named `name`, as the queue is told about it. */
const n = (name: string): ConsumerName => ({
  apiVersion: fx.apiVersionOf(TERRAFORM_CLUSTER),
  kind: TERRAFORM_CLUSTER.kind,
  name,
});

/** A reconcile that waits for `release()`; records each call's key, scope and start order. */
function gated() {
  const calls: { key: MirrorKey; scope: Snapshot['scope'] }[] = [];
  const gates: (() => void)[] = [];
  const q = new KeyQueue(DEPS, async (_deps, k, scope) => {
    calls.push({ key: k, scope });
    await new Promise<void>((r) => gates.push(r));
    return {
      key: k,
      mirrorAction: 'unchanged',
      consumers: [],
      retry: false,
      durationMs: calls.length,
      apiCalls: 0,
    } satisfies KeyResult;
  });
  const release = async () => {
    gates.shift()!();
    await new Promise((r) => setImmediate(r));
  };
  return { q, calls, release };
}

describe('KeyQueue (SPEC §4)', () => {
  it('requests arriving while a key runs share one follow-up that starts after it; the follow-up looks at the consumers they named, not the whole key', async () => {
    const { q, calls, release } = gated();
    const first = q.run(key, [n('a')]);
    const b1 = q.run(key, [n('b')]);
    const b2 = q.run(key, [n('b')]);
    assert.equal(calls.length, 1, 'nothing starts while the key runs');
    await release();
    assert.equal((await first).durationMs, 1);
    assert.deepEqual(calls[1]!.scope, [n('b')]);
    const c = q.run(key, [n('c')]);
    const d = q.run(key, [n('d')]);
    await release();
    assert.deepEqual(
      [(await b1).durationMs, (await b2).durationMs],
      [2, 2],
      'both answered by the follow-up, not the first run',
    );
    assert.deepEqual(calls[2]!.scope, [n('c'), n('d')]);
    await release();
    await Promise.all([c, d]);
    assert.equal(calls.length, 3);
    assert.equal(q.size, 0, 'an idle key leaves nothing behind');
  });

  it('a request for the whole key makes the follow-up list it', async () => {
    const { q, calls, release } = gated();
    const first = q.run(key, [n('a')]);
    const all = q.run(key, 'all');
    const named = q.run(key, [n('b')]);
    await release();
    await first;
    assert.equal(calls[1]!.scope, 'all');
    await release();
    await Promise.all([all, named]);
  });

  it('different keys run at once', async () => {
    const { q, calls, release } = gated();
    const a = q.run(key, 'all');
    const b = q.run({ namespace: 'team', identity: 'gcp' }, 'all');
    assert.equal(calls.length, 2);
    await release();
    await release();
    await Promise.all([a, b]);
  });

  it('a reconcile that throws rejects its callers, leaves no unhandled rejection, and the key runs again later', async () => {
    const seen: unknown[] = [];
    const onUnhandled = (e: unknown) => seen.push(e);
    process.on('unhandledRejection', onUnhandled);
    try {
      let fail = true;
      const q = new KeyQueue(DEPS, async (_deps, k) => {
        if (fail) throw new Error('boom');
        return { key: k, mirrorAction: 'unchanged', consumers: [], retry: false, durationMs: 0, apiCalls: 0 };
      });
      await assert.rejects(q.run(key, 'all'), /boom/);
      await new Promise((r) => setTimeout(r, 20));
      fail = false;
      assert.equal((await q.run(key, 'all')).mirrorAction, 'unchanged');
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
    assert.deepEqual(seen.map(String), []);
  });
});

describe('PassQueue (identity and namespace passes)', () => {
  /** A pass that waits for `release()` and answers its start order. */
  function gatedPasses() {
    const q = new PassQueue<number>();
    const gates: (() => void)[] = [];
    let started = 0;
    const pass =
      (fail = false) =>
      async () => {
        const mine = ++started;
        await new Promise<void>((r) => gates.push(r));
        if (fail) throw new Error(`pass ${mine} failed`);
        return mine;
      };
    const release = async () => {
      gates.shift()!();
      await new Promise((r) => setImmediate(r));
    };
    return { q, pass, release, started: () => started };
  }

  it('one pass per name at a time: requests arriving meanwhile share one pass that starts after it', async () => {
    const { q, pass, release, started } = gatedPasses();
    const first = q.run('identity/aws', pass());
    const second = q.run('identity/aws', pass());
    const third = q.run('identity/aws', pass());
    const other = q.run('identity/gcp', pass());
    assert.equal(started(), 2, 'another name runs at once; the same name waits');
    await release();
    assert.equal(await first, 1);
    assert.equal(started(), 3, 'the follow-up starts once the running pass ends');
    await release();
    await release();
    assert.deepEqual([await second, await third, await other], [3, 3, 2]);
    const later = q.run('identity/aws', pass());
    assert.equal(started(), 4, 'an idle name runs at once');
    await release();
    assert.equal(await later, 4);
  });

  it('a failed pass rejects its callers only; the follow-up still runs', async () => {
    const { q, pass, release } = gatedPasses();
    const failing = q.run('namespace/team', pass(true));
    const next = q.run('namespace/team', pass());
    await release();
    await assert.rejects(failing, /pass 1 failed/);
    await release();
    assert.equal(await next, 2);
  });
});
