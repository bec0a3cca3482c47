/**
 * The stand-in for Knative Eventing's controllers (scripts/eventing/controllers.ts): which
 * delivery a Trigger's channel subscriber gets, how dead-letter sinks and destinations
 * resolve, and the fields written for the data plane.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  brokerChannel,
  brokerStatus,
  channelSubscriber,
  pingSourceStatus,
  resolveDestination,
  subscriberDelivery,
  triggerDeadLetterSinkUri,
  triggerServiceAccount,
  triggerStatus,
  type Broker,
  type Delivery,
  type PingSource,
  type RefResolver,
  type Trigger,
} from '../../scripts/eventing/controllers.ts';

const svc = (name: string) => ({ ref: { apiVersion: 'serving.knative.dev/v1', kind: 'Service', name } });
const URLS: Record<string, string> = {
  fn: 'http://127.0.0.1:1001',
  dls: 'http://127.0.0.1:1002',
  bdls: 'http://127.0.0.1:1003',
};
const resolveRef: RefResolver = (ref) => {
  if (ref.kind === 'Broker') return 'http://127.0.0.1:2000/ns/captf';
  const url = URLS[ref.name];
  if (!url) throw new Error(`unknown ${ref.name}`);
  return url;
};
const addresses = {
  ingress: 'http://127.0.0.1:2000',
  filter: 'http://127.0.0.1:3000',
  dispatcher: 'http://127.0.0.1:4000',
};
const now = new Date('2026-01-02T03:04:05.678Z');
/** The filter's URL for Trigger `t` below. */
const FILTER_T = 'http://127.0.0.1:3000/triggers/ns/t/t-uid';

const broker = (delivery?: Delivery, annotations?: Record<string, string>): Broker => ({
  apiVersion: 'eventing.knative.dev/v1',
  kind: 'Broker',
  metadata: { name: 'captf', namespace: 'ns', uid: 'b-uid', generation: 1, ...(annotations ? { annotations } : {}) },
  spec: delivery ? { delivery } : {},
});
const trigger = (delivery?: Delivery): Trigger => ({
  apiVersion: 'eventing.knative.dev/v1',
  kind: 'Trigger',
  metadata: { name: 't', namespace: 'ns', uid: 't-uid', generation: 3 },
  spec: { broker: 'captf', subscriber: svc('fn'), ...(delivery ? { delivery } : {}) },
});
const brokerDelivery: Delivery = {
  retry: 2,
  backoffPolicy: 'linear',
  backoffDelay: 'PT2S',
  deadLetterSink: svc('bdls'),
};

describe('the eventing controllers stand-in', () => {
  it("gives a Trigger without delivery the Broker's, its dead-letter sink the filter's path for the Trigger", () => {
    assert.deepEqual(subscriberDelivery(trigger(), broker(brokerDelivery), { addresses, resolveRef }), {
      deadLetterSink: { uri: `${FILTER_T}/dls` },
      retry: 2,
      backoffPolicy: 'linear',
      backoffDelay: 'PT2S',
    });
    assert.equal(triggerDeadLetterSinkUri(trigger(), broker(brokerDelivery), resolveRef), URLS.bdls);
  });

  it("keeps a Trigger's own delivery whole, and falls back to the Broker's sink only for the sink", () => {
    const own: Delivery = { retry: 5, backoffPolicy: 'exponential', backoffDelay: 'PT1S', timeout: 'PT10S' };
    assert.deepEqual(subscriberDelivery(trigger(own), broker(brokerDelivery), { addresses, resolveRef }), {
      deadLetterSink: { uri: URLS.bdls },
      ...own,
    });
    const withSink = { ...own, deadLetterSink: { ...svc('dls'), audience: 'dls-audience' } };
    assert.equal(
      subscriberDelivery(trigger(withSink), broker(brokerDelivery), { addresses, resolveRef })?.deadLetterSink?.uri,
      `${FILTER_T}/dls`,
      'the filter sends it on, signed as the Trigger',
    );
    assert.equal(triggerDeadLetterSinkUri(trigger(withSink), broker(brokerDelivery), resolveRef), URLS.dls);
    const ts = triggerStatus(trigger(withSink), broker(brokerDelivery), { addresses, resolveRef, now });
    assert.equal(ts.deadLetterSinkUri, URLS.dls);
    assert.equal(ts.deadLetterSinkAudience, 'dls-audience', 'the audience the filter signs the dead letter for');
  });

  it('gives no delivery when neither the Trigger nor the Broker has one', () => {
    assert.equal(subscriberDelivery(trigger(), broker(), { addresses, resolveRef }), undefined);
    assert.equal(triggerDeadLetterSinkUri(trigger(), broker(), resolveRef), undefined);
    assert.equal('delivery' in channelSubscriber(trigger(), broker(), { addresses, resolveRef }), false);
  });

  it('resolves destinations like knative.dev/pkg: a ref, a ref plus a relative URI, an absolute URI', () => {
    assert.equal(resolveDestination(svc('fn'), resolveRef), URLS.fn);
    assert.equal(resolveDestination({ ...svc('fn'), uri: '/x?y=1' }, resolveRef), `${URLS.fn}/x?y=1`);
    assert.equal(resolveDestination({ uri: 'http://example.test:9/p' }, resolveRef), 'http://example.test:9/p');
    assert.throws(
      () => resolveDestination({ ...svc('fn'), uri: 'http://a/b' }, resolveRef),
      /absolute URI is not allowed/,
    );
    assert.throws(() => resolveDestination({ uri: '/relative' }, resolveRef), /not absolute/);
    assert.throws(() => resolveDestination({}, resolveRef), /missing Ref and URI/);
    assert.throws(() => resolveDestination(svc('nope'), resolveRef), /unknown nope/);
  });

  it("builds the Broker's channel: owner, scope and messaging annotations, one subscriber per Trigger of this Broker", () => {
    const b = broker(brokerDelivery, { 'messaging.knative.dev/async-handler': 'true', 'other.io/x': 'y' });
    const other = { ...trigger(), spec: { ...trigger().spec, broker: 'other' } };
    const imc = brokerChannel(b, [trigger(), other], { addresses, resolveRef });
    assert.equal(imc.metadata?.name, 'captf-kne-trigger');
    assert.deepEqual(imc.metadata?.annotations, {
      'eventing.knative.dev/scope': 'cluster',
      'messaging.knative.dev/async-handler': 'true',
    });
    assert.equal(imc.metadata?.ownerReferences?.[0]?.uid, 'b-uid');
    assert.deepEqual(imc.spec.delivery, brokerDelivery);
    assert.deepEqual(imc.spec.subscribers, [
      {
        uid: 't-uid',
        generation: 3,
        subscriberUri: 'http://127.0.0.1:3000/triggers/ns/t/t-uid',
        replyUri: 'http://127.0.0.1:2000/ns/captf',
        delivery: {
          deadLetterSink: { uri: `${FILTER_T}/dls` },
          retry: 2,
          backoffPolicy: 'linear',
          backoffDelay: 'PT2S',
        },
      },
    ]);
  });

  it("gives a Trigger the OIDC identity Eventing gives it, so the filter signs for the subscriber's audience", () => {
    const audience = 'serving.knative.dev/service/ns/fn';
    const t: Trigger = { ...trigger(), spec: { broker: 'captf', subscriber: { ...svc('fn'), audience } } };
    const ts = triggerStatus(t, broker(), { addresses, resolveRef, now });
    assert.equal(ts.subscriberAudience, audience);
    assert.deepEqual(ts.auth, { serviceAccountName: 't-oidc-eventing.knative.dev-trigger' });
    const sa = triggerServiceAccount(t);
    assert.equal(sa.metadata!.name, 't-oidc-eventing.knative.dev-trigger');
    assert.equal(sa.metadata!.namespace, 'ns');
    assert.deepEqual(sa.metadata!.ownerReferences, [
      {
        apiVersion: 'eventing.knative.dev/v1',
        kind: 'Trigger',
        name: 't',
        uid: 't-uid',
        controller: true,
        blockOwnerDeletion: false,
      },
    ]);
    assert.equal(sa.metadata!.labels!['eventing.knative.dev/oidc'], 'enabled');
  });

  it('writes the status fields the ingress, filter, dispatcher and mtping read, Ready and every dependent condition True', () => {
    const ctx = { addresses, resolveRef, now };
    const b = broker(brokerDelivery);
    const imc = brokerChannel(b, [trigger()], { addresses, resolveRef });
    const bs = brokerStatus(b, imc, ctx);
    assert.equal(
      (bs.annotations as Record<string, string>)['knative.dev/channelAddress'],
      'http://127.0.0.1:4000/ns/captf-kne-trigger',
    );
    assert.deepEqual(bs.address, { name: 'http', url: 'http://127.0.0.1:2000/ns/captf' });
    assert.equal(bs.deadLetterSinkUri, URLS.bdls);
    const conditions = bs.conditions as { type: string; status: string; lastTransitionTime: string }[];
    assert.ok(conditions.every((c) => c.status === 'True' && c.lastTransitionTime === '2026-01-02T03:04:05Z'));
    assert.ok(conditions.some((c) => c.type === 'Ready'));
    const ts = triggerStatus(trigger(), b, ctx);
    assert.equal(ts.subscriberUri, URLS.fn);
    assert.equal(ts.observedGeneration, 3);
    assert.equal(ts.subscriberAudience, undefined, 'no audience named, none announced');
    const ping: PingSource = {
      apiVersion: 'sources.knative.dev/v1',
      kind: 'PingSource',
      metadata: { name: 'p', namespace: 'ns', generation: 2 },
      spec: {
        schedule: '* * * * *',
        sink: { ref: { apiVersion: 'eventing.knative.dev/v1', kind: 'Broker', name: 'captf' } },
      },
    };
    const ps = pingSourceStatus(ping, ctx);
    assert.equal(ps.sinkUri, 'http://127.0.0.1:2000/ns/captf');
    assert.deepEqual(ps.ceAttributes, [
      { type: 'dev.knative.sources.ping', source: '/apis/v1/namespaces/ns/pingsources/p' },
    ]);
  });
});
