/**
 * Knative Eventing's real broker data plane (scripts/eventing/dataplane.ts: ingress, filter,
 * InMemoryChannel dispatcher, mtping) on the test control plane, with the rendered Broker,
 * Triggers and PingSources and small local HTTP sinks standing in for the functions: routing
 * by the real Triggers, retries on the manifests' schedule and dead letters, shortened ping
 * schedules, and delivery set on a Trigger vs on the Broker.
 *
 * The test's copy of the rendered objects (never the manifests) gets, besides the namespace:
 * - the Broker without its `messaging.knative.dev/async-handler`: upstream's default, serial
 *   channel, which answers the sender only after the fan-out, so what this file measures
 *   (routing, retry gaps, dead letters, the sender held) is over when the POST returns; the
 *   retries and dead letters are the same with the shipped async handler, in the background
 *   (test/integration/start-events.test.ts and retry-after-broker.test.ts run it);
 * - a Broker delivery that differs from every Trigger's (retry 2, exponential PT0.2S, its own
 *   dead-letter sink `captf-broker-dead-letters`), so which delivery applied is visible;
 * - no delivery on Trigger `captf-mirror-sync-key` (so the Broker's applies);
 * - on Trigger `captf-mirror-sync-ref-update` a delivery without a dead-letter sink (retry 1,
 *   exponential PT0.5S): upstream then dead-letters to the Broker's sink;
 * - PingSource schedules every 2 s, patched over the applied objects.
 * Every other Trigger is as rendered (retry 5, exponential PT1S, `captf-dead-letters`).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { KubernetesObject } from '@kubernetes/client-node';
import { CloudEvent } from 'cloudevents';
import { IDENTITY_RESOURCE, TERRAFORM_CLUSTER, TERRAFORM_MACHINE } from '../../functions/lib/api.ts';
import { PING_EVENT_TYPE, KEY_EVENT_TYPE } from '../../functions/lib/cloudevents.ts';
import { render } from '../../scripts/tools/kustomize.ts';
import { ASYNC_HANDLER } from '../../scripts/eventing/controllers.ts';
import type { Delivery, EventingDataPlane } from '../../scripts/eventing/dataplane.ts';
import { eventually } from '../helpers/cluster.ts';
import {
  RENDERED_MANIFESTS,
  apiServerEvent,
  postEvents,
  startBroker,
  startFunctionStandIn,
  startSink,
  type ReceivedEvent,
} from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';

const w = fx.world('eventing-dp');
const a = w.clients;

const SINKS = [
  'captf-mirror-sync',
  'captf-identity-status',
  'captf-dead-letters',
  'captf-broker-dead-letters',
] as const;
type SinkName = (typeof SINKS)[number];
const sinks = {} as Record<SinkName, Awaited<ReturnType<typeof startSink>>>;
let dp: EventingDataPlane;
let namespace: string;

const svc = (name: string) => ({ ref: { apiVersion: 'serving.knative.dev/v1', kind: 'Service', name } });
type Obj = KubernetesObject & { spec: { delivery?: Delivery } };

/** The test's copy of the rendered eventing objects (see the file comment). */
function testObjects(rendered: KubernetesObject[]): KubernetesObject[] {
  const objects = structuredClone(rendered) as Obj[];
  const find = (kind: string, name?: string) =>
    objects.find((o) => o.kind === kind && (name === undefined || o.metadata?.name === name))!;
  delete find('Broker').metadata!.annotations![ASYNC_HANDLER];
  find('Broker').spec.delivery = {
    retry: 2,
    backoffPolicy: 'exponential',
    backoffDelay: 'PT0.2S',
    deadLetterSink: svc('captf-broker-dead-letters'),
  };
  delete find('Trigger', 'captf-mirror-sync-key').spec.delivery;
  find('Trigger', 'captf-mirror-sync-ref-update').spec.delivery = {
    retry: 1,
    backoffPolicy: 'exponential',
    backoffDelay: 'PT0.5S',
  };
  return objects;
}

before(async () => {
  // A dead-letter sink always answers 202.
  for (const name of SINKS) sinks[name] = await (name.includes('dead-letters') ? startSink() : startFunctionStandIn());
  namespace = await w.namespace();
  dp = await startBroker({
    objects: testObjects(await render(RENDERED_MANIFESTS)),
    namespace,
    sinks: Object.fromEntries(SINKS.map((n) => [n, sinks[n].url])),
    schedules: { 'captf-resync': '*/2 * * * * *', 'captf-identity-status': '*/2 * * * * *' },
  });
});

after(async () => {
  await dp?.stop();
  for (const s of Object.values(sinks)) s.server.close();
});

/** Which sinks got the event `id`, and how often. */
function received(id: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const name of SINKS) {
    const n = sinks[name].received.filter((h) => h.id === id).length;
    if (n) out[name] = n;
  }
  return out;
}

const hitsOf = (sink: SinkName, id: string) => sinks[sink].received.filter((h) => h.id === id);

/** The objects the events below are about. */
const cluster = fx.consumer('x', fx.inNamespace('team-a'));
const machine = fx.consumer('x', fx.inNamespace('team-a'), fx.ofKind(TERRAFORM_MACHINE));

/** A CloudEvent with a chosen id (the sinks answer by its prefix). */
function withId(e: CloudEvent<unknown>, id: string): CloudEvent<unknown> {
  return e.cloneWith({ id });
}

function ping(source: string, id: string): CloudEvent<unknown> {
  return new CloudEvent<unknown>({
    specversion: '1.0',
    id,
    type: PING_EVENT_TYPE,
    source: `/apis/v1/namespaces/${namespace}/pingsources/${source}`,
    datacontenttype: 'application/json',
    data: {},
  });
}

/** Seconds between consecutive attempts. */
const gaps = (hits: ReceivedEvent[]) => hits.slice(1).map((h, i) => (h.at - hits[i]!.at) / 1000);

/** Each gap within generous bounds of the expected back-off (timers never fire early; a busy machine is late). */
function assertGaps(actual: number[], expected: number[]): void {
  assert.equal(actual.length, expected.length, `gaps ${actual.join(', ')}`);
  actual.forEach((g, i) => {
    const e = expected[i]!;
    assert.ok(g >= e * 0.8 && g <= e * 1.5 + 1, `gap ${i + 1}: ${g.toFixed(2)} s, expected about ${e} s`);
  });
}

describe("Knative Eventing's broker data plane, on the rendered Broker and Triggers", () => {
  it('writes what the controllers would: Broker, channel subscribers, each Trigger by the upstream rules', async () => {
    const get = (plural: string, name: string, group = 'eventing.knative.dev') =>
      a.custom.getNamespacedCustomObject({ group, version: 'v1', namespace, plural, name }) as Promise<{
        spec: { subscribers?: { subscriberUri: string; delivery?: Delivery }[] };
        status: Record<string, unknown> & { conditions: { type: string; status: string }[] };
      }>;
    const broker = await get('brokers', 'captf');
    assert.ok(broker.status.conditions.some((c) => c.type === 'Ready' && c.status === 'True'));
    assert.equal((broker.status.address as { url: string }).url, dp.brokerUrl);
    assert.equal(broker.status.deadLetterSinkUri, sinks['captf-broker-dead-letters'].url);
    const channel = await get('inmemorychannels', 'captf-kne-trigger', 'messaging.knative.dev');
    assert.equal(channel.spec.subscribers?.length, dp.applied.triggers.length);
    const dls = async (trigger: string) => (await get('triggers', trigger)).status.deadLetterSinkUri;
    assert.equal(await dls('captf-mirror-sync-ref-add'), sinks['captf-dead-letters'].url, 'its own');
    assert.equal(await dls('captf-mirror-sync-key'), sinks['captf-broker-dead-letters'].url, "the Broker's");
    assert.equal(await dls('captf-mirror-sync-ref-update'), sinks['captf-broker-dead-letters'].url, "the Broker's");
    assert.equal(
      (await get('triggers', 'captf-identity-status-refresh')).status.subscriberUri,
      sinks['captf-identity-status'].url,
    );
  });

  it('routes each kind of event to exactly the functions its Triggers name, once', async () => {
    const cases: [CloudEvent<unknown>, SinkName[]][] = [
      [apiServerEvent(cluster, 'ref', 'add', TERRAFORM_CLUSTER.plural), ['captf-mirror-sync']],
      [apiServerEvent(machine, 'ref', 'update', TERRAFORM_MACHINE.plural), ['captf-mirror-sync']],
      [apiServerEvent(fx.namespace('x'), 'ref', 'delete', 'namespaces'), ['captf-mirror-sync']],
      ...(['add', 'update', 'delete'] as const).map((verb): [CloudEvent<unknown>, SinkName[]] => [
        apiServerEvent(fx.identity('x'), 'ref', verb, IDENTITY_RESOURCE.plural),
        ['captf-mirror-sync', 'captf-identity-status'],
      ]),
      [ping('captf-resync', 'x'), ['captf-mirror-sync']],
      [ping('captf-identity-status', 'x'), ['captf-identity-status']],
      [ping('somebody-elses', 'x'), []],
      [new CloudEvent({ id: 'x', type: KEY_EVENT_TYPE, source: 's', data: {} }), ['captf-mirror-sync']],
      // Resource mode is not what the manifests' ApiServerSource sends: no Trigger takes it.
      [apiServerEvent(cluster, 'resource', 'add', TERRAFORM_CLUSTER.plural), []],
    ];
    for (const [i, [event, want]] of cases.entries()) {
      const id = `route-${i}-${event.type}`;
      const res = await postEvents(dp.brokerUrl, withId(event, id));
      assert.equal(res.status, 202, id);
      // The default (synchronous) channel answers the sender after the whole fan-out, so every
      // delivery has happened by now; wait a little anyway before asserting that none is extra.
      await eventually(id, async () => Object.keys(received(id)).length >= want.length, 5000);
      await new Promise((r) => setTimeout(r, 200));
      assert.deepEqual(received(id), Object.fromEntries(want.map((s) => [s, 1])), id);
    }
  });

  it("retries a 5xx on the manifests' schedule (1, 2, 4, 8, 16 s), then dead-letters with Knative's error extensions", async () => {
    const id = 'fail-manifest-schedule';
    const t0 = performance.now();
    const res = await postEvents(
      dp.brokerUrl,
      withId(apiServerEvent(cluster, 'ref', 'add', TERRAFORM_CLUSTER.plural), id),
    );
    const heldFor = (performance.now() - t0) / 1000;
    const attempts = hitsOf('captf-mirror-sync', id);
    assert.equal(attempts.length, 6, 'the first try and 5 retries');
    assertGaps(gaps(attempts), [1, 2, 4, 8, 16]);
    // The sender's POST stays open until the fan-out, retries included, is over.
    assert.ok(heldFor >= 31 * 0.8, `the sender waited ${heldFor.toFixed(1)} s`);
    assert.equal(res.status, 202, 'the sender gets 202 once the dead letter was taken');
    const [dead, ...more] = hitsOf('captf-dead-letters', id);
    assert.ok(dead && more.length === 0, 'one dead letter, at the Trigger’s own sink');
    assert.deepEqual(hitsOf('captf-broker-dead-letters', id), []);
    assert.equal(dead.headers['ce-knativeerrorcode'], '500');
    const trigger = dp.applied.triggers.find((t) => t.metadata!.name === 'captf-mirror-sync-ref-add')!;
    assert.equal(
      dead.headers['ce-knativeerrordest'],
      `http://127.0.0.1:${dp.ports.http.filter}/triggers/${namespace}/captf-mirror-sync-ref-add/${trigger.metadata!.uid}`,
    );
    // Locally the error data is the filter's answer (it names the subscriber), base64-encoded.
    const data = JSON.parse(Buffer.from(String(dead.headers['ce-knativeerrordata']), 'base64').toString()) as {
      errdestination: string;
    };
    assert.equal(data.errdestination, sinks['captf-mirror-sync'].url);
    assert.equal(dead.headers['ce-type'], 'dev.knative.apiserver.ref.add');
  });

  it("a Trigger without delivery gets the Broker's (retry 2, 0.2 s, the Broker's dead-letter sink)", async () => {
    const id = 'fail-broker-delivery';
    await postEvents(dp.brokerUrl, new CloudEvent({ id, type: KEY_EVENT_TYPE, source: 's', data: {} }));
    const attempts = hitsOf('captf-mirror-sync', id);
    assert.equal(attempts.length, 3);
    assertGaps(gaps(attempts), [0.2, 0.4]);
    assert.equal(hitsOf('captf-broker-dead-letters', id).length, 1);
    assert.deepEqual(hitsOf('captf-dead-letters', id), []);
  });

  it("a Trigger's own delivery wins; without a dead-letter sink of its own it dead-letters to the Broker's", async () => {
    const id = 'fail-trigger-delivery';
    const event = apiServerEvent(machine, 'ref', 'update', TERRAFORM_MACHINE.plural);
    await postEvents(dp.brokerUrl, withId(event, id));
    const attempts = hitsOf('captf-mirror-sync', id);
    assert.equal(attempts.length, 2, 'retry: 1 from the Trigger, not 2 from the Broker');
    assertGaps(gaps(attempts), [0.5]);
    assert.equal(hitsOf('captf-broker-dead-letters', id).length, 1);
  });

  it('counts a 200 answer with a body that is not a CloudEvent as a failure (502), like a 5xx', async () => {
    // Upstream behaviour (pkg/broker/filter filter_handler.go writeResponse): a subscriber must
    // answer with no body or with a CloudEvent.
    const id = 'json-answer';
    await postEvents(dp.brokerUrl, new CloudEvent({ id, type: KEY_EVENT_TYPE, source: 's', data: {} }));
    assert.equal(hitsOf('captf-mirror-sync', id).length, 3);
    const [dead] = hitsOf('captf-broker-dead-letters', id);
    assert.equal(dead?.headers['ce-knativeerrorcode'], '502');
  });

  it('delivers both PingSources on their shortened schedules, each to its own function', async () => {
    const pings = (sink: SinkName, source: string) =>
      sinks[sink].received.filter(
        (h) => h.headers['ce-type'] === PING_EVENT_TYPE && String(h.headers['ce-source']).endsWith(`/${source}`),
      );
    await eventually(
      'a resync ping at mirror-sync',
      async () => pings('captf-mirror-sync', 'captf-resync').length >= 2,
      30_000,
    );
    await eventually(
      'a status ping at identity-status',
      async () => pings('captf-identity-status', 'captf-identity-status').length >= 2,
      30_000,
    );
    assert.equal(pings('captf-identity-status', 'captf-resync').length, 0);
    assert.equal(pings('captf-mirror-sync', 'captf-identity-status').length, 0);
    const [first] = pings('captf-mirror-sync', 'captf-resync');
    assert.equal(first!.headers['ce-source'], `/apis/v1/namespaces/${namespace}/pingsources/captf-resync`);
  });

  it('delivers again once a SIGKILLed dispatcher is restarted', async () => {
    await dp.kill('dispatcher');
    const down = await postEvents(
      dp.brokerUrl,
      new CloudEvent({ id: 'while-down', type: KEY_EVENT_TYPE, source: 's' }),
    );
    assert.ok(down.status >= 500, `the ingress answers ${down.status} while the channel is down`);
    await dp.restart('dispatcher');
    const id = 'after-restart';
    assert.equal(
      (await postEvents(dp.brokerUrl, new CloudEvent({ id, type: KEY_EVENT_TYPE, source: 's' }))).status,
      202,
    );
    assert.deepEqual(received(id), { 'captf-mirror-sync': 1 });
  });
});
