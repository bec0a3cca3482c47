/**
 * WorkQueue (SPEC §4 coalescing), with a stand-in worker: requests for a name that is being
 * processed share one follow-up that starts after it ends; the follow-up looks at the consumers
 * they named, or at everything when one asked for it; the first run gets the request's seed, a
 * follow-up none; other names run at once; a failing run rejects its callers and never leaves an
 * unhandled rejection or a stuck name.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { TERRAFORM_CLUSTER } from '../../functions/lib/api.ts';
import type { ConsumerName } from '../../functions/mirror-sync/decide.ts';
import { WorkQueue, type Run } from '../../functions/mirror-sync/queue.ts';
import * as fx from '../helpers/fixtures.ts';

/** A TerraformCluster named `name`, as the queue is told about it. */
const n = (name: string): ConsumerName => ({
  apiVersion: fx.apiVersionOf(TERRAFORM_CLUSTER),
  kind: TERRAFORM_CLUSTER.kind,
  name,
});

/** A worker that waits for `release()`; records each run and answers its start order. */
function gated(fail: (order: number) => boolean = () => false) {
  const runs: Run<string, string>[] = [];
  const gates: (() => void)[] = [];
  const q = new WorkQueue<string, string, number>(async (run) => {
    runs.push(run);
    const mine = runs.length;
    await new Promise<void>((r) => gates.push(r));
    if (fail(mine)) throw new Error(`run ${mine} failed`);
    return mine;
  });
  const release = async () => {
    gates.shift()!();
    await new Promise((r) => setImmediate(r));
  };
  return { q, runs, release };
}

describe('WorkQueue: one queue of names (SPEC §4)', () => {
  it('requests arriving while a name runs share one follow-up that starts after it and looks at what they named', async () => {
    const { q, runs, release } = gated();
    const first = q.add('key/team/aws', 'k', [n('a')], 'seed');
    const b1 = q.add('key/team/aws', 'k', [n('b')], 'ignored');
    const b2 = q.add('key/team/aws', 'k', [n('b')]);
    assert.equal(runs.length, 1, 'nothing starts while the name runs');
    assert.equal(runs[0]!.seed, 'seed', 'the first run has its request’s seed');
    await release();
    assert.equal(await first, 1);
    assert.deepEqual(runs[1]!.scope, [n('b')]);
    assert.equal(runs[1]!.seed, undefined, 'a follow-up reads everything again');
    const c = q.add('key/team/aws', 'k', [n('c')]);
    const d = q.add('key/team/aws', 'k', [n('d')]);
    await release();
    assert.deepEqual([await b1, await b2], [2, 2], 'both answered by the follow-up, not the first run');
    assert.deepEqual(runs[2]!.scope, [n('c'), n('d')]);
    await release();
    await Promise.all([c, d]);
    assert.equal(runs.length, 3);
    assert.equal(q.size, 0, 'an idle name leaves nothing behind');
  });

  it('a request for everything makes the follow-up look at everything', async () => {
    const { q, runs, release } = gated();
    const first = q.add('key/team/aws', 'k', [n('a')]);
    const all = q.add('key/team/aws', 'k', 'all');
    const named = q.add('key/team/aws', 'k', [n('b')]);
    await release();
    await first;
    assert.equal(runs[1]!.scope, 'all');
    await release();
    await Promise.all([all, named]);
  });

  it('different names run at once: keys, passes and the resync alike', async () => {
    const { q, runs, release } = gated();
    const work = [q.add('key/team/aws', 'k'), q.add('identity/aws', 'i'), q.add('resync', 'r')];
    assert.deepEqual(
      runs.map((r) => r.target),
      ['k', 'i', 'r'],
    );
    for (const _ of work) await release();
    await Promise.all(work);
  });

  it('a run that fails rejects its callers only, leaves no unhandled rejection, and the follow-up still runs', async () => {
    const seen: unknown[] = [];
    const onUnhandled = (e: unknown) => seen.push(e);
    process.on('unhandledRejection', onUnhandled);
    try {
      const { q, release } = gated((order) => order === 1);
      const failing = q.add('namespace/team', 'p');
      const next = q.add('namespace/team', 'p');
      await release();
      await assert.rejects(failing, /run 1 failed/);
      await release();
      assert.equal(await next, 2, 'the follow-up ran and answered');
      assert.equal(q.size, 0);
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
    assert.deepEqual(seen.map(String), []);
  });
});
