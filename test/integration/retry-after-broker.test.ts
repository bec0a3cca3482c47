/**
 * Knative honours mirror-sync's `Retry-After`, through Knative's real Broker data plane
 * (scripts/eventing/dataplane.ts) running what the local mode runs: the rendered
 * `MANIFESTS` of scripts/system/system.ts (mirror-sync's Triggers with `retryAfterMax: PT30S`,
 * components/retry-after) moved into this file's namespace, and the system namespace's
 * `config-features` with `delivery-retryafter: enabled`. mirror-sync runs in this process
 * behind a fault proxy in front of the real API server, with a recording pass-through in front
 * of it (what the Broker delivered, what mirror-sync answered, when). Events are posted to the
 * Broker's ingress, which (the manifests' async handler) answers at once; the test waits for
 * the delivery and its retry.
 *
 * A mirror read throttled once with `Retry-After: 3`: mirror-sync answers 503 with
 * `Retry-After: 3`, and the dispatcher's retry comes no sooner than that (it waits the larger
 * of the header, capped at `retryAfterMax`, and the Trigger's backoff of 1 s). For contrast
 * (measured and printed, not bounded): throttled without the header, and on a Trigger without
 * `retryAfterMax` — the test's copy drops it from `captf-mirror-sync-ref-add`, never the
 * manifests — the retry follows the backoff alone.
 */
import assert from 'node:assert/strict';
import type { KubernetesObject } from '@kubernetes/client-node';
import { before, describe, it, type TestContext } from 'node:test';
import type { Trigger } from '../../scripts/eventing/controllers.ts';
import type { EventingDataPlane } from '../../scripts/eventing/dataplane.ts';
import { LOCAL_FEATURES, SYSTEM_NAMESPACE } from '../../scripts/eventing/dataplane.ts';
import { MANIFESTS } from '../../scripts/system/system.ts';
import { render } from '../../scripts/tools/kustomize.ts';
import { postEvents, startBroker, startRecordingProxy, startSink, type Relayed } from '../helpers/events.ts';
import { eventually } from '../helpers/cluster.ts';
import { tooManyRequests } from '../helpers/fault-proxy.ts';
import * as fx from '../helpers/fixtures.ts';
import {
  consumerEvent,
  mirrorRead,
  mirrorSyncBehindProxy,
  operatorSource,
  type OperatorSource,
  type ProxiedMirrorSync,
} from '../helpers/mirror-sync.ts';

const w = fx.world('ra-broker');
/** A schedule that does not fire while the file runs: no ping reaches the functions. */
const NEVER = '0 0 1 1 *';
let source: OperatorSource;
let ms: ProxiedMirrorSync;
let relayed: Relayed[];
let dp: EventingDataPlane;
let rendered: KubernetesObject[];
/** The Trigger whose `retryAfterMax` the test's copy drops. */
const WITHOUT_MAX = 'captf-mirror-sync-ref-add';

/** The test's copy of the rendered objects (see the file comment). */
function testObjects(objects: KubernetesObject[]): KubernetesObject[] {
  const copy = structuredClone(objects);
  const t = copy.find((o) => o.kind === 'Trigger' && o.metadata?.name === WITHOUT_MAX) as Trigger;
  delete t.spec.delivery!.retryAfterMax;
  return copy;
}

before(async () => {
  source = await operatorSource(w);
  ms = await mirrorSyncBehindProxy(w);
  const recording = await startRecordingProxy(ms.handle.port);
  relayed = recording.relayed;
  const [deadLetters, identityStatus] = [await startSink(), await startSink()];
  for (const { server } of [recording, deadLetters, identityStatus]) w.onCleanup(async () => server.close());
  rendered = await render(MANIFESTS);
  dp = await startBroker({
    objects: testObjects(rendered),
    namespace: await w.namespace(),
    sinks: {
      'captf-mirror-sync': recording.url,
      'captf-identity-status': identityStatus.url,
      'captf-dead-letters': deadLetters.url,
    },
    schedules: { 'captf-resync': NEVER, 'captf-identity-status': NEVER },
  });
  w.onCleanup(() => dp.stop());
});

/**
 * Posts an event about a new consumer, whose first mirror read is throttled with `retryAfter`
 * (none: no header), to the Broker; returns what mirror-sync was delivered for it, once its
 * mirror exists. Another test file's resync (cluster-wide, same control plane) may decide the
 * consumer between its create and the event; the event is then only an echo, answered 200
 * without reading the mirror, and the scenario starts over with a fresh consumer.
 */
async function throttledOnce(retryAfter: string | undefined, verb: 'add' | 'update' = 'update'): Promise<Relayed[]> {
  for (let attempt = 1; ; attempt++) {
    const deliveries = await throttledAttempt(retryAfter, verb);
    if (deliveries || attempt === 3) return deliveries ?? [];
  }
}

/** One try of {@link throttledOnce}: undefined when the event was answered 200 at once (an echo). */
async function throttledAttempt(
  retryAfter: string | undefined,
  verb: 'add' | 'update',
): Promise<Relayed[] | undefined> {
  const n = await w.namespace();
  const id = await source.newIdentity(fx.allowList(n));
  const c = await w.create(fx.consumer('c', fx.inNamespace(n), fx.identityRef(id)));
  ms.fault({ matches: mirrorRead(n, id), answer: tooManyRequests(retryAfter), times: 1 });
  const event = consumerEvent(c, 'ref', verb);
  const sent = await postEvents(dp.brokerUrl, event);
  assert.equal(sent.status, 202, sent.text);
  // The manifests' Broker answers at once and delivers (and retries) in the background.
  await eventually('mirrored by the retry', async () => w.read(fx.mirrorOf(id, fx.inNamespace(n))), 60_000);
  const first = await eventually('the first answer', async () => relayed.find((r) => r.id === event.id && r.answer));
  if (first.answer!.status === 200) return undefined;
  return eventually('the retry recorded with its answer', async () => {
    const mine = relayed.filter((r) => r.id === event.id);
    return mine.length >= 2 && mine[1]!.answer && mine;
  });
}

/** The seconds between the first answer (the 503) and the retry's arrival. */
function retryGap(t: TestContext, deliveries: Relayed[]): number {
  assert.ok(deliveries.length >= 2, `delivered ${deliveries.length} time(s)`);
  const [first, retry] = deliveries as [Relayed, Relayed];
  assert.equal(first.answer?.status, 503);
  assert.equal(retry.answer?.status, 200);
  const gap = (retry.at - first.answer!.at) / 1000;
  t.diagnostic(`503 (Retry-After: ${first.answer!.retryAfter ?? 'none'}) → retry after ${gap.toFixed(2)} s`);
  return gap;
}

describe("Knative's Broker honours mirror-sync's Retry-After (the local mode's manifests)", () => {
  it('runs with delivery-retryafter enabled and retryAfterMax PT30S on every mirror-sync Trigger', async () => {
    const features = await w.clients.core.readNamespacedConfigMap({
      namespace: SYSTEM_NAMESPACE,
      name: 'config-features',
    });
    assert.equal(LOCAL_FEATURES['delivery-retryafter'], 'enabled');
    assert.equal(features.data?.['delivery-retryafter'], 'enabled');
    const triggers = rendered.filter((o) => o.kind === 'Trigger') as Trigger[];
    const mine = triggers.filter((t) => t.spec.subscriber.ref?.name === 'captf-mirror-sync');
    assert.equal(mine.length, 5);
    for (const t of mine) assert.equal(t.spec.delivery?.retryAfterMax, 'PT30S', t.metadata?.name);
  });

  it('throttled with Retry-After: 3, the retry comes at least 2.5 s after the 503 (the backoff alone: 1 s)', async (t) => {
    const deliveries = await throttledOnce('3');
    assert.equal(deliveries[0]!.answer?.retryAfter, '3', 'the 503 carried the wait');
    assert.ok(retryGap(t, deliveries) >= 2.5, 'the dispatcher waited as asked');
  });

  it('throttled without Retry-After: 503 without one, and the retry follows the Trigger backoff', async (t) => {
    const deliveries = await throttledOnce(undefined);
    assert.equal(deliveries[0]!.answer?.retryAfter, undefined);
    assert.ok(retryGap(t, deliveries) >= 0.8, 'the backoff of 1 s');
  });

  it(`on a Trigger without retryAfterMax (${WITHOUT_MAX} in the test's copy): retried after the backoff, gap printed`, async (t) => {
    const deliveries = await throttledOnce('3', 'add');
    assert.equal(deliveries[0]!.answer?.retryAfter, '3', 'the 503 carried the wait');
    assert.ok(retryGap(t, deliveries) >= 0.8, 'the backoff of 1 s');
  });
});
