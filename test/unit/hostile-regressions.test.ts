/**
 * Counterexamples of the hostile-input fuzz (test/integration/hostile-input.test.ts), each an
 * input that overflows the stack (a 500) unless its nesting depth is bounded:
 * - AdmissionReviews nested thousands of levels deep (deep equality of the two specs;
 *   `String()` of a wrong apiVersion): a denial echoing the uid, or a 400 without a uid;
 * - CloudEvents whose attributes (other than `data`) are deeply nested arrays (the message
 *   quoting a wrong specversion): refused as not a usable event (4xx).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { MAX_REVIEW_NESTING, nestsDeeperThan, parseReview } from '../../functions/admission/admission-review.ts';
import { BadEventError, readCloudEvents } from '../../functions/lib/cloudevents.ts';
import { admissionReview, identityRequest } from '../helpers/admission.ts';
import * as fx from '../helpers/fixtures.ts';

const deepObject = (d: number) => '{"a":'.repeat(d) + '1' + '}'.repeat(d);
const deepArray = (d: number) => '['.repeat(d) + ']'.repeat(d);
/** `value` as JSON, each string `"@deep"` in it replaced by `raw` (nesting too deep for `JSON.stringify`). */
const spliced = (value: unknown, raw: string) => JSON.stringify(value).replaceAll('"@deep"', raw);

describe('nestsDeeperThan', () => {
  it('counts objects and arrays, not scalars, and takes any depth without recursion', () => {
    assert.equal(nestsDeeperThan({ a: { b: [1] } }, 3), false);
    assert.equal(nestsDeeperThan({ a: { b: [[]] } }, 3), true);
    assert.equal(nestsDeeperThan('text', 0), false);
    assert.equal(nestsDeeperThan(JSON.parse(deepArray(200_000)), 100), true);
  });
});

describe('parseReview: deep nesting', () => {
  it('an UPDATE with the same 10 000-deep spec in object and oldObject is denied, echoing the uid, without a stack overflow', () => {
    // The fuzz's shrunk counterexample (seed 1472984686, path 168:0:…:1).
    const deep = fx.identity('fz-aaa000', fx.identitySpec('@deep'));
    const request = identityRequest('UPDATE', deep, deep, { name: 'fz-aaa000', userInfo: { username: 'fuzz-user' } });
    const p = parseReview(spliced(admissionReview(request), deepObject(10_000)));
    assert.equal(p.ok, false);
    assert.ok('uid' in p && p.uid === 'u-1');
    assert.match(
      (p as { decision: { message: string } }).decision.message,
      new RegExp(`nests objects and arrays more than ${MAX_REVIEW_NESTING} levels deep`),
    );
  });

  it('a 200 000-deep array as apiVersion gets a 400 naming its type, without a stack overflow in String()', () => {
    // The fuzz's shrunk counterexample (seed -521222806).
    const p = parseReview(spliced({ ...admissionReview({ uid: 'u' }), apiVersion: '@deep' }, deepArray(200_000)));
    assert.equal(p.ok, false);
    assert.ok('httpStatus' in p && p.httpStatus === 400);
    assert.match((p as { error: string }).error, /got \(array\) "AdmissionReview"/);
  });

  it('a real review, as deep as managedFields make it, is not refused', () => {
    const fields = JSON.parse(`{"f:spec":{"f:allowedNamespaces":{"f:selector":{"f:matchExpressions":{}}}}}`);
    const object = { ...fx.identity('x'), metadata: { name: 'x', managedFields: [{ fieldsV1: fields }] } };
    assert.equal(parseReview(JSON.stringify(admissionReview(identityRequest('CREATE', object)))).ok, true);
  });
});

describe('CloudEvents: attributes that are objects or arrays', () => {
  const event = (attr: string, value: string) =>
    `{"specversion":"1.0","id":"1","source":"s","type":"dev.knative.apiserver.ref.add","datacontenttype":"application/json","data":{"apiVersion":"v1","kind":"Namespace","name":"x"},"${attr}":${value}}`;

  it('a 200 000-deep array as specversion, structured mode: refused naming the attribute, without a stack overflow', () => {
    // The fuzz's shrunk counterexample against mirror-sync (soak seed -1529217932).
    assert.throws(
      () =>
        readCloudEvents({ 'content-type': 'application/cloudevents+json' }, event('specversion', deepArray(200_000))),
      (e: unknown) =>
        e instanceof BadEventError &&
        /attribute\(s\) "specversion" that are not strings, numbers or booleans/.test(e.message),
    );
  });

  it('in a batch, the element is refused and the others kept; deep data is still data', () => {
    for (const attr of ['specversion', 'time', 'data_base64', 'kind', 'myext']) {
      const { events, errors } = readCloudEvents(
        { 'content-type': 'application/cloudevents-batch+json' },
        `[${event(attr, deepArray(10_000))},${event('subject', '"ok"')}]`,
      );
      assert.equal(events.length, 1, attr);
      assert.match(errors[0]!, new RegExp(`^batch\\[0\\]: invalid CloudEvent: has attribute\\(s\\) "${attr}"`));
    }
    const deepData = readCloudEvents(
      { 'content-type': 'application/cloudevents+json' },
      `{"specversion":"1.0","id":"1","source":"s","type":"t","data":${deepArray(10_000)}}`,
    );
    assert.equal(deepData.events.length, 1);
  });
});
