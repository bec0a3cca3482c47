import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { validateIdentitySpec } from '../../functions/lib/identity-spec.ts';
import {
  DELETE_NAMESPACES_SHOWN,
  deleteDecision,
  planReview,
  secretAccessDecision,
  secretAccessReview,
  statusNamespacesOf,
  type IdentityRequest,
} from '../../functions/admission/decide.ts';
import type { TerraformClusterIdentity } from '../../functions/lib/api.ts';
import { identityRequest } from '../helpers/admission.ts';
import * as fx from '../helpers/fixtures.ts';

/** The identity `aws` on `captf-system/creds`. */
const aws = (...mods: fx.Modifier<TerraformClusterIdentity>[]) => fx.identity('aws', ...mods);
const req = identityRequest;

describe('validateIdentitySpec (SPEC §1, §2)', () => {
  const rows: [string, fx.Modifier<TerraformClusterIdentity>[], RegExp | null][] = [
    ['minimal valid spec', [], null],
    ['with list and selector', [fx.allowedNamespaces({ list: ['a'], selector: { matchLabels: { x: 'y' } } })], null],
    ['allowedNamespaces null', [fx.allowedNamespaces(null)], null],
    ['spec missing', [fx.identitySpec(undefined)], /^spec: must be an object/],
    ['secretRef missing', [fx.identitySpec({})], /spec\.secretRef: required/],
    [
      'secretRef.name missing',
      [fx.identitySpec({ secretRef: { namespace: 'ns' } })],
      /spec\.secretRef\.name: required/,
    ],
    [
      'secretRef.namespace missing',
      [fx.identitySpec({ secretRef: { name: 'n' } })],
      /spec\.secretRef\.namespace: required/,
    ],
    ['secretRef.name empty', [fx.secretRef('ns', '')], /spec\.secretRef\.name: required/],
    [
      'secretRef.name invalid',
      [fx.secretRef('ns', 'Bad_Name')],
      /spec\.secretRef\.name: "Bad_Name" is not a valid Secret name/,
    ],
    ['secretRef.name may have dots', [fx.secretRef('ns', 'a.b-c')], null],
    [
      'secretRef.namespace with a dot is invalid',
      [fx.secretRef('a.b', 'n')],
      /spec\.secretRef\.namespace: "a\.b" is not a valid namespace name/,
    ],
    [
      'secretRef.namespace too long',
      [fx.secretRef('x'.repeat(64), 'n')],
      /namespace: .* is not a valid namespace name/,
    ],
    ['allowedNamespaces {} rejected', [fx.allowedNamespaces({})], /\{\} is ambiguous/],
    [
      'unknown operator named',
      [fx.allowSelector({ matchExpressions: [{ key: 'k', operator: 'Near', values: ['v'] }] })],
      /matchExpressions\[0\]\.operator: "Near" is not a valid operator/,
    ],
    [
      'In without values',
      [fx.allowSelector({ matchExpressions: [{ key: 'k', operator: 'In' }] })],
      /matchExpressions\[0\]\.values: must be non-empty when operator is In/,
    ],
    [
      'Exists with values',
      [fx.allowSelector({ matchExpressions: [{ key: 'k', operator: 'Exists', values: ['v'] }] })],
      /values: must be empty when operator is Exists/,
    ],
    ['bad label key', [fx.allowSelector({ matchLabels: { 'bad key': 'v' } })], /matchLabels: key "bad key"/],
    [
      'bad label value',
      [fx.allowSelector({ matchLabels: { k: 'bad value!' } })],
      /matchLabels\["k"\]: value "bad value!"/,
    ],
    ['bad list entry', [fx.allowList('Team_A')], /list\[0\]: "Team_A" is not a valid namespace name/],
  ];
  for (const [name, mods, expected] of rows) {
    it(name, () => {
      const errors = validateIdentitySpec(aws(...mods).spec);
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
  /** `allowedNamespaces` of `list` and a selector of `matchLabels`. */
  const listAndLabels = (list: string[], matchLabels: Record<string, string>) =>
    fx.allowedNamespaces({ list, selector: { matchLabels } });
  const prod = { env: 'prod' };
  const base = aws(listAndLabels(['a', 'b'], prod));
  const rows: [string, IdentityRequest, 'allow' | 'deny' | 'check-secret-access' | 'check-in-use'][] = [
    ['CREATE valid', req('CREATE', base), 'check-secret-access'],
    [
      'CREATE dry run is reviewed the same way',
      req('CREATE', base, undefined, { dryRun: true }),
      'check-secret-access',
    ],
    ['CREATE invalid spec', req('CREATE', aws(fx.identitySpec({ secretRef: { name: 'x' } }))), 'deny'],
    ['CREATE with {}', req('CREATE', aws(fx.allowedNamespaces({}))), 'deny'],
    [
      'UPDATE secretRef.name changed',
      req('UPDATE', aws(listAndLabels(['a', 'b'], prod), fx.secretRef('captf-system', 'other')), base),
      'check-secret-access',
    ],
    [
      'UPDATE secretRef.namespace changed',
      req('UPDATE', aws(listAndLabels(['a', 'b'], prod), fx.secretRef('ops', 'creds')), base),
      'check-secret-access',
    ],
    ['UPDATE list gains a name', req('UPDATE', aws(listAndLabels(['a', 'b', 'c'], prod)), base), 'check-secret-access'],
    ['UPDATE list loses a name', req('UPDATE', aws(listAndLabels(['a'], prod)), base), 'allow'],
    [
      'UPDATE selector gains a requirement',
      req('UPDATE', aws(listAndLabels(['a', 'b'], { env: 'prod', t: 'x' })), base),
      'allow',
    ],
    [
      'UPDATE selector loses a requirement',
      req('UPDATE', aws(fx.allowedNamespaces({ list: ['a', 'b'], selector: {} })), base),
      'check-secret-access',
    ],
    [
      'UPDATE metadata only',
      req('UPDATE', aws(listAndLabels(['a', 'b'], prod), fx.labels({ team: 'x' })), base),
      'allow',
    ],
    ['UPDATE to an invalid spec', req('UPDATE', aws(fx.allowedNamespaces({})), base), 'deny'],
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
    const plan = planReview(req('UPDATE', aws(listAndLabels(['a', 'b'], prod), fx.secretRef('ops', 'new')), base));
    assert.equal(plan.action, 'check-secret-access');
    if (plan.action === 'check-secret-access') {
      assert.deepEqual(plan.secret, { namespace: 'ops', name: 'new' });
      assert.match(plan.rule, /changing spec\.secretRef/);
    }
  });

  it('names the widening in the rule', () => {
    const plan = planReview(req('UPDATE', aws(listAndLabels(['a', 'b', 'zz'], prod)), base));
    assert.ok(
      plan.action === 'check-secret-access' && /widening spec\.allowedNamespaces \(list gains zz\)/.test(plan.rule),
    );
  });

  it('an invalid spec is denied with 422 naming the bad part', () => {
    const plan = planReview(
      req('CREATE', aws(fx.allowSelector({ matchExpressions: [{ key: 'k', operator: 'Near' }] }))),
    );
    assert.ok(plan.action === 'deny');
    if (plan.action === 'deny') {
      assert.equal(plan.decision.code, 422);
      assert.match(plan.decision.message, /TerraformClusterIdentity "aws" is invalid: .*operator: "Near"/);
    }
  });

  it('DELETE carries oldObject.status.namespaces and uses request.name', () => {
    const plan = planReview(req('DELETE', undefined, aws(fx.inUseIn('t-b', 't-a'))));
    assert.deepEqual(plan, { action: 'check-in-use', identity: 'aws', statusNamespaces: ['t-b', 't-a'] });
  });

  it('DELETE without any name is denied', () => {
    assert.equal(planReview({ uid: 'u', operation: 'DELETE', userInfo: { username: 'x' } }).action, 'deny');
  });
});

describe('planReview: the mirror prefix is reserved (SPEC §3, §10)', () => {
  const onMirror = fx.secretRef('team-a', 'captf-creds-aws-prod');
  const rows: [string, IdentityRequest, 'deny' | 'allow' | 'check-secret-access'][] = [
    ['CREATE naming a mirror', req('CREATE', aws(onMirror)), 'deny'],
    ['UPDATE that moves secretRef onto a mirror', req('UPDATE', aws(onMirror), aws()), 'deny'],
    [
      'UPDATE of an old inert identity that only narrows (ratcheting)',
      req('UPDATE', aws(onMirror, fx.allowList('a')), aws(onMirror, fx.allowList('a', 'b'))),
      'allow',
    ],
    [
      'UPDATE of an old inert identity that leaves spec alone (finalizers)',
      req('UPDATE', aws(onMirror, fx.labels({ x: 'y' })), aws(onMirror)),
      'allow',
    ],
    [
      'UPDATE moving an inert identity off the mirror (a SAR on the new Secret)',
      req('UPDATE', aws(), aws(onMirror)),
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
        /in use in 2 namespaces: t-a, t-b \(see its status\.namespaces\)/.test(d.message) &&
        /user "bob" may not delete TerraformClusterIdentity "aws"/.test(d.message),
    );
  });
  it('in use in 300 namespaces, with the longest names: the count, the first 10, "and 290 more", under 1 KiB', () => {
    const namespaces = Array.from({ length: 300 }, (_, i) => `${String(i).padStart(3, '0')}-${'n'.repeat(59)}`);
    const d = deleteDecision(
      'i'.repeat(253),
      `system:serviceaccount:${'s'.repeat(63)}:${'a'.repeat(200)}`,
      [],
      namespaces,
    );
    assert.equal(d.allowed, false);
    assert.ok(Buffer.byteLength(d.message) < 1024, `${Buffer.byteLength(d.message)} bytes`);
    assert.match(d.message, /in use in 300 namespaces: /);
    assert.ok(d.message.includes(`${namespaces.slice(0, DELETE_NAMESPACES_SHOWN).join(', ')}, and 290 more`));
    assert.match(d.message, /status\.namespaces/);
    assert.ok(!d.message.includes('i'.repeat(64)), 'the identity name is shortened');
  });
  it('a live consumer with empty status → refused', () => {
    const d = deleteDecision('aws', 'bob', [], ['t-c', 't-c']);
    assert.ok(!d.allowed && /in use in 1 namespace: t-c \(/.test(d.message));
  });
  it('both sources are merged, sorted and unique', () => {
    const d = deleteDecision('aws', 'bob', ['b'], ['a', 'b']);
    assert.ok(!d.allowed && /in use in 2 namespaces: a, b \(/.test(d.message));
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
