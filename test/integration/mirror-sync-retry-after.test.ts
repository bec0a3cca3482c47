/**
 * A throttled API server's wait reaches mirror-sync's sender (SPEC §4: a failure a retry can
 * fix answers 503). mirror-sync runs in this process with admin's credentials through a fault
 * proxy in front of the real API server; the proxy answers a test's mirror reads with 429
 * `TooManyRequests` (or 500) a given number of times and forwards everything else. The 503
 * carries `Retry-After` with the largest wait the work was asked for, in whole seconds and at
 * most 30; a 503 for any other failure carries none. The retry then mirrors.
 */
import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';
import { MAX_RETRY_AFTER_SECONDS } from '../../functions/lib/retry-after.ts';
import { tooManyRequests, type Answer } from '../helpers/fault-proxy.ts';
import * as fx from '../helpers/fixtures.ts';
import { postPrepare, prepareTarget } from '../helpers/prepare.ts';
import {
  consumerEvent,
  keyEvent,
  deliver,
  mirrorRead,
  mirrorSyncBehindProxy,
  operatorSource,
  prepareManager,
  type OperatorSource,
  type PrepareManager,
  type ProxiedMirrorSync,
} from '../helpers/mirror-sync.ts';

const w = fx.world('msra');
let source: OperatorSource;
let ms: ProxiedMirrorSync;
let manager: PrepareManager;

before(async () => {
  source = await operatorSource(w, fx.data({ token: 'throttled' }));
  ms = await mirrorSyncBehindProxy(w);
  manager = await prepareManager(w, ms);
});

/** A consumer of a fresh identity in a fresh namespace. */
async function newConsumer() {
  const n = await w.namespace();
  const id = await source.newIdentity(fx.allowList(n));
  const c = await w.create(fx.consumer('c', fx.inNamespace(n), fx.identityRef(id)));
  return { n, id, c };
}

/** {@link newConsumer}, whose mirror reads get `answer` the first `times` times (one read per reconcile of its key). */
async function consumerWithFaultyReads(answer: Answer, times = 1) {
  const made = await newConsumer();
  ms.fault({ matches: mirrorRead(made.n, made.id), answer, times });
  return made;
}

const serverError: Answer = { status: 500, reason: 'InternalError', message: 'etcd is slow today' };

// The faults sit on the mirror's read: each event below is the key's own (a resync's fan-out),
// which reads the mirror whatever another file's resync decided meanwhile; a consumer's own
// event about a consumer already decided is only an echo and reads no mirror.
describe('a throttled API server: 503 with Retry-After (SPEC §4)', () => {
  it('a 429 with Retry-After: 7 answers 503 with Retry-After: 7; the retry mirrors', async () => {
    const { n, id } = await consumerWithFaultyReads(tooManyRequests('7'));
    const first = await deliver(ms, keyEvent(n, id), { retries: 0 });
    assert.equal(first.status, 503, first.text);
    assert.equal(first.headers.get('retry-after'), '7');
    assert.doesNotMatch(first.text, /please try again later/, "the server's words are not repeated");
    const retry = await deliver(ms, keyEvent(n, id), { retries: 0 });
    assert.equal(retry.status, 200, retry.text);
    assert.equal(retry.headers.get('retry-after'), null);
    assert.ok(await w.read(fx.mirrorOf(id, fx.inNamespace(n))), 'mirrored on the retry');
  });

  it('a 429 with Retry-After on the mirror write: the refused write keeps the wait (6)', async (t) => {
    const { n, c } = await newConsumer();
    const rule = {
      matches: (method: string, url: string) => method === 'POST' && url.startsWith(`/api/v1/namespaces/${n}/secrets`),
      answer: tooManyRequests('6'),
      times: 1,
    };
    ms.fault(rule);
    const r = await deliver(ms, consumerEvent(c), { retries: 0 });
    // Another file's resync (cluster-wide, same control plane) may have mirrored this consumer
    // first; then this instance has nothing to write and answers 200.
    t.diagnostic(rule.times === 0 ? 'the mirror write was throttled' : 'another resync had mirrored it: no write');
    if (rule.times === 0) {
      assert.equal(r.status, 503, r.text);
      assert.equal(r.headers.get('retry-after'), '6');
    } else assert.equal(r.status, 200, r.text);
  });

  it('several throttled keys in one request: the largest wait (3, 9 and an unthrottled key → 9)', async () => {
    const throttled = [
      await consumerWithFaultyReads(tooManyRequests('3')),
      await consumerWithFaultyReads(tooManyRequests('9')),
    ];
    const calm = await newConsumer();
    const events = [...throttled, calm].map(({ n, id }) => keyEvent(n, id));
    const r = await deliver(ms, events, { retries: 0, mode: 'batch' });
    assert.equal(r.status, 503, r.text);
    assert.equal(r.headers.get('retry-after'), '9');
    assert.ok(await w.read(fx.mirrorOf(calm.id, fx.inNamespace(calm.n))), 'the unthrottled key was mirrored');
  });

  it(`a wait longer than ${MAX_RETRY_AFTER_SECONDS} s is capped; an HTTP-date is a wait in whole seconds`, async () => {
    const long = await consumerWithFaultyReads(tooManyRequests('120'));
    const r = await deliver(ms, keyEvent(long.n, long.id), { retries: 0 });
    assert.equal(r.status, 503, r.text);
    assert.equal(r.headers.get('retry-after'), String(MAX_RETRY_AFTER_SECONDS));
    const date = await consumerWithFaultyReads(tooManyRequests(new Date(Date.now() + 20_000).toUTCString()));
    const d = await deliver(ms, keyEvent(date.n, date.id), { retries: 0 });
    assert.equal(d.status, 503, d.text);
    const wait = Number(d.headers.get('retry-after'));
    assert.ok(Number.isInteger(wait) && wait >= 10 && wait <= 20, `Retry-After: ${d.headers.get('retry-after')}`);
  });

  it('a 503 for any other failure carries no Retry-After: a 500, and a 429 without one', async () => {
    for (const answer of [serverError, tooManyRequests()]) {
      const { n, id } = await consumerWithFaultyReads(answer);
      const r = await deliver(ms, keyEvent(n, id), { retries: 0 });
      assert.equal(r.status, 503, r.text);
      assert.equal(r.headers.get('retry-after'), null, `after a ${answer.status}`);
    }
  });

  it("prepare answers a throttled reconcile 503 with the server's wait; once it passes, 200", async () => {
    const { c } = await consumerWithFaultyReads(tooManyRequests('5'));
    const first = await manager.prepare(prepareTarget(c));
    assert.equal(first.status, 503, first.text);
    assert.equal(first.body.reason, 'APIError');
    assert.equal(first.headers.get('retry-after'), '5');
    const again = await manager.prepare(prepareTarget(c));
    assert.equal(again.status, 200, again.text);
    assert.equal(again.headers.get('retry-after'), null);
  });

  it("prepare's caller check throttled (TokenReview): 503 AuthorizationUnavailable with the wait", async () => {
    const { c } = await newConsumer();
    ms.fault({
      matches: (method, url) => method === 'POST' && url.startsWith('/apis/authentication.k8s.io/v1/tokenreviews'),
      answer: tooManyRequests('4'),
      times: 1,
    });
    // A fresh token: a cached TokenReview would not be asked again.
    const r = await postPrepare(ms.url, prepareTarget(c), (await prepareManager(w, ms)).caller);
    assert.equal(r.status, 503, r.text);
    assert.equal(r.body.reason, 'AuthorizationUnavailable');
    assert.equal(r.headers.get('retry-after'), '4');
  });
});
