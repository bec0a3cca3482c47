/**
 * decide() — the pure core of mirror-sync (SPEC §3, §4, §6, §16) — table by table: the
 * outcome table of SPEC §16 for every state of identity, namespace, source and mirror; owner
 * references for a listed key and for consumers looked at by name; and the condition list
 * a consumer should carry.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Condition, Consumer, OwnerReference, TerraformClusterIdentity } from '../../functions/lib/api.ts';
import { DEFAULT_CONSUMER_KINDS, TERRAFORM_CLUSTER, TERRAFORM_MACHINE } from '../../functions/lib/api.ts';
import { LABEL_MIRRORED, desiredMirror, mirrorOfLabel, sourceHash } from '../../functions/lib/mirror.ts';
import { planConditions } from '../../functions/lib/conditions.ts';
import {
  addsOwners,
  clusterScopedPlan,
  decide,
  decidedForGeneration,
  desiredOwnerReferences,
  failedPlan,
  keylessPlan,
  type Snapshot,
  type SourceRead,
} from '../../functions/mirror-sync/decide.ts';
import { eventChanges } from '../../functions/mirror-sync/status.ts';
import { mirrorWriteOf } from '../../functions/mirror-sync/writes.ts';
import * as fx from '../helpers/fixtures.ts';

const kinds = DEFAULT_CONSUMER_KINDS;
const b64 = (s: string) => Buffer.from(s).toString('base64');
const data = { k: b64('v') };
const found: SourceRead = { state: 'found', data, hash: sourceHash(data) };
const key = { namespace: 'team', identity: 'aws' };
/** The owner reference of consumer `name` (uid `id`) of `kind`. */
const owner = (name: string, id: string, kind = TERRAFORM_CLUSTER): OwnerReference => ({
  apiVersion: fx.apiVersionOf(kind),
  kind: kind.kind,
  name,
  uid: id,
});
/** TerraformCluster `name` as looked at by name (an entry of a snapshot's scope). */
const named = (name: string) => ({
  apiVersion: fx.apiVersionOf(TERRAFORM_CLUSTER),
  kind: TERRAFORM_CLUSTER.kind,
  name,
});
/** A user of identity `aws`: a TerraformCluster in namespace `team` with uid `id`, at generation 1. */
const user = (name: string, id: string, ...mods: fx.Modifier<Consumer>[]) =>
  fx.consumer(name, fx.inNamespace('team'), fx.identityRef('aws'), fx.uid(id), fx.stored(1, '1'), ...mods);
/** Identity `aws`, with source `ops/s`, allowing namespace `team` unless `mods` say otherwise. */
const aws = (...mods: fx.Modifier<TerraformClusterIdentity>[]) =>
  fx.identity('aws', fx.secretRef('ops', 's'), fx.allowList('team'), ...mods);
const mirror = (owners: OwnerReference[], d = data) => {
  const m = desiredMirror('aws', 'team', d, owners[0] ?? owner('x', '0'));
  m.metadata.ownerReferences = owners;
  return { ...m, metadata: { ...m.metadata, resourceVersion: '7', uid: 'm-uid' } };
};
const snap = (over: Partial<Snapshot>): Snapshot => ({
  key,
  identity: aws(),
  namespace: { labels: {} },
  source: found,
  mirror: undefined,
  consumers: [user('a', '1')],
  scope: 'all',
  ...over,
});

/** A plan's conditions for its first consumer, as `Type=Status/Reason`. */
const conditionsOf = (plan: ReturnType<typeof decide>) =>
  plan.consumers[0]!.conditions.map((c) => `${c.type}=${c.status}/${c.reason}`);
const ALLOWED = 'IdentityAllowed=True/NamespaceAllowed';
const NOT_ALLOWED = 'IdentityAllowed=False/NamespaceNotAllowed';
const MIRRORED = 'CredentialsMirrored=True/Mirrored';
const SOURCE_NOT_FOUND = 'CredentialsMirrored=False/SourceNotFound';

/** One row of the outcome table: the snapshot (over `snap`'s), the mirror action, the outcome and conditions. */
interface OutcomeRow {
  name: string;
  snapshot: Partial<Snapshot>;
  action: string;
  outcome: string;
  conditions: string[];
}

describe('decide: the outcome table of SPEC §16 (one consumer)', () => {
  const notOurs = { ...fx.mirrorOf('aws', fx.inNamespace('team'), fx.labels({})), data: {} };
  fx.rows<OutcomeRow>(
    [
      {
        name: 'identity missing',
        snapshot: { identity: undefined, source: undefined },
        action: 'none',
        outcome: 'identity-not-found',
        conditions: ['IdentityAllowed=False/IdentityNotFound'],
      },
      {
        name: 'identity missing, our mirror present',
        snapshot: { identity: undefined, source: undefined, mirror: mirror([owner('a', '1')]) },
        action: 'delete',
        outcome: 'identity-not-found',
        conditions: ['IdentityAllowed=False/IdentityNotFound'],
      },
      {
        name: 'namespace not allowed',
        snapshot: { identity: aws(fx.allowList('other')), source: undefined, mirror: mirror([owner('a', '1')]) },
        action: 'delete',
        outcome: 'not-allowed',
        conditions: [NOT_ALLOWED],
      },
      {
        name: 'namespace missing',
        snapshot: { namespace: undefined, source: undefined },
        action: 'none',
        outcome: 'not-allowed',
        conditions: [NOT_ALLOWED],
      },
      {
        name: 'allowed by selector labels',
        snapshot: { identity: aws(fx.allowSelector({ matchLabels: { t: 'y' } })), namespace: { labels: { t: 'y' } } },
        action: 'create',
        outcome: 'mirrored',
        conditions: [ALLOWED, MIRRORED],
      },
      {
        name: 'source missing, no mirror',
        snapshot: { source: { state: 'missing', message: 'gone' } },
        action: 'none',
        outcome: 'source-not-found',
        conditions: [ALLOWED, SOURCE_NOT_FOUND],
      },
      {
        name: 'source unreadable, mirror kept',
        snapshot: { source: { state: 'unreadable', message: '403' }, mirror: mirror([owner('a', '1')]) },
        action: 'none',
        outcome: 'source-not-found',
        conditions: [ALLOWED, SOURCE_NOT_FOUND],
      },
      {
        name: 'a Secret that is not ours holds the name',
        snapshot: { mirror: notOurs },
        action: 'blocked',
        outcome: 'mirror-failed',
        conditions: [ALLOWED, 'CredentialsMirrored=False/MirrorFailed'],
      },
      { name: 'no mirror yet', snapshot: {}, action: 'create', outcome: 'mirrored', conditions: [ALLOWED, MIRRORED] },
      {
        name: 'mirror current and owned: no write',
        snapshot: { mirror: mirror([owner('a', '1')]) },
        action: 'none',
        outcome: 'mirrored',
        conditions: [ALLOWED, MIRRORED],
      },
      {
        name: 'mirror stale after a rotation',
        snapshot: { mirror: mirror([owner('a', '1')], { k: b64('old') }) },
        action: 'update',
        outcome: 'mirrored',
        conditions: [ALLOWED, MIRRORED],
      },
    ],
    (row) => {
      const plan = decide(snap(row.snapshot), kinds);
      assert.equal(plan.mirror.action, row.action);
      assert.deepEqual(
        plan.consumers.map((c) => c.outcome),
        [row.outcome],
      );
      assert.deepEqual(conditionsOf(plan), row.conditions);
      for (const c of plan.consumers[0]!.conditions) assert.equal(c.observedGeneration, 1);
    },
  );
  it('a deleting consumer in a namespace that is not allowed: ApplyJobSucceeded=False/IdentityNotAllowed, retried', () => {
    const plan = decide(
      snap({
        identity: aws(fx.allowList()),
        source: undefined,
        consumers: [user('a', '1', fx.deleting('2026-01-01T00:00:00Z'))],
      }),
      kinds,
    );
    assert.deepEqual(
      plan.consumers[0]!.conditions.map((c) => c.reason),
      ['NamespaceNotAllowed', 'IdentityNotAllowed'],
    );
    assert.equal(plan.consumers[0]!.reason, 'IdentityNotAllowed');
    // It waits for a person (SPEC §4): answered as handled, never retried.
    assert.equal(plan.consumers[0]!.retry, false);
  });
  it('never deletes, writes or claims a Secret that is not ours, even when the identity is gone', () => {
    const plan = decide(
      snap({
        identity: undefined,
        source: undefined,
        mirror: fx.mirrorOf('aws', fx.labels({ [LABEL_MIRRORED]: 'true' })),
      }),
      kinds,
    );
    assert.equal(plan.mirror.action, 'none');
  });
  it('messages name the mirror, never data or hash', () => {
    const plan = decide(snap({}), kinds);
    for (const c of plan.consumers[0]!.conditions) {
      assert.ok(
        !c.message.includes(b64('v')) && !c.message.includes(found.state === 'found' ? found.hash : 'x'),
        c.message,
      );
    }
    assert.match(plan.consumers[0]!.message, /captf-creds-aws/);
  });
});

describe('decide: the mirror of a listed key (scope all)', () => {
  it('creates one mirror with exactly one owner reference per consumer, labels and annotations', () => {
    const plan = decide(snap({ consumers: [user('a', '1'), user('b', '2')] }), kinds);
    assert.equal(plan.mirror.action, 'create');
    if (plan.mirror.action !== 'create') return;
    assert.deepEqual(
      plan.mirror.body.metadata?.ownerReferences?.map((r) => [r.name, r.uid]),
      [
        ['a', '1'],
        ['b', '2'],
      ],
    );
    assert.equal(plan.mirror.body.metadata?.labels?.['captf.io/mirror-of'], mirrorOfLabel('aws'));
    assert.deepEqual(plan.mirror.body.data, data);
    assert.equal(plan.consumers.length, 2);
  });
  it("drops former users and stale UIDs, keeps other kinds' references: a merge by UID, guarded by the mirror's UID", () => {
    const foreign = { apiVersion: 'apps/v1', kind: 'Deployment', name: 'd', uid: 'f' };
    const plan = decide(
      snap({ mirror: mirror([owner('gone', '9'), foreign, owner('a', 'old')]), consumers: [user('a', '1')] }),
      kinds,
    );
    assert.equal(plan.mirror.action, 'merge');
    if (plan.mirror.action !== 'merge') return;
    assert.deepEqual(
      plan.mirror.add.map((r) => [r.kind, r.uid]),
      [['TerraformCluster', '1']],
    );
    assert.deepEqual(plan.mirror.remove, ['9', 'old'], 'the Deployment is never removed');
    assert.equal(plan.mirror.secret.metadata?.uid, 'm-uid');
  });
  it('deletes an unused mirror (SPEC §6) with its resourceVersion; leaves alone one a kind not configured here still owns', () => {
    const unused = decide(snap({ mirror: mirror([owner('gone', '9')]), consumers: [] }), kinds);
    assert.equal(unused.mirror.action, 'delete');
    if (unused.mirror.action === 'delete') {
      assert.equal(unused.mirror.why, 'unused');
      assert.equal(unused.mirror.secret.metadata?.resourceVersion, '7');
    }
    const foreign = decide(
      snap({
        mirror: mirror([
          owner('gone', '9'),
          { apiVersion: 'example.com/v1', kind: 'TerraformThing', name: 't', uid: 't' },
        ]),
        consumers: [],
      }),
      kinds,
    );
    // Another instance's configuration (a rollout) may know that kind: never collected here (SPEC §12).
    assert.equal(foreign.mirror.action, 'none');
  });
  it('a missing source keeps the last good data while owners follow the consumers', () => {
    const old = mirror([owner('a', '1'), owner('b', '2')], { k: b64('last-good') });
    const plan = decide(
      snap({ source: { state: 'missing', message: 'm' }, mirror: old, consumers: [user('a', '1')] }),
      kinds,
    );
    // Only a reference goes: a merge, which writes no data at all.
    assert.equal(plan.mirror.action, 'merge');
    if (plan.mirror.action === 'merge') assert.deepEqual([plan.mirror.add, plan.mirror.remove], [[], ['2']]);
    const relabel = decide(
      snap({
        source: { state: 'missing', message: 'm' },
        // Ours, but without the mirror-of label (made before it existed): a whole update.
        mirror: { ...old, metadata: { ...old.metadata, labels: { [LABEL_MIRRORED]: 'true' } } },
        consumers: [user('a', '1')],
      }),
      kinds,
    );
    assert.equal(relabel.mirror.action, 'update');
    if (relabel.mirror.action === 'update') {
      assert.deepEqual(relabel.mirror.body.data, { k: b64('last-good') });
      assert.deepEqual(
        relabel.mirror.body.metadata?.ownerReferences?.map((r) => r.name),
        ['a'],
      );
    }
  });
  it('a mirror of another type than Opaque that needs new data is blocked (type is immutable)', () => {
    const m = { ...mirror([owner('a', '1')], { k: b64('old') }), type: 'kubernetes.io/tls' };
    assert.equal(decide(snap({ mirror: m }), kinds).mirror.action, 'blocked');
  });
  it('in a namespace being deleted, no create (it would be refused); an existing mirror is still kept current', () => {
    const terminating = { labels: {}, terminating: true };
    const p = decide(snap({ namespace: terminating }), kinds);
    assert.equal(p.mirror.action, 'blocked');
    assert.deepEqual(
      p.consumers.map((c) => [c.reason, c.retry]),
      [['MirrorFailed', false]],
    );
    assert.equal(
      p.consumers[0]!.message,
      'cannot create mirror Secret team/captf-creds-aws: namespace team is being deleted (NamespaceTerminating)',
    );
    const stale = mirror([owner('a', '1')], { k: b64('old') });
    assert.equal(decide(snap({ namespace: terminating, mirror: stale }), kinds).mirror.action, 'update');
  });
});

describe('desiredOwnerReferences: consumers looked at by name', () => {
  const existing = [owner('a', '1'), owner('b', '2'), owner('c', '3', TERRAFORM_MACHINE)];
  it('adds a new consumer and leaves every other reference alone', () => {
    const refs = desiredOwnerReferences(existing, { consumers: [user('d', '4')], scope: [named('d')] }, kinds);
    assert.deepEqual(
      refs.map((r) => r.name),
      ['a', 'b', 'c', 'd'],
    );
  });
  it('removes a consumer that was looked at and is gone (or names another identity)', () => {
    const refs = desiredOwnerReferences(existing, { consumers: [], scope: [named('b')] }, kinds);
    assert.deepEqual(
      refs.map((r) => r.name),
      ['a', 'c'],
    );
  });
  it('replaces a stale UID in place; a same-named object of another kind is another owner', () => {
    const refs = desiredOwnerReferences(existing, { consumers: [user('a', '11')], scope: [named('a')] }, kinds);
    assert.deepEqual(
      refs.map((r) => [r.name, r.uid]),
      [
        ['a', '11'],
        ['b', '2'],
        ['c', '3'],
      ],
    );
  });
  it('never lists one owner twice', () => {
    const refs = desiredOwnerReferences(
      [owner('a', '1'), owner('a', '1')],
      { consumers: [user('a', '1')], scope: 'all' },
      kinds,
    );
    assert.equal(refs.length, 1);
  });
});

describe('planConditions (SPEC §4, §16)', () => {
  const t = new Date('2026-05-01T00:00:00Z');
  const theirs: Condition = {
    type: 'Provisioned',
    status: 'True',
    reason: 'Done',
    message: '',
    lastTransitionTime: '2026-01-01T00:00:00Z',
  };
  const mirrored = {
    type: 'CredentialsMirrored',
    status: 'True' as const,
    reason: 'Mirrored',
    message: 'm',
    observedGeneration: 1,
  };
  it('reports no change when the owned conditions already match', () => {
    const first = planConditions([theirs], [mirrored], t);
    assert.equal(first.changed, true);
    const again = planConditions(first.conditions, [mirrored], new Date('2026-06-01T00:00:00Z'));
    assert.equal(again.changed, false);
    assert.deepEqual(again.changedInputs, []);
  });
  it("removes owned types that are no longer stated and keeps other writers' types", () => {
    const first = planConditions(
      [theirs],
      [mirrored, { type: 'IdentityAllowed', status: 'True', reason: 'NamespaceAllowed', message: '' }],
      t,
    );
    const next = planConditions(
      first.conditions,
      [{ type: 'IdentityAllowed', status: 'False', reason: 'NamespaceNotAllowed', message: 'no' }],
      t,
    );
    assert.equal(next.changed, true);
    assert.deepEqual(
      next.conditions.map((c) => c.type),
      ['Provisioned', 'IdentityAllowed'],
    );
    assert.deepEqual(
      next.owned.map((c) => c.type),
      ['IdentityAllowed'],
    );
    assert.deepEqual(
      next.changedInputs.map((c) => c.reason),
      ['NamespaceNotAllowed'],
    );
  });
  it('a removal alone is a change (so stale Mirrored=True never survives)', () => {
    const first = planConditions([], [mirrored], t);
    const cleared = planConditions(first.conditions, [], t);
    assert.equal(cleared.changed, true);
    assert.deepEqual(cleared.conditions, []);
  });
});

describe('decide: states that wait for a person, and sources', () => {
  it('never retries a missing identity, a missing source or a namespace not allowed', () => {
    for (const over of [
      { identity: undefined },
      { source: { state: 'missing', message: 'gone' } as const },
      { identity: aws(fx.allowList('other')) },
    ]) {
      const plan = decide(snap(over), kinds);
      assert.equal(plan.consumers[0]!.retry, false, JSON.stringify(Object.keys(over)));
    }
  });
  it('an identity whose source has the mirror prefix is inert: its own mirror goes, nothing is copied (SPEC §3)', () => {
    const launderer = aws(fx.secretRef('team', 'captf-creds-aws-prod'));
    const cases: [string, Partial<Snapshot>, string][] = [
      ['no mirror yet: none is created', { identity: launderer, mirror: undefined, source: undefined }, 'none'],
      ['its mirror (maybe laundered) is deleted', { identity: launderer, mirror: mirror([owner('a', '1')]) }, 'delete'],
      [
        'its own source, looking like its mirror, is never touched',
        {
          identity: aws(fx.secretRef('team', 'captf-creds-aws')),
          mirror: mirror([owner('a', '1')]),
        },
        'none',
      ],
    ];
    for (const [name, over, action] of cases) {
      const plan = decide(snap(over), kinds);
      assert.equal(plan.mirror.action, action, name);
      if (plan.mirror.action === 'delete') assert.equal(plan.mirror.why, 'inert', name);
      assert.equal(plan.sourceHash, undefined, name);
      assert.equal(plan.consumers[0]!.outcome, 'source-is-mirror', name);
      assert.deepEqual(conditionsOf(plan), [ALLOWED, 'CredentialsMirrored=False/SourceIsMirror'], name);
      assert.match(plan.consumers[0]!.message, /inert.*reserved for the mirrors/, name);
    }
  });
  it('another identity naming this mirror never makes it "not ours": revocation still deletes it', () => {
    // A rule "any identity's source is never ours" would let a launderer keep a mirror alive.
    const plan = decide(snap({ identity: aws(fx.allowList()), mirror: mirror([owner('a', '1')]) }), kinds);
    assert.equal(plan.mirror.action, 'delete');
  });
  it('says a cluster-scoped consumer cannot use credentials', () => {
    const p = clusterScopedPlan(fx.consumer('c', fx.identityRef('aws'), fx.uid('9'), fx.stored(1, '1')));
    assert.equal(p.outcome, 'not-allowed');
    assert.equal(p.retry, false);
    assert.deepEqual(
      p.conditions.map((x) => `${x.type}=${x.status}/${x.reason}`),
      [NOT_ALLOWED],
    );
    assert.match(p.message, /cluster-scoped objects cannot use credentials/);
  });
});

describe('decidedForGeneration: the echo of a decision already written (SPEC §12)', () => {
  const cond = (type: string, status: 'True' | 'False', observedGeneration?: number) => ({
    type,
    status,
    reason: 'R',
    message: 'm',
    lastTransitionTime: '2026-01-01T00:00:00Z',
    ...(observedGeneration === undefined ? {} : { observedGeneration }),
  });
  fx.rows(
    [
      {
        name: 'both conditions at the generation',
        conditions: [cond('IdentityAllowed', 'True', 1), cond('CredentialsMirrored', 'True', 1)],
        decided: true,
      },
      { name: 'not allowed: IdentityAllowed alone', conditions: [cond('IdentityAllowed', 'False', 1)], decided: true },
      { name: 'no conditions yet (a new consumer)', conditions: [], decided: false },
      {
        name: 'decided for an older generation (spec changed, or deleting)',
        conditions: [cond('IdentityAllowed', 'True', 1), cond('CredentialsMirrored', 'True', 0)],
        decided: false,
      },
      { name: 'only another writer’s condition', conditions: [cond('Provisioned', 'True', 1)], decided: false },
      {
        name: 'CredentialsMirrored without IdentityAllowed (edited by hand)',
        conditions: [cond('CredentialsMirrored', 'True', 1)],
        decided: false,
      },
      { name: 'no observedGeneration', conditions: [cond('IdentityAllowed', 'True')], decided: false },
    ],
    ({ conditions, decided }) => {
      assert.equal(decidedForGeneration(user('a', '1', fx.conditions(...conditions))), decided);
    },
  );
});

describe('eventChanges: the one Event of a reconcile (SPEC §4)', () => {
  const change = (type: string, status: 'True' | 'False' | 'Unknown', reason: string) => ({
    type,
    status,
    reason,
    message: 'm',
  });
  fx.rows(
    [
      {
        name: 'mirrored: the outcome first',
        changes: [
          change('IdentityAllowed', 'True', 'NamespaceAllowed'),
          change('CredentialsMirrored', 'True', 'Mirrored'),
        ],
        first: 'Mirrored',
      },
      {
        name: 'source missing: the False first',
        changes: [
          change('IdentityAllowed', 'True', 'NamespaceAllowed'),
          change('CredentialsMirrored', 'False', 'SourceNotFound'),
        ],
        first: 'SourceNotFound',
      },
      {
        name: 'deleting, not allowed: the destroy that waits',
        changes: [
          change('IdentityAllowed', 'False', 'NamespaceNotAllowed'),
          change('ApplyJobSucceeded', 'False', 'IdentityNotAllowed'),
        ],
        first: 'IdentityNotAllowed',
      },
      {
        name: 'Unknown before True',
        changes: [change('CredentialsMirrored', 'True', 'Mirrored'), change('IdentityAllowed', 'Unknown', 'Pending')],
        first: 'Pending',
      },
      {
        name: 'one change',
        changes: [change('IdentityAllowed', 'False', 'IdentityNotFound')],
        first: 'IdentityNotFound',
      },
    ],
    ({ changes, first }) => {
      const ordered = eventChanges(changes);
      assert.equal(ordered[0]!.reason, first);
      assert.equal(ordered.length, changes.length, 'every change is told');
    },
  );
});

describe('keylessPlan: a consumer without a key (SPEC §2, §4)', () => {
  fx.rows(
    [
      {
        name: 'no identityRef: our conditions cleared',
        mods: [fx.identityRef(undefined)],
        outcome: 'no-identity-ref',
        conditions: [],
      },
      {
        name: 'a name that cannot be an identity',
        mods: [fx.identityRef('Not_A_Name')],
        outcome: 'identity-not-found',
        conditions: ['IdentityAllowed=False/IdentityNotFound'],
      },
      {
        name: 'cluster-scoped',
        mods: [(c: Consumer) => void delete c.metadata.namespace, fx.identityRef('aws')],
        outcome: 'not-allowed',
        conditions: ['IdentityAllowed=False/NamespaceNotAllowed'],
      },
    ],
    ({ mods, outcome, conditions }) => {
      const p = keylessPlan(fx.consumer('c', fx.inNamespace('team'), fx.stored(1, '1'), ...mods));
      assert.equal(p.outcome, outcome);
      assert.deepEqual(
        p.conditions.map((c) => `${c.type}=${c.status}/${c.reason}`),
        conditions,
      );
      assert.equal(p.retry, false, 'it waits for a person');
    },
  );
});

describe('failedPlan: a mirror write refused for good', () => {
  it('a refused create: every consumer MirrorFailed with the refusal, IdentityAllowed kept', () => {
    const plan = decide(snap({}), kinds);
    const failed = failedPlan(plan, 'the API server refused to create mirror Secret team/captf-creds-aws: HTTP 403');
    assert.deepEqual(conditionsOf({ ...plan, consumers: failed }), [ALLOWED, 'CredentialsMirrored=False/MirrorFailed']);
    assert.equal(failed[0]!.outcome, 'mirror-failed');
  });
  it('a refused revocation says the credentials are still there, and what a person must do', () => {
    const plan = decide(snap({ identity: aws(fx.allowList('elsewhere')), mirror: mirror([owner('a', '1')]) }), kinds);
    const [p] = failedPlan(plan, 'HTTP 422');
    const allowed = p!.conditions.find((c) => c.type === 'IdentityAllowed')!;
    assert.equal(allowed.reason, 'NamespaceNotAllowed');
    assert.match(
      allowed.message,
      /captf-creds-aws is still there and still holds the credentials: deleting it was refused/,
    );
    assert.match(p!.message, /^the mirror could not be deleted; .*delete it by hand, or lift what refuses the delete$/);
  });
});

describe('the write path (writes.ts): a snapshot in, the one request to the mirror out', () => {
  /** A request as the table states it: verb, the references it adds and removes, its guard. */
  const summary = (s: Snapshot) => {
    const w = mirrorWriteOf(decide(s, kinds));
    if (!w) return 'none';
    const guard = 'precondition' in w ? w.precondition : {};
    if (w.verb === 'patch') {
      const refs = w.body.metadata.ownerReferences;
      const adds = refs.filter((r) => !('$patch' in r)).map((r) => `+${r.uid}`);
      const removes = refs.filter((r) => '$patch' in r).map((r) => `-${r.uid}`);
      return { verb: 'patch (merge)', refs: [...adds, ...removes].join(' '), guard };
    }
    const refs = 'body' in w ? (w.body.metadata?.ownerReferences ?? []).map((r) => r.uid).join(' ') : '';
    return { verb: w.verb, ...(refs ? { refs } : {}), guard };
  };
  const byUid = { uid: 'm-uid' };
  const byVersion = { uid: 'm-uid', resourceVersion: '7' };
  const exactly = { resourceVersion: '7', uid: 'm-uid' };
  const rows: { name: string; snapshot: Partial<Snapshot>; want: ReturnType<typeof summary> }[] = [
    {
      name: 'no mirror: a create, guarded by AlreadyExists',
      snapshot: {},
      want: { verb: 'create', refs: '1', guard: {} },
    },
    {
      name: 'a new consumer looked at by name: a merge that adds it, without a resourceVersion',
      snapshot: { mirror: mirror([owner('a', '1')]), consumers: [user('b', '2')], scope: [named('b')] },
      want: { verb: 'patch (merge)', refs: '+2', guard: byUid },
    },
    {
      name: 'several new consumers of a listed key: one merge adding each',
      snapshot: { mirror: mirror([owner('a', '1')]), consumers: [user('a', '1'), user('b', '2'), user('c', '3')] },
      want: { verb: 'patch (merge)', refs: '+2 +3', guard: byUid },
    },
    {
      name: 'a former user, listed key: a merge that removes it by UID (the garbage collector’s form), with the resourceVersion read',
      snapshot: { mirror: mirror([owner('a', '1'), owner('gone', '9')]), consumers: [user('a', '1')] },
      want: { verb: 'patch (merge)', refs: '-9', guard: byVersion },
    },
    {
      name: 'a consumer recreated under its name: one merge adds the new UID and removes the old (a removal: with the resourceVersion)',
      snapshot: {
        mirror: mirror([owner('a', 'old'), owner('b', '2')]),
        consumers: [user('a', '1')],
        scope: [named('a')],
      },
      want: { verb: 'patch (merge)', refs: '+1 -old', guard: byVersion },
    },
    {
      name: 'the source rotated: a whole update with the resourceVersion it was read at',
      snapshot: { mirror: mirror([owner('a', '1')], { k: b64('old') }), consumers: [user('a', '1'), user('b', '2')] },
      want: { verb: 'update', refs: '1 2', guard: { resourceVersion: '7' } },
    },
    {
      name: 'a reference to keep whose fields are wrong (controller set): an update, not a merge',
      snapshot: { mirror: mirror([{ ...owner('a', '1'), controller: true }]) },
      want: { verb: 'update', refs: '1', guard: { resourceVersion: '7' } },
    },
    {
      name: 'stored references that repeat a UID: an update makes the list exact',
      snapshot: { mirror: mirror([owner('a', '1'), owner('a', '1')]), consumers: [user('a', '1'), user('b', '2')] },
      want: { verb: 'update', refs: '1 2', guard: { resourceVersion: '7' } },
    },
    {
      name: 'the source is missing and only references change: a merge, the last good data untouched',
      snapshot: {
        source: { state: 'missing', message: 'm' },
        mirror: mirror([owner('a', '1'), owner('gone', '9')], { k: b64('last-good') }),
        consumers: [user('a', '1')],
      },
      want: { verb: 'patch (merge)', refs: '-9', guard: byVersion },
    },
    {
      name: 'the last user gone: a delete of exactly the mirror read (SPEC §6)',
      snapshot: { mirror: mirror([owner('gone', '9')]), consumers: [] },
      want: { verb: 'delete', guard: exactly },
    },
    {
      name: 'a revocation: a delete of exactly the mirror read',
      snapshot: { identity: aws(fx.allowList('elsewhere')), mirror: mirror([owner('a', '1')]) },
      want: { verb: 'delete', guard: exactly },
    },
    { name: 'current and owned: no request', snapshot: { mirror: mirror([owner('a', '1')]) }, want: 'none' },
    {
      name: 'a Secret in the way: no request',
      snapshot: { mirror: fx.mirrorOf('aws', fx.labels({ [LABEL_MIRRORED]: 'true' })) },
      want: 'none',
    },
  ];
  for (const row of rows) it(row.name, () => assert.deepEqual(summary(snap(row.snapshot)), row.want));

  it('a merge carries the mirror’s UID and the references only: no resourceVersion, no data, no labels', () => {
    const w = mirrorWriteOf(
      decide(snap({ mirror: mirror([owner('a', '1')]), consumers: [user('b', '2')], scope: [named('b')] }), kinds),
    );
    assert.deepEqual(w && 'body' in w ? w.body : undefined, {
      metadata: { uid: 'm-uid', ownerReferences: [owner('b', '2')] },
    });
  });
});

describe('addsOwners: what a resync from aged lists must decide again from fresh reads', () => {
  const adds = (s: Partial<Snapshot>) => addsOwners(decide(snap(s), kinds), snap(s).mirror);
  it('a create, or a merge or update that brings a new UID, adds an owner', () => {
    assert.equal(adds({}), true, 'create');
    assert.equal(adds({ mirror: mirror([owner('a', '1')]), consumers: [user('a', '1'), user('b', '2')] }), true);
    assert.equal(
      adds({ mirror: mirror([owner('a', '1')], { k: b64('old') }), consumers: [user('a', '1'), user('b', '2')] }),
      true,
      'an update',
    );
  });
  it('a rotation, a removal and a delete add none', () => {
    assert.equal(adds({ mirror: mirror([owner('a', '1')], { k: b64('old') }) }), false);
    assert.equal(adds({ mirror: mirror([owner('a', '1'), owner('gone', '9')]) }), false);
    assert.equal(adds({ mirror: mirror([owner('gone', '9')]), consumers: [] }), false);
  });
});
