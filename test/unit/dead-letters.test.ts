/**
 * dead-letters' pure parts (functions/dead-letters/): what a dead letter says in either form
 * Knative sends it, the bounded labels it is counted by, how a delivery is read as letters, and
 * the line `npm start` prints from the function's log line.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { HTTP, CloudEvent } from 'cloudevents';
import {
  codeLabel,
  describeDeadLetter,
  MAX_ERROR_DATA,
  MAX_SHOWN,
  targetOf,
} from '../../functions/dead-letters/describe.ts';
import { MAX_BATCH } from '../../functions/lib/cloudevents.ts';
import { lettersOf } from '../../functions/dead-letters/handler.ts';
import { formatLine, LogPrinter } from '../../scripts/local/print.ts';

const b64 = (s: string) => Buffer.from(s).toString('base64');

describe('describeDeadLetter', () => {
  it("reads the filter's form: the Trigger from its URL, the subscriber and its answer wrapped", () => {
    const d = describeDeadLetter({
      id: 'e-1',
      type: 'dev.knative.apiserver.ref.add',
      kind: 'TerraformCluster',
      namespace: 'team-a',
      name: 'prod',
      knativeerrorcode: '500',
      knativeerrordest: 'http://127.0.0.1:34637/triggers/captf-system/captf-mirror-sync-ref-add/2ad4390b',
      knativeerrordata: b64(
        JSON.stringify({ errdestination: 'http://127.0.0.1:41811/', errresponsebody: b64('{"error":"boom"}') }),
      ),
    });
    assert.deepEqual(d, {
      id: 'e-1',
      type: 'dev.knative.apiserver.ref.add',
      about: 'TerraformCluster team-a/prod',
      trigger: 'captf-mirror-sync-ref-add',
      destination: 'http://127.0.0.1:41811/',
      error: 'boom',
      labels: { target: 'mirror-sync', type: 'dev.knative.apiserver.ref.add', code: '500' },
    });
  });

  it("reads the subscriber's form, keeps only the answer's error field, and labels from bounded sets", () => {
    const d = describeDeadLetter({
      id: 'e-2',
      type: 'dev.knative.sources.ping',
      source: '/apis/v1/namespaces/captf-system/pingsources/captf-identity-status',
      knativeerrorcode: '503',
      knativeerrordest: 'http://captf-identity-status.captf-system.svc.cluster.local',
      knativeerrordata: b64(JSON.stringify({ error: 'API server unavailable', token: 'PLANTED' })),
    });
    assert.equal(d.destination, 'http://captf-identity-status.captf-system.svc.cluster.local');
    assert.equal(d.error, 'API server unavailable');
    assert.deepEqual(d.labels, { target: 'identity-status', type: 'dev.knative.sources.ping', code: '503' });
    assert.doesNotMatch(JSON.stringify(d), /PLANTED/);
    const odd = describeDeadLetter({ type: 'x'.repeat(10_000), knativeerrorcode: '99999', id: 'y'.repeat(10_000) });
    assert.deepEqual(odd.labels, { target: 'other', type: 'other', code: 'none' });
    assert.equal(odd.type.length, MAX_SHOWN);
    assert.equal(odd.id.length, MAX_SHOWN);
    assert.deepEqual(describeDeadLetter({}).labels, { target: 'other', type: 'other', code: 'none' });
  });

  it('keeps the code label to a short list, and control characters out of every field', () => {
    assert.deepEqual(['500', '429', '418', '599', '200', '999', ''].map(codeLabel), [
      '500',
      '429',
      '4xx',
      '5xx',
      '2xx',
      'none',
      'none',
    ]);
    const d = describeDeadLetter({
      type: 't',
      kind: 'Namespace',
      name: 'n\u202e\u001b[31m',
      knativeerrordata: b64(JSON.stringify({ error: 'boom\r\n\u001b[1A\u001b[2Kforged' })),
    });
    assert.equal(d.about, 'Namespace n\ufffd\ufffd[31m');
    assert.equal(d.error, 'boom\ufffd\ufffd\ufffd[1A\ufffd[2Kforged');
  });

  it('does not decode an error payload longer than it would show', () => {
    const long = b64(JSON.stringify({ error: 'e', pad: 'x'.repeat(MAX_ERROR_DATA) }));
    assert.equal(describeDeadLetter({ knativeerrordata: long }).error, undefined);
  });

  it('names the function by its Trigger or its Service host, never by a look-alike', () => {
    assert.equal(targetOf('captf-identity-status-refresh', undefined), 'identity-status');
    assert.equal(targetOf(undefined, 'https://captf-mirror-sync.captf-system.svc.cluster.local/'), 'mirror-sync');
    assert.equal(targetOf(undefined, 'http://evil-captf-mirror-syncer.example/'), 'other');
    assert.equal(targetOf('mirror-sync', 'http://127.0.0.1:4000/'), 'other');
  });
});

describe('lettersOf: a delivery as dead letters', () => {
  const event = new CloudEvent({
    id: 'e-3',
    source: 's',
    type: 'dev.knative.apiserver.ref.update',
    knativeerrorcode: '502',
    data: { kind: 'Namespace', name: 'n' },
  });

  it('reads binary and structured mode alike, extensions included', () => {
    for (const message of [HTTP.binary(event), HTTP.structured(event)]) {
      const [attrs, ...more] = lettersOf(message.headers as Record<string, string>, String(message.body));
      assert.deepEqual(more, []);
      assert.equal(attrs!.id, 'e-3');
      assert.equal(attrs!.knativeerrorcode, '502');
    }
  });

  it('takes a delivery that is no CloudEvent as one letter it cannot read, as the event functions would refuse it', () => {
    assert.deepEqual(lettersOf({ 'content-type': 'text/plain' }, 'hello'), [{}]);
    assert.deepEqual(lettersOf({ 'content-type': 'application/cloudevents+json' }, '{'), [{}]);
    // A JSON string as a structured event: the SDK would make each character an attribute.
    const structured = { 'content-type': 'application/cloudevents+json' };
    assert.deepEqual(lettersOf(structured, JSON.stringify('a'.repeat(100_000))), [{}]);
    const attrs = Object.fromEntries(Array.from({ length: 1000 }, (_, i) => [`x${i}`, 'v']));
    assert.deepEqual(
      lettersOf(structured, JSON.stringify({ ...JSON.parse(String(HTTP.structured(event).body)), ...attrs })),
      [{}],
    );
    const batch = (n: number) =>
      JSON.stringify(
        Array.from({ length: n }, (_, i) => ({ specversion: '1.0', id: `b${i}`, source: 's', type: 't' })),
      );
    const ce = { 'content-type': 'application/cloudevents-batch+json' };
    assert.equal(lettersOf(ce, batch(MAX_BATCH)).length, MAX_BATCH);
    assert.deepEqual(lettersOf(ce, batch(MAX_BATCH + 1)), [{}], 'a batch past the limit is one unreadable letter');
  });
});

describe("npm start's line for a dead letter", () => {
  it('names the event, the object, the Trigger, the function, the code and the error', () => {
    const line = new LogPrinter().line(
      'dead-letters',
      JSON.stringify({
        level: 'warn',
        message: 'dead letter',
        type: 'dev.knative.apiserver.ref.add',
        about: 'TerraformCluster team-a/prod',
        trigger: 'captf-mirror-sync-ref-add',
        destination: 'http://127.0.0.1:41811/',
        error: 'boom',
        for: 'mirror-sync',
        code: '500',
      }),
    )!;
    assert.deepEqual(
      [line.debug, line.component, line.subject],
      [false, 'dead-letters', 'TerraformCluster team-a/prod'],
    );
    assert.equal(
      line.text,
      'warn: dev.knative.apiserver.ref.add given up by Trigger captf-mirror-sync-ref-add to mirror-sync (knativeerrorcode=500): boom',
    );
    const bare = new LogPrinter().line(
      'dead-letters',
      JSON.stringify({ level: 'warn', message: 'dead letter', type: 't', about: 'a', for: 'other', code: 'none' }),
    )!;
    assert.match(formatLine(bare), /given up \(knativeerrorcode=none\)$/);
  });
});
