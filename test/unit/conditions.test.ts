import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Condition } from '../../functions/lib/api.ts';
import { slimConsumer } from '../../functions/lib/consumers.ts';
import * as fx from '../helpers/fixtures.ts';
import {
  conditionChanged,
  getCondition,
  removeCondition,
  rfc3339,
  setCondition,
  planConditions,
  strayConditions,
  typesClaimedByOthers,
} from '../../functions/lib/conditions.ts';

const t1 = new Date('2026-01-01T00:00:00.123Z');
const t2 = new Date('2026-01-02T00:00:00Z');
/** A condition of `type` as stored. */
const c = (type: string): Condition => ({ type, status: 'True', reason: 'R', message: 'm', lastTransitionTime: 'x' });

describe('conditions (SPEC §16, Cluster API util/conditions)', () => {
  it('adds a new condition with lastTransitionTime = now (RFC 3339, seconds)', () => {
    const out = setCondition(
      undefined,
      { type: 'Ready', status: 'True', reason: 'SecretFound', message: 'm', observedGeneration: 2 },
      t1,
    );
    assert.deepEqual(out, [
      {
        type: 'Ready',
        status: 'True',
        reason: 'SecretFound',
        message: 'm',
        observedGeneration: 2,
        lastTransitionTime: '2026-01-01T00:00:00Z',
      },
    ]);
  });
  it('keeps lastTransitionTime when only reason or message changes', () => {
    const a = setCondition([], { type: 'X', status: 'False', reason: 'A', message: 'a' }, t1);
    const b = setCondition(a, { type: 'X', status: 'False', reason: 'B', message: 'b' }, t2);
    assert.equal(b[0]!.lastTransitionTime, rfc3339(t1));
    assert.equal(b[0]!.reason, 'B');
  });
  it('moves lastTransitionTime when the status flips', () => {
    const a = setCondition([], { type: 'X', status: 'False', reason: 'A', message: 'a' }, t1);
    const b = setCondition(a, { type: 'X', status: 'True', reason: 'A', message: 'a' }, t2);
    assert.equal(b[0]!.lastTransitionTime, rfc3339(t2));
  });
  it("leaves other writers' conditions and their order alone, and does not mutate input", () => {
    const theirs: Condition = {
      type: 'Provisioned',
      status: 'True',
      reason: 'Done',
      message: '',
      lastTransitionTime: '2025-01-01T00:00:00Z',
    };
    const input = [theirs];
    const out = setCondition(input, { type: 'X', status: 'True', reason: 'R', message: '' }, t1);
    assert.deepEqual(out[0], theirs);
    assert.equal(input.length, 1);
    assert.deepEqual(removeCondition(out, 'X'), [theirs]);
    assert.equal(getCondition(out, 'X')?.reason, 'R');
  });
  it('conditionChanged compares what a reader sees, not the timestamp', () => {
    const a = setCondition([], { type: 'X', status: 'True', reason: 'R', message: 'm', observedGeneration: 1 }, t1);
    assert.equal(
      conditionChanged(a, { type: 'X', status: 'True', reason: 'R', message: 'm', observedGeneration: 1 }),
      false,
    );
    assert.equal(
      conditionChanged(a, { type: 'X', status: 'True', reason: 'R', message: 'm2', observedGeneration: 1 }),
      true,
    );
    assert.equal(
      conditionChanged(a, { type: 'X', status: 'True', reason: 'R', message: 'm', observedGeneration: 2 }),
      true,
    );
    assert.equal(conditionChanged(a, { type: 'Y', status: 'True', reason: 'R', message: 'm' }), true);
  });
});

describe('strayConditions: owned conditions an apply left in place', () => {
  it("lists owned types left out of the desired set, last index first; never another writer's type", () => {
    const now = [c('IdentityAllowed'), c('Provisioned'), c('CredentialsMirrored'), c('ApplyJobSucceeded')];
    const desired = [{ type: 'IdentityAllowed', status: 'False' as const, reason: 'R', message: 'm' }];
    assert.deepEqual(strayConditions(now, desired), [
      { index: 3, type: 'ApplyJobSucceeded' },
      { index: 2, type: 'CredentialsMirrored' },
    ]);
    assert.deepEqual(strayConditions(now.slice(0, 2), desired), []);
    assert.deepEqual(strayConditions(undefined, []), []);
  });
});

describe('typesClaimedByOthers: who else owns a condition (managedFields)', () => {
  const entry = (manager: string, ...types: string[]) => ({
    manager,
    operation: 'Apply',
    subresource: 'status',
    fieldsV1: {
      'f:status': { 'f:conditions': Object.fromEntries(types.map((t) => [`k:{"type":"${t}"}`, { '.': {} }])) },
    },
  });
  it("counts other controllers' claims, not ours and not the reset manager's", () => {
    const fields = [
      entry('captf-credentials', 'IdentityAllowed', 'CredentialsMirrored'),
      entry('before-first-apply', 'IdentityAllowed', 'CredentialsMirrored', 'ApplyJobSucceeded'),
      entry('provider-manager', 'ApplyJobSucceeded', 'Provisioned'),
    ];
    assert.deepEqual([...typesClaimedByOthers(fields)].sort(), ['ApplyJobSucceeded', 'Provisioned']);
  });
  it('a listed consumer kept slim (slimConsumer) tells the same claims, without our own entry', () => {
    const fields = [
      entry('captf-credentials', 'IdentityAllowed', 'CredentialsMirrored'),
      entry('before-first-apply', 'IdentityAllowed'),
      entry('provider-manager', 'ApplyJobSucceeded', 'Provisioned'),
      { manager: 'kubectl', operation: 'Update', fieldsV1: { 'f:metadata': { 'f:labels': {} } } },
    ];
    const slim = slimConsumer(
      fx.consumer('c', fx.inNamespace('team'), (c) => void (c.metadata.managedFields = fields)),
    );
    assert.deepEqual(
      slim.metadata.managedFields?.map((e) => e.manager),
      ['provider-manager'],
    );
    assert.deepEqual([...typesClaimedByOthers(slim.metadata.managedFields)], [...typesClaimedByOthers(fields)]);
    const ours = slimConsumer(
      fx.consumer('c', fx.inNamespace('team'), (c) => void (c.metadata.managedFields = fields.slice(0, 2))),
    );
    assert.equal(ours.metadata.managedFields, undefined, 'nothing kept when only we claim conditions');
  });
  it('reads nothing into malformed entries', () => {
    const junk = [
      null,
      {},
      { manager: 'x', fieldsV1: 'text' },
      { manager: 'x', fieldsV1: { 'f:status': { 'f:conditions': { 'k:not json': {}, 'k:{"type":7}': {}, '.': {} } } } },
    ];
    assert.deepEqual([...typesClaimedByOthers(junk as never)], []);
    assert.deepEqual([...typesClaimedByOthers(undefined)], []);
  });
  it('a type another controller claims is never removed, so keeping it is no change', () => {
    const desired = [{ type: 'IdentityAllowed', status: 'True' as const, reason: 'R', message: 'm' }];
    const now = [c('IdentityAllowed'), c('ApplyJobSucceeded')];
    const keep = new Set(['ApplyJobSucceeded']);
    assert.equal(planConditions(now, desired, t2).changed, true);
    assert.equal(planConditions(now, desired, t2, { keep }).changed, false);
    assert.deepEqual(strayConditions(now, desired, { keep }), []);
    assert.deepEqual(strayConditions('junk', desired), []);
    assert.deepEqual(strayConditions([null, { type: 5 }, c('CredentialsMirrored')], desired), [
      { index: 2, type: 'CredentialsMirrored' },
    ]);
  });
});
