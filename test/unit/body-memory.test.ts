/**
 * The bounds on what a request body may cost in heap (functions/lib/body-memory.ts): the JSON
 * container count, strings and escapes included, and the budget of bodies in flight.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { BodyBudget, countJsonContainers } from '../../functions/lib/body-memory.ts';

describe('countJsonContainers', () => {
  it('counts objects and arrays, not brackets inside strings or after escaped quotes', () => {
    assert.equal(countJsonContainers('{}'), 1);
    assert.equal(countJsonContainers('[[],{"a":[1,{}]}]'), 5);
    assert.equal(countJsonContainers('{"a":"[{[{"}'), 1);
    assert.equal(countJsonContainers('{"a":"\\"[{","b":[]}'), 2);
    assert.equal(countJsonContainers('["\\\\",[]]'), 2, 'an escaped backslash ends before the quote');
    assert.equal(countJsonContainers('0'), 0);
    assert.equal(countJsonContainers(''), 0);
  });

  it('stops one past the limit', () => {
    assert.equal(countJsonContainers('[' + '[],'.repeat(1000) + '[]]', 10), 11);
  });

  it('a Kubernetes object with its managedFields stays far below the default limit', () => {
    const managed = { manager: 'kubectl', fieldsV1: { 'f:metadata': { 'f:labels': { '.': {}, 'f:a': {} } } } };
    const obj = {
      metadata: { name: 'x', managedFields: Array(50).fill(managed) },
      spec: { list: Array(5000).fill('ns') },
    };
    assert.ok(countJsonContainers(JSON.stringify(obj)) < 1000);
  });
});

describe('BodyBudget', () => {
  it('reserves what fits, refuses what does not, and always lets one body through', () => {
    const b = new BodyBudget(10);
    assert.equal(b.take(25), true, 'nothing reserved: a body larger than the budget proceeds');
    assert.equal(b.take(1), false);
    b.give(25);
    assert.equal(b.take(6), true);
    assert.equal(b.take(4), true);
    assert.equal(b.take(1), false);
    b.give(6);
    assert.equal(b.take(5), true);
    assert.equal(b.reserved, 9);
  });
});
