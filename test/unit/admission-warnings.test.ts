/**
 * SPEC §10: an UPDATE that leaves `spec` alone is admitted without validation (ratcheting); an
 * allowed change of `allowedNamespaces` or `secretRef` answers with warnings — computed by pure
 * functions here, and looked up by the shell (review.ts) against fake API clients that count
 * their calls.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { reviewResponse } from '../../functions/admission/admission-review.ts';
import {
  MAX_WARNING_LENGTH,
  consumerCounts,
  namespacesLosingAccess,
  namespacesNeedingLabels,
  planReview,
  revocationWarnings,
  secretRefWarning,
  summariseList,
  type ImpactCheck,
  type IdentityRequest,
} from '../../functions/admission/decide.ts';
import { reviewIdentity, type ReviewDeps } from '../../functions/admission/review.ts';
import { DEFAULT_CONSUMER_KINDS, type TerraformClusterIdentity } from '../../functions/lib/api.ts';
import type { Clients } from '../../functions/lib/kube.ts';
import { identityRequest } from '../helpers/admission.ts';
import * as fx from '../helpers/fixtures.ts';
import { captureLogger } from '../helpers/logs.ts';

/** The identity `aws` on `captf-system/creds`. */
const aws = (...mods: fx.Modifier<TerraformClusterIdentity>[]) => fx.identity('aws', ...mods);
const update = (object: unknown, oldObject: unknown, extra: Partial<IdentityRequest> = {}): IdentityRequest =>
  identityRequest('UPDATE', object, oldObject, extra);
/** An `allowedNamespaces` the CRD schema accepts and the webhook refuses: `In` without values. */
const invalid = () => fx.allowSelector({ matchExpressions: [{ key: 'tier', operator: 'In' }] });
const check = (oldAllowed: unknown, newAllowed: unknown, name = 'aws'): ImpactCheck => ({
  identity: name,
  oldAllowed,
  newAllowed,
});

describe('ratcheting: an UPDATE that leaves spec unchanged is not validated (SPEC §10)', () => {
  const stored = aws(invalid(), fx.finalizers('example.com/keep'));

  it('adding a label to an identity stored with an invalid spec is allowed, with no review and no notes', () => {
    const plan = planReview(update(aws(invalid(), fx.labels({ team: 'x' })), stored));
    assert.deepEqual(plan, { action: 'allow', why: 'spec unchanged (not validated: ratcheting)' });
  });

  it('removing the last finalizer of a deleting identity with an invalid spec is allowed', () => {
    const old = aws(invalid(), fx.finalizers('example.com/keep'), fx.deleting());
    const plan = planReview(update(aws(invalid(), fx.finalizers(), fx.deleting()), old));
    assert.equal(plan.action, 'allow');
  });

  it('the same spec with its keys in another order is unchanged', () => {
    const { secretRef, allowedNamespaces } = stored.spec;
    const reordered = { allowedNamespaces, secretRef: { name: secretRef.name, namespace: secretRef.namespace } };
    assert.notDeepEqual(Object.keys(reordered), Object.keys(stored.spec), 'the keys are in another order');
    assert.equal(planReview(update(aws(fx.identitySpec(reordered)), stored)).action, 'allow');
  });

  it('changing the invalid spec is validated as before (denied 422 while still invalid)', () => {
    const still = aws(fx.allowSelector({ matchExpressions: [{ key: 'other', operator: 'In' }] }));
    const plan = planReview(update(still, stored));
    assert.equal(plan.action, 'deny');
    if (plan.action === 'deny') assert.equal(plan.decision.code, 422);
  });

  it('fixing the invalid spec needs the SubjectAccessReview (the old value allowed nothing)', () => {
    const fixed = aws(fx.allowSelector({ matchLabels: { tier: 'x' } }));
    const plan = planReview(update(fixed, stored));
    assert.equal(plan.action, 'check-secret-access');
    if (plan.action === 'check-secret-access') assert.equal(plan.notes?.impact, undefined, 'nothing to revoke');
  });

  it('an UPDATE review without the objects is still validated', () => {
    assert.equal(planReview(update(undefined, undefined)).action, 'deny');
  });
});

describe('planReview: the notes an allowed UPDATE carries', () => {
  const base = aws(fx.allowList('a', 'b'));

  it('narrowing: allowed without a SAR, with an impact check of old and new allowedNamespaces', () => {
    const plan = planReview(update(aws(fx.allowList('a')), base));
    assert.equal(plan.action, 'allow');
    if (plan.action === 'allow')
      assert.deepEqual(plan.notes, {
        warnings: [],
        impact: { identity: 'aws', oldAllowed: { list: ['a', 'b'] }, newAllowed: { list: ['a'] } },
      });
  });

  it('a widening that also drops a name: SAR, then an impact check', () => {
    const plan = planReview(update(aws(fx.allowList('a', 'c')), base));
    assert.equal(plan.action, 'check-secret-access');
    if (plan.action === 'check-secret-access') assert.ok(plan.notes?.impact);
  });

  it('secretRef change: SAR, a rewrite warning naming the new Secret, no impact check', () => {
    const plan = planReview(update(aws(fx.secretRef('ops', 'new-creds'), fx.allowList('a', 'b')), base));
    assert.equal(plan.action, 'check-secret-access');
    if (plan.action === 'check-secret-access')
      assert.deepEqual(plan.notes, {
        warnings: ['identity "aws": spec.secretRef changed; every mirror will be rewritten from ops/new-creds'],
      });
  });

  it('from an absent allowedNamespaces nothing can be revoked: no impact check', () => {
    const plan = planReview(update(aws(fx.allowList()), aws()));
    assert.ok(plan.action === 'allow' && plan.notes && !plan.notes.impact);
  });
});

describe('summariseList', () => {
  it('keeps a list that fits', () => {
    assert.equal(summariseList(['a', 'b', 'c'], 20), 'a, b, c');
  });
  it('summarises the rest as "and N more" within the budget', () => {
    const items = Array.from({ length: 50 }, (_, i) => `ns-${String(i).padStart(2, '0')}`);
    const s = summariseList(items, 40);
    assert.ok(s.length <= 40, s);
    assert.match(s, /^ns-00, ns-01, ns-02, ns-03, and 46 more$/);
  });
  it('names the first item, shortened, when not one fits whole (never a list naming nothing)', () => {
    assert.equal(summariseList(['x'.repeat(60), 'y'], 20), 'xxxxx..., and 1 more');
    assert.equal(summariseList(['x'.repeat(60)], 20), 'xxxxxxxxxxxxxxxxx...');
  });
});

describe('namespacesNeedingLabels: labels are read only when a selector decides', () => {
  const inUse = ['b', 'a', 'c'];
  it('lists on both sides: none', () => {
    assert.deepEqual(namespacesNeedingLabels(check({ list: ['a', 'b'] }, { list: ['a'] }), inUse), []);
  });
  it('an old selector: every namespace in use', () => {
    assert.deepEqual(namespacesNeedingLabels(check({ selector: {} }, { list: ['a'] }), inUse), ['a', 'b', 'c']);
  });
  it('a new selector only: the in-use namespaces the old list named', () => {
    assert.deepEqual(
      namespacesNeedingLabels(check({ list: ['a', 'b', 'z'] }, { selector: { matchLabels: { t: 'x' } } }), inUse),
      ['a', 'b'],
    );
  });
});

describe('namespacesLosingAccess: allowed before, not after (isNamespaceAllowed)', () => {
  it('a list that lost names', () => {
    const lost = namespacesLosingAccess(check({ list: ['a', 'b', 'c'] }, { list: ['a'] }), {
      consumers: { a: 1, b: 2, d: 1 },
      labels: {},
    });
    assert.deepEqual(lost, ['b']);
  });
  it('a tightened selector, by the namespaces labels; a dropped name the new selector still matches keeps access', () => {
    const c = check(
      { list: ['x'], selector: { matchLabels: { env: 'prod' } } },
      { selector: { matchLabels: { env: 'prod', tier: 'gold' } } },
    );
    const lost = namespacesLosingAccess(c, {
      consumers: { p1: 1, p2: 3, x: 1, dev: 2 },
      labels: { p1: { env: 'prod', tier: 'gold' }, p2: { env: 'prod' }, x: { env: 'prod', tier: 'gold' }, dev: {} },
    });
    assert.deepEqual(lost, ['p2']);
  });
  it('a namespace whose labels were needed but not found is gone and loses nothing', () => {
    const lost = namespacesLosingAccess(check({ selector: {} }, { list: [] }), {
      consumers: { here: 1, gone: 1 },
      labels: { here: {} },
    });
    assert.deepEqual(lost, ['here']);
  });
});

describe('revocationWarnings (SPEC §10)', () => {
  const narrowing = check({ list: ['team-a', 'team-b', 'team-c'] }, { list: ['team-a'] }, 'aws-prod');

  it('names the namespaces that lose access, their consumers, and the total', () => {
    assert.deepEqual(
      revocationWarnings(narrowing, { consumers: { 'team-a': 5, 'team-b': 3, 'team-c': 1 }, labels: {} }),
      [
        'identity "aws-prod": spec.allowedNamespaces no longer allows 2 namespaces in use: team-b (3 consumers), ' +
          'team-c (1 consumer); 4 consumers there will lose their credentials',
      ],
    );
  });

  it('one consumer in one namespace reads in the singular', () => {
    assert.deepEqual(revocationWarnings(narrowing, { consumers: { 'team-c': 1 }, labels: {} }), [
      'identity "aws-prod": spec.allowedNamespaces no longer allows 1 namespace in use: team-c (1 consumer); ' +
        '1 consumer there will lose its credentials',
    ]);
  });

  it('nothing when no namespace in use loses access', () => {
    assert.deepEqual(revocationWarnings(narrowing, { consumers: { 'team-a': 5, elsewhere: 2 }, labels: {} }), []);
  });

  it('a long list is summarised in one warning under 256 characters, with the true totals', () => {
    const names = Array.from(
      { length: 200 },
      (_, i) => `tenant-namespace-with-a-long-name-${String(i).padStart(3, '0')}`,
    );
    const c = check({ list: names }, { list: [] }, 'x'.repeat(253));
    const consumers = Object.fromEntries(names.map((n) => [n, 2]));
    const [w, ...rest] = revocationWarnings(c, { consumers, labels: {} });
    assert.deepEqual(rest, []);
    assert.ok(w!.length < 256, `${w!.length}: ${w}`);
    assert.ok(w!.length <= MAX_WARNING_LENGTH);
    assert.match(w!, /no longer allows 200 namespaces in use: tenant-namespace-with-a-long-name-000 \(2 consumers\), /);
    assert.match(w!, /, and \d+ more; 400 consumers there will lose their credentials$/);
    assert.match(w!, /^identity "x{60}\.\.\."/, 'a 253-character identity name is shortened');
  });

  it('a failed lookup warns that the impact could not be computed (and never denies)', () => {
    const [w, ...rest] = revocationWarnings(narrowing, {
      error: 'HTTP 403 Forbidden: namespaces "team-b" is forbidden',
    });
    assert.deepEqual(rest, []);
    assert.equal(
      w,
      'identity "aws-prod": could not compute which namespaces in use lose access (HTTP 403 Forbidden: namespaces ' +
        '"team-b" is forbidden); consumers in namespaces no longer allowed will lose their credentials',
    );
  });

  it('a long or non-ASCII error is cut so the warning stays under 256 printable ASCII characters', () => {
    const [w] = revocationWarnings(narrowing, { error: `caf\u00e9\n${'e'.repeat(1000)}` });
    assert.ok(w!.length < 256, String(w!.length));
    assert.match(w!, /^[\x20-\x7e]+$/);
    assert.match(w!, /\.\.\.\); consumers in namespaces no longer allowed will lose their credentials$/);
  });
});

describe('secretRefWarning', () => {
  it('says every mirror will be rewritten from the new Secret, under 256 characters even for long names', () => {
    const w = secretRefWarning('y'.repeat(253), { namespace: 'n'.repeat(63), name: 's'.repeat(253) });
    assert.ok(w.length < 256, String(w.length));
    assert.match(w, /spec\.secretRef changed; every mirror will be rewritten from n{63}\/s+\.\.\.$/);
  });
});

describe('consumerCounts', () => {
  it('counts per namespace and ignores cluster-scoped ones', () => {
    assert.deepEqual(consumerCounts(['a', 'b', 'a', '']), { a: 2, b: 1 });
  });
});

describe('reviewResponse carries warnings on allowed answers only', () => {
  it('warnings when there are some', () => {
    assert.deepEqual(reviewResponse('u', { allowed: true, why: 'x', warnings: ['w1'] }).response, {
      uid: 'u',
      allowed: true,
      warnings: ['w1'],
    });
  });
  it('no warnings field when there are none', () => {
    assert.deepEqual(reviewResponse('u', { allowed: true, why: 'x', warnings: [] }).response, {
      uid: 'u',
      allowed: true,
    });
  });
});

/** Fake API clients: consumers per namespace (or a failure, or a delay) and namespace labels. */
function fakeDeps(opts: {
  consumers?: Record<string, number>;
  labels?: Record<string, Record<string, string>>;
  failList?: boolean;
  listDelayMs?: number;
  impactBudgetMs?: number;
}) {
  const calls = { lists: 0, namespaceReads: [] as string[], sars: 0 };
  const items = Object.entries(opts.consumers ?? {}).flatMap(([namespace, n]) =>
    Array.from({ length: n }, (_, i) => fx.consumer(`c${i}`, fx.inNamespace(namespace), fx.identityRef('aws'))),
  );
  let listed = false;
  const clients = {
    custom: {
      async listClusterCustomObject() {
        calls.lists++;
        if (opts.listDelayMs) await new Promise((r) => setTimeout(r, opts.listDelayMs));
        if (opts.failList)
          throw Object.assign(new Error('boom'), {
            code: 503,
            body: { kind: 'Status', reason: 'ServiceUnavailable', message: 'etcd is sad' },
          });
        // All the consumers come with the first kind's list.
        const page = listed ? [] : items;
        listed = true;
        return { items: page, metadata: {} };
      },
    },
    core: {
      async readNamespace({ name }: { name: string }) {
        calls.namespaceReads.push(name);
        const labels = opts.labels?.[name];
        if (!labels) throw Object.assign(new Error('not found'), { code: 404 });
        return { metadata: { name, labels } };
      },
    },
    authz: {
      async createSubjectAccessReview() {
        calls.sars++;
        return { status: { allowed: true } };
      },
    },
  } as unknown as Clients;
  const cap = captureLogger('admission');
  const deps: ReviewDeps = {
    clients,
    consumerKinds: DEFAULT_CONSUMER_KINDS,
    logger: cap.logger,
    ...(opts.impactBudgetMs ? { impactBudgetMs: opts.impactBudgetMs } : {}),
  };
  return { deps, calls, cap };
}

describe('reviewIdentity: the impact lookup of the shell (review.ts)', () => {
  const old = aws(fx.allowList('team-a', 'team-b'));
  const narrowed = aws(fx.allowList('team-a'));

  it('a narrowing is allowed with the revocation warning; list-only values read no namespace', async () => {
    const { deps, calls } = fakeDeps({ consumers: { 'team-a': 1, 'team-b': 2 } });
    const d = await reviewIdentity(update(narrowed, old), deps);
    assert.ok(d.allowed);
    assert.deepEqual(d.warnings, [
      'identity "aws": spec.allowedNamespaces no longer allows 1 namespace in use: team-b (2 consumers); ' +
        '2 consumers there will lose their credentials',
    ]);
    assert.equal(calls.sars, 0);
    assert.deepEqual(calls.namespaceReads, []);
  });

  it('a dry run is reviewed the same way', async () => {
    const { deps } = fakeDeps({ consumers: { 'team-b': 1 } });
    const d = await reviewIdentity(update(narrowed, old, { dryRun: true }), deps);
    assert.ok(d.allowed && d.warnings?.length === 1);
  });

  it('a selector reads the labels of the namespaces in use, and a namespace that is gone loses nothing', async () => {
    const sel = aws(fx.allowSelector({ matchLabels: { env: 'prod' } }));
    const tighter = aws(fx.allowSelector({ matchLabels: { env: 'prod', tier: 'gold' } }));
    const { deps, calls } = fakeDeps({
      consumers: { gold: 1, silver: 4, gone: 1 },
      labels: { gold: { env: 'prod', tier: 'gold' }, silver: { env: 'prod' } },
    });
    const d = await reviewIdentity(update(tighter, sel), deps);
    assert.ok(d.allowed);
    assert.deepEqual(calls.namespaceReads.sort(), ['gold', 'gone', 'silver']);
    assert.match(d.warnings?.[0] ?? '', /no longer allows 1 namespace in use: silver \(4 consumers\); 4 consumers/);
  });

  it('a failed lookup still allows the narrowing, warning that the impact could not be computed', async () => {
    const { deps, cap } = fakeDeps({ failList: true });
    const d = await reviewIdentity(update(narrowed, old), deps);
    assert.ok(d.allowed);
    assert.match(
      d.warnings?.[0] ?? '',
      // The server's own message is never passed on (SPEC §15): code and reason only.
      /could not compute which namespaces in use lose access \(HTTP 503 ServiceUnavailable\)/,
    );
    await new Promise((r) => setImmediate(r));
    const logged = cap.entries().find((e) => e.message === 'reviewed');
    assert.equal(logged?.impactLookup, true);
    assert.deepEqual(logged?.warnings, d.warnings);
  });

  it('a lookup slower than its budget still allows, with the same warning', async () => {
    const { deps } = fakeDeps({ consumers: { 'team-b': 1 }, listDelayMs: 500, impactBudgetMs: 50 });
    const t0 = Date.now();
    const d = await reviewIdentity(update(narrowed, old), deps);
    assert.ok(Date.now() - t0 < 400, 'answered within the budget');
    assert.ok(d.allowed);
    assert.match(d.warnings?.[0] ?? '', /could not compute .*\(the lookup took longer than 50 ms\)/);
  });

  it('a secretRef change that passes the SAR warns that every mirror will be rewritten', async () => {
    const { deps, calls } = fakeDeps({});
    const moved = aws(fx.secretRef('ops', 'new-creds'), fx.allowList('team-a', 'team-b'));
    const d = await reviewIdentity(update(moved, old), deps);
    assert.equal(calls.sars, 1);
    assert.equal(calls.lists, 0, 'allowedNamespaces unchanged: no impact lookup');
    assert.ok(d.allowed);
    assert.deepEqual(d.warnings, [
      'identity "aws": spec.secretRef changed; every mirror will be rewritten from ops/new-creds',
    ]);
  });

  it('a ratcheted update makes no API call at all', async () => {
    const { deps, calls } = fakeDeps({});
    const d = await reviewIdentity(update(aws(invalid(), fx.labels({ a: 'b' })), aws(invalid())), deps);
    assert.ok(d.allowed && !d.warnings);
    assert.deepEqual(calls, { lists: 0, namespaceReads: [], sars: 0 });
  });
});
