import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Condition } from '../../functions/lib/api.ts';
import { desiredMirror, sourceHash } from '../../functions/lib/mirror.ts';
import { consumerRefMatcher, planConditions, planMirror, planRelease } from '../../functions/mirror-sync/plan.ts';

const b64 = (s: string) => Buffer.from(s).toString('base64');
const AV = 'infrastructure.cluster.x-k8s.io/v1beta2';
const owner = (name: string, uid: string, kind = 'TerraformCluster') => ({ apiVersion: AV, kind, name, uid });
const data = { k: b64('v') };
const hash = sourceHash(data);
const current = () => ({ ...desiredMirror('aws', 'team', data, owner('a', '1')), metadata: { ...desiredMirror('aws', 'team', data, owner('a', '1')).metadata, resourceVersion: '7' } });

describe('planMirror (SPEC §4 step 6)', () => {
  it('creates when absent', () => {
    const p = planMirror(undefined, 'aws', 'team', data, hash, owner('a', '1'));
    assert.equal(p.action, 'create');
  });
  it('does nothing when current and owned: no write at all', () => {
    assert.deepEqual(planMirror(current(), 'aws', 'team', data, hash, owner('a', '1')), { action: 'none' });
  });
  it('adds a second owner with the resourceVersion kept as precondition, data untouched', () => {
    const p = planMirror(current(), 'aws', 'team', data, hash, owner('b', '2'));
    assert.equal(p.action, 'update');
    if (p.action !== 'update') return;
    assert.equal(p.dataChanged, false);
    assert.equal(p.body.metadata?.resourceVersion, '7');
    assert.deepEqual(p.body.metadata?.ownerReferences?.map((r) => r.name), ['a', 'b']);
  });
  it('rewrites data after a rotation', () => {
    const rotated = { k: b64('v2') };
    const p = planMirror(current(), 'aws', 'team', rotated, sourceHash(rotated), owner('a', '1'));
    assert.ok(p.action === 'update' && p.dataChanged);
    if (p.action === 'update') {
      assert.deepEqual(p.body.data, rotated);
      assert.equal(p.body.metadata?.annotations?.['captf.io/source-hash'], sourceHash(rotated));
    }
  });
  it('repairs hand-edited data even when the annotation was kept', () => {
    const m = current();
    m.data = { k: b64('tampered') };
    const p = planMirror(m, 'aws', 'team', data, hash, owner('a', '1'));
    assert.ok(p.action === 'update' && p.dataChanged);
  });
  it('restores a removed label', () => {
    const m = current();
    m.metadata.labels = { 'captf.io/mirrored': 'true' };
    const p = planMirror(m, 'aws', 'team', data, hash, owner('a', '1'));
    assert.ok(p.action === 'update' && !p.dataChanged);
  });
  it('is blocked by a Secret that is not ours, naming it', () => {
    const foreign = { metadata: { name: 'captf-creds-aws', labels: {} }, data: {} };
    const p = planMirror(foreign, 'aws', 'team', data, hash, owner('a', '1'));
    assert.equal(p.action, 'blocked');
    if (p.action === 'blocked') assert.match(p.message, /Secret team\/captf-creds-aws exists and is not a mirror of identity aws/);
    const otherIdentity = desiredMirror('gcp', 'team', data, owner('a', '1'));
    assert.equal(planMirror(otherIdentity, 'aws', 'team', data, hash, owner('a', '1')).action, 'blocked');
  });
});

describe('planRelease (SPEC §6)', () => {
  const isConsumer = consumerRefMatcher([{ group: 'infrastructure.cluster.x-k8s.io', kind: 'TerraformCluster' }, { group: 'infrastructure.cluster.x-k8s.io', kind: 'TerraformMachine' }]);
  const mirror = (...refs: ReturnType<typeof owner>[]) => ({ metadata: { ownerReferences: refs } });
  it('deletes when the last consumer reference goes', () => {
    assert.deepEqual(planRelease(mirror(owner('a', '1')), owner('a', '1'), isConsumer), { action: 'delete' });
  });
  it('deletes when only non-consumer references would remain', () => {
    assert.deepEqual(planRelease(mirror(owner('a', '1'), { apiVersion: 'v1', kind: 'ConfigMap', name: 'x', uid: '9' }), owner('a', '1'), isConsumer), { action: 'delete' });
  });
  it('drops only this reference while another consumer remains', () => {
    assert.deepEqual(planRelease(mirror(owner('a', '1'), owner('b', '2', 'TerraformMachine')), owner('a', '1'), isConsumer), { action: 'update', ownerReferences: [owner('b', '2', 'TerraformMachine')] });
  });
  it('does nothing for an owner not referenced, or another UID of the same name', () => {
    assert.deepEqual(planRelease(mirror(owner('a', '1')), owner('z', '9'), isConsumer), { action: 'none' });
    assert.deepEqual(planRelease(mirror(owner('a', 'new')), owner('a', 'old'), isConsumer), { action: 'none' });
  });
  it('releases any UID when the UID is unknown (Reference-mode delete)', () => {
    assert.deepEqual(planRelease(mirror(owner('a', '1')), { apiVersion: AV, kind: 'TerraformCluster', name: 'a' }, isConsumer), { action: 'delete' });
  });
});

describe('planConditions (SPEC §16)', () => {
  const t = new Date('2026-05-01T00:00:00Z');
  const theirs: Condition = { type: 'Provisioned', status: 'True', reason: 'Done', message: '', lastTransitionTime: '2026-01-01T00:00:00Z' };
  const mirrored = { type: 'CredentialsMirrored', status: 'True' as const, reason: 'Mirrored', message: 'm', observedGeneration: 1 };
  it('reports no change when the owned conditions already match', () => {
    const first = planConditions([theirs], [mirrored], t);
    assert.equal(first.changed, true);
    const again = planConditions(first.conditions, [mirrored], new Date('2026-06-01T00:00:00Z'));
    assert.equal(again.changed, false);
    assert.deepEqual(again.changedInputs, []);
  });
  it('removes owned types that are no longer stated and keeps other writers\' types', () => {
    const first = planConditions([theirs], [mirrored, { type: 'IdentityAllowed', status: 'True', reason: 'NamespaceAllowed', message: '' }], t);
    const next = planConditions(first.conditions, [{ type: 'IdentityAllowed', status: 'False', reason: 'NamespaceNotAllowed', message: 'no' }], t);
    assert.equal(next.changed, true);
    assert.deepEqual(next.conditions.map((c) => c.type), ['Provisioned', 'IdentityAllowed']);
    assert.deepEqual(next.owned.map((c) => c.type), ['IdentityAllowed']);
    assert.deepEqual(next.changedInputs.map((c) => c.reason), ['NamespaceNotAllowed']);
  });
  it('a removal alone is a change (so stale Mirrored=True never survives)', () => {
    const first = planConditions([], [mirrored], t);
    const cleared = planConditions(first.conditions, [], t);
    assert.equal(cleared.changed, true);
    assert.deepEqual(cleared.conditions, []);
  });
});
