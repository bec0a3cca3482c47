import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { CloudEvent, HTTP } from 'cloudevents';
import { DEFAULT_CONSUMER_KINDS, TERRAFORM_CLUSTER, TERRAFORM_MACHINE } from '../../functions/lib/api.ts';
import {
  BadEventError,
  classifyEvent,
  MAX_ATTRIBUTES,
  parseCloudEvents,
  readCloudEvents,
} from '../../functions/lib/cloudevents.ts';
import { consumerKindsFromEnv, scopeMismatch } from '../../functions/lib/consumers.ts';
import { apiServerEvent, pingEvent, type EventObject } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';

const kinds = DEFAULT_CONSUMER_KINDS;
const cluster = fx.consumer('c', fx.inNamespace('team'), fx.labels({ a: 'b' }), fx.uid('u-1'));
const { plural } = TERRAFORM_CLUSTER;
const parseBinary = (e: CloudEvent<unknown>) => {
  const m = HTTP.binary(e);
  return parseCloudEvents(m.headers as Record<string, string>, m.body as string);
};

describe('CloudEvents parsing and classification (SPEC §12)', () => {
  it('Resource mode: the object names itself, UID and labels known', () => {
    const [e] = parseBinary(apiServerEvent(cluster, 'resource', 'add', plural));
    assert.deepEqual(classifyEvent(e!, kinds), {
      type: 'object',
      id: e!.id,
      verb: 'add',
      mode: 'resource',
      target: 'consumer',
      ref: { apiVersion: cluster.apiVersion, kind: 'TerraformCluster', name: 'c', namespace: 'team', uid: 'u-1' },
      labels: { a: 'b' },
    });
  });
  it('Reference mode: data is the reference, no UID', () => {
    const [e] = parseBinary(apiServerEvent(cluster, 'ref', 'delete', plural));
    const r = classifyEvent(e!, kinds);
    assert.ok(
      r.type === 'object' &&
        r.mode === 'ref' &&
        r.verb === 'delete' &&
        r.ref.uid === undefined &&
        r.ref.namespace === 'team',
    );
  });
  it('classifies identities, namespaces, Secrets and other kinds', () => {
    const t = (o: EventObject) => {
      const r = classifyEvent(parseBinary(apiServerEvent(o, 'ref', 'update', 'x'))[0]!, kinds);
      return r.type === 'object' ? r.target : 'ping';
    };
    assert.equal(t(fx.identity('i')), 'identity');
    assert.equal(t(fx.namespace('n')), 'namespace');
    assert.equal(t(fx.sourceSecret('s', fx.inNamespace('n'))), 'secret');
    assert.equal(t({ apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'd', namespace: 'n' } }), 'other');
    assert.equal(t(fx.consumer('m', fx.inNamespace('n'), fx.ofKind(TERRAFORM_MACHINE))), 'consumer');
  });
  it('a ping is a ping, in structured mode too', () => {
    const m = HTTP.structured(pingEvent());
    const [e] = parseCloudEvents(m.headers as Record<string, string>, m.body as string);
    assert.equal(classifyEvent(e!, kinds).type, 'ping');
  });
  it('a batch yields each event', () => {
    const body = JSON.stringify([pingEvent().toJSON(), apiServerEvent(cluster, 'ref', 'add', plural).toJSON()]);
    assert.equal(parseCloudEvents({ 'content-type': 'application/cloudevents-batch+json' }, body).length, 2);
  });
  it('rejects what is not a usable CloudEvent, saying why', () => {
    assert.throws(() => parseCloudEvents({ 'content-type': 'application/json' }, '{}'), BadEventError);
    // Which required attribute is missing, in binary and structured mode.
    assert.throws(
      () => parseCloudEvents({ 'ce-id': '1', 'ce-specversion': '1.0', 'ce-source': 's' }, ''),
      /binary-mode event lacks required header\(s\) ce-type$/,
    );
    assert.throws(
      () => parseCloudEvents({ 'ce-type': 't', 'ce-specversion': '1.0', 'ce-source': 's' }, '{}'),
      /binary-mode event lacks required header\(s\) ce-id$/,
    );
    assert.throws(
      () =>
        parseCloudEvents(
          { 'content-type': 'application/cloudevents+json' },
          JSON.stringify({ specversion: '1.0', type: 't' }),
        ),
      /structured-mode event lacks required attribute\(s\) id, source$/,
    );
    // A structured-mode body must be an object: the SDK makes each character of a string, or
    // element of an array, an attribute (a 1 MB string of quotes held 150 MB of heap).
    for (const body of [JSON.stringify('"'.repeat(1000)), JSON.stringify(Array(1000).fill('x')), '7'])
      assert.throws(
        () => parseCloudEvents({ 'content-type': 'application/cloudevents+json; charset=utf-8' }, body),
        /structured-mode event must be a JSON object$/,
      );
    // And carries at most MAX_ATTRIBUTES attributes, in a batch too.
    const many = { specversion: '1.0', type: 't', source: 's', id: '1' } as Record<string, string>;
    for (let i = 0; i <= MAX_ATTRIBUTES; i++) many[`x${i}`] = '';
    assert.throws(
      () => parseCloudEvents({ 'content-type': 'application/cloudevents+json' }, JSON.stringify(many)),
      new RegExp(`has ${MAX_ATTRIBUTES + 5} attributes; at most ${MAX_ATTRIBUTES} are accepted$`),
    );
    assert.match(
      readCloudEvents({ 'content-type': 'application/cloudevents-batch+json' }, JSON.stringify([many])).errors[0]!,
      /^batch\[0\]: invalid CloudEvent: has \d+ attributes/,
    );
    // null and empty count as missing (the SDK would invent an id); media types ignore case.
    assert.throws(
      () =>
        parseCloudEvents(
          { 'content-type': 'Application/CloudEvents+JSON' },
          JSON.stringify({ specversion: '1.0', type: 't', source: 's', id: null }),
        ),
      /lacks required attribute\(s\) id$/,
    );
    const batch = readCloudEvents(
      { 'content-type': 'application/cloudevents-batch+json' },
      JSON.stringify([
        { specversion: '1.0', type: 't', source: 's' },
        { specversion: '1.0', type: 't', source: 's', id: '2' },
      ]),
    );
    assert.equal(batch.events.length, 1);
    assert.match(batch.errors[0]!, /^batch\[0\]: invalid CloudEvent: lacks required attribute\(s\) id$/);
    assert.throws(
      () => parseCloudEvents({ 'ce-id': '1', 'ce-specversion': '0.3', 'ce-source': 's', 'ce-type': 't' }, ''),
      /specversion 0.3 is not supported/,
    );
    const typed = (type: string, data: unknown) =>
      new CloudEvent<unknown>({ id: '1', source: 's', type, datacontenttype: 'application/json', data });
    assert.throws(() => classifyEvent(typed('com.example.x', {}), kinds), /unsupported event type/);
    assert.throws(() => classifyEvent(typed('dev.knative.apiserver.ref.patch', {}), kinds), /unsupported event type/);
    assert.throws(
      () => classifyEvent(typed('dev.knative.apiserver.ref.add', { kind: 'X' }), kinds),
      /must name the object/,
    );
    assert.throws(
      () => classifyEvent(typed('dev.knative.apiserver.ref.add', 'text'), kinds),
      /data is not JSON|must be a JSON object/,
    );
  });
});

describe('consumer kinds from configuration (SPEC §1)', () => {
  it('defaults to the two shipped kinds and parses group/version/Kind[/plural]', () => {
    assert.deepEqual(consumerKindsFromEnv({}), [...DEFAULT_CONSUMER_KINDS]);
    assert.deepEqual(
      consumerKindsFromEnv({
        CAPTF_CONSUMER_KINDS: 'example.io/v1/TerraformBucket, example.io/v2/TerraformQueue/queues',
      }),
      [
        { group: 'example.io', version: 'v1', kind: 'TerraformBucket', plural: 'terraformbuckets' },
        { group: 'example.io', version: 'v2', kind: 'TerraformQueue', plural: 'queues' },
      ],
    );
    assert.throws(
      () => consumerKindsFromEnv({ CAPTF_CONSUMER_KINDS: 'TerraformCluster' }),
      /"TerraformCluster" is not group\/version\/Kind/,
    );
  });
});

describe("a consumer's place against its kind's scope (SPEC §4: a bad event answers 4xx)", () => {
  const global = { group: 'example.io', version: 'v1', kind: 'TerraformGlobal', plural: 'terraformglobals' };
  fx.rows(
    [
      { name: 'a namespaced kind in a namespace', kind: TERRAFORM_CLUSTER, namespace: 'team', want: undefined },
      {
        name: 'a namespaced kind without a namespace',
        kind: TERRAFORM_CLUSTER,
        namespace: undefined,
        want: /TerraformCluster is namespaced, but no namespace/,
      },
      { name: 'a namespaced kind, namespace ""', kind: TERRAFORM_CLUSTER, namespace: '', want: /is namespaced/ },
      {
        name: 'a cluster-scoped kind without a namespace',
        kind: { ...global, namespaced: false },
        namespace: undefined,
        want: undefined,
      },
      {
        name: 'a cluster-scoped kind in a namespace',
        kind: { ...global, namespaced: false },
        namespace: 'team',
        want: /cluster-scoped, but namespace team/,
      },
      // Not discovered (the shipped kinds): namespaced, as their CRDs are.
      { name: 'a kind whose scope was not discovered', kind: global, namespace: undefined, want: /is namespaced/ },
    ],
    ({ kind, namespace, want }) => {
      const got = scopeMismatch(kind, namespace);
      if (want) assert.match(got ?? '', want);
      else assert.equal(got, undefined);
    },
  );
});
