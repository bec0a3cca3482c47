import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { validateIdentitySpec } from '../../functions/lib/identity-spec.ts';
import {
  deleteDecision,
  planReview,
  secretAccessDecision,
  secretAccessReview,
  statusNamespacesOf,
  type IdentityRequest,
} from '../../functions/admission/decide.ts';

const ref = { name: 'creds', namespace: 'captf-system' };
const identity = (
  spec: Record<string, unknown>,
  status?: Record<string, unknown>,
  labels?: Record<string, string>,
) => ({
  apiVersion: 'infrastructure.cluster.x-k8s.io/v1beta2',
  kind: 'TerraformClusterIdentity',
  metadata: { name: 'aws', ...(labels ? { labels } : {}) },
  spec,
  ...(status ? { status } : {}),
});
const req = (
  operation: string,
  object?: unknown,
  oldObject?: unknown,
  extra: Partial<IdentityRequest> = {},
): IdentityRequest => ({
  uid: 'u-1',
  operation,
  name: 'aws',
  userInfo: { username: 'alice', groups: ['tenants'] },
  ...(object ? { object } : {}),
  ...(oldObject ? { oldObject } : {}),
  ...extra,
});

describe('validateIdentitySpec (SPEC §1, §2)', () => {
  const rows: [string, unknown, RegExp | null][] = [
    ['minimal valid spec', { secretRef: ref }, null],
    [
      'with list and selector',
      { secretRef: ref, allowedNamespaces: { list: ['a'], selector: { matchLabels: { x: 'y' } } } },
      null,
    ],
    ['allowedNamespaces null', { secretRef: ref, allowedNamespaces: null }, null],
    ['spec missing', undefined, /^spec: must be an object/],
    ['secretRef missing', {}, /spec\.secretRef: required/],
    ['secretRef.name missing', { secretRef: { namespace: 'ns' } }, /spec\.secretRef\.name: required/],
    ['secretRef.namespace missing', { secretRef: { name: 'n' } }, /spec\.secretRef\.namespace: required/],
    ['secretRef.name empty', { secretRef: { name: '', namespace: 'ns' } }, /spec\.secretRef\.name: required/],
    [
      'secretRef.name invalid',
      { secretRef: { name: 'Bad_Name', namespace: 'ns' } },
      /spec\.secretRef\.name: "Bad_Name" is not a valid Secret name/,
    ],
    ['secretRef.name may have dots', { secretRef: { name: 'a.b-c', namespace: 'ns' } }, null],
    [
      'secretRef.namespace with a dot is invalid',
      { secretRef: { name: 'n', namespace: 'a.b' } },
      /spec\.secretRef\.namespace: "a\.b" is not a valid namespace name/,
    ],
    [
      'secretRef.namespace too long',
      { secretRef: { name: 'n', namespace: 'x'.repeat(64) } },
      /namespace: .* is not a valid namespace name/,
    ],
    ['allowedNamespaces {} rejected', { secretRef: ref, allowedNamespaces: {} }, /\{\} is ambiguous/],
    [
      'unknown operator named',
      {
        secretRef: ref,
        allowedNamespaces: { selector: { matchExpressions: [{ key: 'k', operator: 'Near', values: ['v'] }] } },
      },
      /matchExpressions\[0\]\.operator: "Near" is not a valid operator/,
    ],
    [
      'In without values',
      { secretRef: ref, allowedNamespaces: { selector: { matchExpressions: [{ key: 'k', operator: 'In' }] } } },
      /matchExpressions\[0\]\.values: must be non-empty when operator is In/,
    ],
    [
      'Exists with values',
      {
        secretRef: ref,
        allowedNamespaces: { selector: { matchExpressions: [{ key: 'k', operator: 'Exists', values: ['v'] }] } },
      },
      /values: must be empty when operator is Exists/,
    ],
    [
      'bad label key',
      { secretRef: ref, allowedNamespaces: { selector: { matchLabels: { 'bad key': 'v' } } } },
      /matchLabels: key "bad key"/,
    ],
    [
      'bad label value',
      { secretRef: ref, allowedNamespaces: { selector: { matchLabels: { k: 'bad value!' } } } },
      /matchLabels\["k"\]: value "bad value!"/,
    ],
    [
      'bad list entry',
      { secretRef: ref, allowedNamespaces: { list: ['Team_A'] } },
      /list\[0\]: "Team_A" is not a valid namespace name/,
    ],
  ];
  for (const [name, spec, expected] of rows) {
    it(name, () => {
      const errors = validateIdentitySpec(spec);
      if (expected === null) assert.deepEqual(errors, []);
      else
        assert.ok(
          errors.some((e) => expected.test(e)),
          `${JSON.stringify(errors)} should match ${expected}`,
        );
    });
  }
});

describe('planReview: which operations need a SubjectAccessReview (SPEC §10)', () => {
  const base = identity({
    secretRef: ref,
    allowedNamespaces: { list: ['a', 'b'], selector: { matchLabels: { env: 'prod' } } },
  });
  const withSpec = (spec: Record<string, unknown>) => identity(spec);
  const rows: [string, IdentityRequest, 'allow' | 'deny' | 'check-secret-access' | 'check-in-use'][] = [
    ['CREATE valid', req('CREATE', base), 'check-secret-access'],
    [
      'CREATE dry run is reviewed the same way',
      req('CREATE', base, undefined, { dryRun: true }),
      'check-secret-access',
    ],
    ['CREATE invalid spec', req('CREATE', withSpec({ secretRef: { name: 'x' } })), 'deny'],
    ['CREATE with {}', req('CREATE', withSpec({ secretRef: ref, allowedNamespaces: {} })), 'deny'],
    [
      'UPDATE secretRef.name changed',
      req('UPDATE', withSpec({ ...base.spec, secretRef: { ...ref, name: 'other' } }), base),
      'check-secret-access',
    ],
    [
      'UPDATE secretRef.namespace changed',
      req('UPDATE', withSpec({ ...base.spec, secretRef: { ...ref, namespace: 'ops' } }), base),
      'check-secret-access',
    ],
    [
      'UPDATE list gains a name',
      req(
        'UPDATE',
        withSpec({
          secretRef: ref,
          allowedNamespaces: { list: ['a', 'b', 'c'], selector: { matchLabels: { env: 'prod' } } },
        }),
        base,
      ),
      'check-secret-access',
    ],
    [
      'UPDATE list loses a name',
      req(
        'UPDATE',
        withSpec({ secretRef: ref, allowedNamespaces: { list: ['a'], selector: { matchLabels: { env: 'prod' } } } }),
        base,
      ),
      'allow',
    ],
    [
      'UPDATE selector gains a requirement',
      req(
        'UPDATE',
        withSpec({
          secretRef: ref,
          allowedNamespaces: { list: ['a', 'b'], selector: { matchLabels: { env: 'prod', t: 'x' } } },
        }),
        base,
      ),
      'allow',
    ],
    [
      'UPDATE selector loses a requirement',
      req('UPDATE', withSpec({ secretRef: ref, allowedNamespaces: { list: ['a', 'b'], selector: {} } }), base),
      'check-secret-access',
    ],
    ['UPDATE metadata only', req('UPDATE', identity(base.spec, undefined, { team: 'x' }), base), 'allow'],
    ['UPDATE to an invalid spec', req('UPDATE', withSpec({ secretRef: ref, allowedNamespaces: {} }), base), 'deny'],
    ['UPDATE of the status subresource', req('UPDATE', base, base, { subResource: 'status' }), 'allow'],
    ['DELETE', req('DELETE', undefined, base), 'check-in-use'],
    ['CONNECT is not reviewed', req('CONNECT', base), 'deny'],
  ];
  for (const [name, r, action] of rows) {
    it(`${name} → ${action}`, () => {
      assert.equal(planReview(r).action, action);
    });
  }

  it('asks about the new Secret when secretRef changes', () => {
    const plan = planReview(
      req('UPDATE', withSpec({ ...base.spec, secretRef: { name: 'new', namespace: 'ops' } }), base),
    );
    assert.equal(plan.action, 'check-secret-access');
    if (plan.action === 'check-secret-access') {
      assert.deepEqual(plan.secret, { namespace: 'ops', name: 'new' });
      assert.match(plan.rule, /changing spec\.secretRef/);
    }
  });

  it('names the widening in the rule', () => {
    const plan = planReview(
      req(
        'UPDATE',
        withSpec({
          secretRef: ref,
          allowedNamespaces: { list: ['a', 'b', 'zz'], selector: { matchLabels: { env: 'prod' } } },
        }),
        base,
      ),
    );
    assert.ok(
      plan.action === 'check-secret-access' && /widening spec\.allowedNamespaces \(list gains zz\)/.test(plan.rule),
    );
  });

  it('an invalid spec is denied with 422 naming the bad part', () => {
    const plan = planReview(
      req(
        'CREATE',
        withSpec({
          secretRef: ref,
          allowedNamespaces: { selector: { matchExpressions: [{ key: 'k', operator: 'Near' }] } },
        }),
      ),
    );
    assert.ok(plan.action === 'deny');
    if (plan.action === 'deny') {
      assert.equal(plan.decision.code, 422);
      assert.match(plan.decision.message, /TerraformClusterIdentity "aws" is invalid: .*operator: "Near"/);
    }
  });

  it('DELETE carries oldObject.status.namespaces and uses request.name', () => {
    const plan = planReview(req('DELETE', undefined, identity({ secretRef: ref }, { namespaces: ['t-b', 't-a'] })));
    assert.deepEqual(plan, { action: 'check-in-use', identity: 'aws', statusNamespaces: ['t-b', 't-a'] });
  });

  it('DELETE without any name is denied', () => {
    assert.equal(planReview({ uid: 'u', operation: 'DELETE', userInfo: { username: 'x' } }).action, 'deny');
  });
});

describe('planReview: the mirror prefix is reserved (SPEC §3, §10)', () => {
  const mirrorRef = { name: 'captf-creds-aws-prod', namespace: 'team-a' };
  const rows: [string, IdentityRequest, 'deny' | 'allow' | 'check-secret-access'][] = [
    ['CREATE naming a mirror', req('CREATE', identity({ secretRef: mirrorRef })), 'deny'],
    [
      'UPDATE that moves secretRef onto a mirror',
      req('UPDATE', identity({ secretRef: mirrorRef }), identity({ secretRef: ref })),
      'deny',
    ],
    [
      'UPDATE of an old inert identity that only narrows (ratcheting)',
      req(
        'UPDATE',
        identity({ secretRef: mirrorRef, allowedNamespaces: { list: ['a'] } }),
        identity({ secretRef: mirrorRef, allowedNamespaces: { list: ['a', 'b'] } }),
      ),
      'allow',
    ],
    [
      'UPDATE of an old inert identity that leaves spec alone (finalizers)',
      req('UPDATE', identity({ secretRef: mirrorRef }, undefined, { x: 'y' }), identity({ secretRef: mirrorRef })),
      'allow',
    ],
    [
      'UPDATE moving an inert identity off the mirror (a SAR on the new Secret)',
      req('UPDATE', identity({ secretRef: ref }), identity({ secretRef: mirrorRef })),
      'check-secret-access',
    ],
  ];
  for (const [name, r, action] of rows) {
    it(name, () => {
      const plan = planReview(r);
      assert.equal(plan.action, action);
      if (plan.action !== 'deny') return;
      assert.equal(plan.decision.allowed, false);
      assert.match(plan.decision.message, /starts with captf-creds-, which is reserved for the mirrors/);
      assert.match(plan.decision.message, /TerraformClusterIdentity "aws-prod"'s mirror/);
    });
  }
});

describe('statusNamespacesOf', () => {
  it('reads strings only', () => {
    assert.deepEqual(statusNamespacesOf({ status: { namespaces: ['a', 3, '', 'b'] } }), ['a', 'b']);
    assert.deepEqual(statusNamespacesOf({}), []);
    assert.deepEqual(statusNamespacesOf(undefined), []);
  });
});

describe('secretAccessDecision', () => {
  const secret = { namespace: 'captf-system', name: 'creds' };
  it('allowed only when status.allowed is true', () => {
    assert.equal(secretAccessDecision('alice', secret, 'rule', { status: { allowed: true } }).allowed, true);
    assert.equal(secretAccessDecision('alice', secret, 'rule', { status: { allowed: false } }).allowed, false);
    assert.equal(secretAccessDecision('alice', secret, 'rule', { status: {} }).allowed, false);
  });
  it('a denial names the user, verb, Secret and rule', () => {
    const d = secretAccessDecision(
      'alice',
      secret,
      'creating an identity requires permission to get the Secret it names',
      { status: { allowed: false, reason: 'no RBAC policy matched' } },
    );
    assert.ok(!d.allowed);
    if (!d.allowed) {
      assert.equal(d.code, 403);
      assert.match(
        d.message,
        /user "alice" may not get Secret captf-system\/creds: creating an identity requires permission/,
      );
      assert.match(d.message, /no RBAC policy matched/);
    }
  });
  it('a SAR error denies (fail closed)', () => {
    const d = secretAccessDecision('alice', secret, 'rule', { error: 'HTTP 403 Forbidden' });
    assert.ok(!d.allowed && d.code === 500 && /SubjectAccessReview failed: HTTP 403 Forbidden/.test(d.message));
  });
});

describe('deleteDecision (SPEC §10)', () => {
  it('unused → allowed', () => assert.equal(deleteDecision('aws', 'bob', [], []).allowed, true));
  it('status namespaces → refused, listing them', () => {
    const d = deleteDecision('aws', 'bob', ['t-b', 't-a'], []);
    assert.ok(
      !d.allowed &&
        /in use in namespace\(s\) t-a, t-b/.test(d.message) &&
        /user "bob" may not delete TerraformClusterIdentity "aws"/.test(d.message),
    );
  });
  it('a live consumer with empty status → refused', () => {
    const d = deleteDecision('aws', 'bob', [], ['t-c', 't-c']);
    assert.ok(!d.allowed && /namespace\(s\) t-c;/.test(d.message));
  });
  it('both sources are merged, sorted and unique', () => {
    const d = deleteDecision('aws', 'bob', ['b'], ['a', 'b']);
    assert.ok(!d.allowed && /namespace\(s\) a, b;/.test(d.message));
  });
  it('a failed lookup denies (fail closed)', () => {
    const d = deleteDecision('aws', 'bob', [], { error: 'HTTP 403 Forbidden' });
    assert.ok(!d.allowed && d.code === 500 && /consumer lookup failed: HTTP 403/.test(d.message));
  });
});

describe('secretAccessReview: the SubjectAccessReview copies the requesting user', () => {
  const secret = { namespace: 'captf-system', name: 'creds' };
  it('copies user, groups, uid and extra, and asks for get on the named Secret', () => {
    assert.deepEqual(
      secretAccessReview(
        { username: 'alice', uid: 'u-1', groups: ['a', 'system:authenticated'], extra: { scopes: ['x', 'y'] } },
        secret,
      ),
      {
        apiVersion: 'authorization.k8s.io/v1',
        kind: 'SubjectAccessReview',
        spec: {
          user: 'alice',
          uid: 'u-1',
          groups: ['a', 'system:authenticated'],
          extra: { scopes: ['x', 'y'] },
          resourceAttributes: {
            group: '',
            version: 'v1',
            resource: 'secrets',
            verb: 'get',
            namespace: 'captf-system',
            name: 'creds',
          },
        },
      },
    );
  });
  it('leaves out what the user does not have', () => {
    assert.deepEqual(Object.keys(secretAccessReview({ username: 'bob', groups: [], extra: {} }, secret).spec), [
      'user',
      'resourceAttributes',
    ]);
  });
});
