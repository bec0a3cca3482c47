import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  isDns1123Label,
  isNamespaceAllowed,
  labelKeyError,
  labelSelectorMatches,
  quote,
  validateAllowedNamespaces,
  validateLabelSelector,
} from '../../functions/lib/allowed-namespaces.ts';
import type { AllowedNamespaces } from '../../functions/lib/api.ts';
import * as fx from '../helpers/fixtures.ts';

const ns = (name: string, labels: Record<string, string> = {}) => ({ name, labels });
const tenant = ns('team-a', { 'captf.io/tenant': 'true', env: 'prod' });
const other = ns('team-b', { env: 'dev' });
const bare = ns('plain');

describe('isNamespaceAllowed: every row of SPEC §2', () => {
  const rows: [
    string,
    AllowedNamespaces | null | undefined,
    { name: string; labels: Record<string, string> },
    boolean,
  ][] = [
    ['absent allows none', undefined, tenant, false],
    ['null allows none', null, tenant, false],
    ['{} is rejected, so allows none', {}, tenant, false],
    ['list names the namespace', { list: ['team-a', 'team-b'] }, tenant, true],
    ['list does not name it', { list: ['team-b'] }, tenant, false],
    ['list: [] allows none', { list: [] }, tenant, false],
    ['selector {} allows every namespace', { selector: {} }, bare, true],
    ['matchLabels {} is the same as {}', { selector: { matchLabels: {} } }, bare, true],
    ['matchExpressions [] is the same as {}', { selector: { matchExpressions: [] } }, bare, true],
    ['both empty is the same as {}', { selector: { matchLabels: {}, matchExpressions: [] } }, bare, true],
    ['matchLabels matches', { selector: { matchLabels: { 'captf.io/tenant': 'true' } } }, tenant, true],
    ['matchLabels wrong value', { selector: { matchLabels: { env: 'prod' } } }, other, false],
    ['matchLabels missing key', { selector: { matchLabels: { env: 'prod' } } }, bare, false],
    [
      'In matches',
      { selector: { matchExpressions: [{ key: 'env', operator: 'In', values: ['prod', 'stage'] }] } },
      tenant,
      true,
    ],
    [
      'In: key absent',
      { selector: { matchExpressions: [{ key: 'env', operator: 'In', values: ['prod'] }] } },
      bare,
      false,
    ],
    [
      'NotIn excludes',
      { selector: { matchExpressions: [{ key: 'env', operator: 'NotIn', values: ['prod'] }] } },
      tenant,
      false,
    ],
    [
      'NotIn matches an absent key',
      { selector: { matchExpressions: [{ key: 'env', operator: 'NotIn', values: ['prod'] }] } },
      bare,
      true,
    ],
    ['Exists', { selector: { matchExpressions: [{ key: 'env', operator: 'Exists' }] } }, other, true],
    ['Exists: absent', { selector: { matchExpressions: [{ key: 'env', operator: 'Exists' }] } }, bare, false],
    ['DoesNotExist', { selector: { matchExpressions: [{ key: 'env', operator: 'DoesNotExist' }] } }, bare, true],
    [
      'DoesNotExist: present',
      { selector: { matchExpressions: [{ key: 'env', operator: 'DoesNotExist' }] } },
      other,
      false,
    ],
    [
      'matchLabels AND matchExpressions',
      {
        selector: { matchLabels: { env: 'prod' }, matchExpressions: [{ key: 'captf.io/tenant', operator: 'Exists' }] },
      },
      tenant,
      true,
    ],
    [
      'AND fails on one part',
      { selector: { matchLabels: { env: 'dev' }, matchExpressions: [{ key: 'captf.io/tenant', operator: 'Exists' }] } },
      tenant,
      false,
    ],
    ['union: named in list only', { list: ['plain'], selector: { matchLabels: { env: 'prod' } } }, bare, true],
    ['union: matched by selector only', { list: ['x'], selector: { matchLabels: { env: 'prod' } } }, tenant, true],
    ['union: neither', { list: ['x'], selector: { matchLabels: { env: 'prod' } } }, other, false],
    [
      'invalid operator fails closed',
      { selector: { matchExpressions: [{ key: 'env', operator: 'Equals', values: ['dev'] }] } },
      other,
      false,
    ],
    [
      'In without values fails closed',
      { selector: { matchExpressions: [{ key: 'env', operator: 'NotIn', values: [] }] } },
      bare,
      false,
    ],
    ['empty namespace name is never allowed, even by selector {}', { selector: {} }, ns(''), false],
    ['empty namespace name is never allowed by a list', { list: [''] }, ns(''), false],
  ];
  for (const [name, allowed, namespace, expected] of rows) {
    it(name, () => assert.equal(isNamespaceAllowed(allowed, namespace), expected));
  }
});

describe('validateAllowedNamespaces', () => {
  it('accepts absent, null and every valid form', () => {
    for (const v of fx.VALID_ALLOWED_NAMESPACES) {
      assert.deepEqual(validateAllowedNamespaces(v), [], JSON.stringify(v));
    }
  });
  it('rejects {} as ambiguous with an actionable message', () => {
    const [msg, ...rest] = validateAllowedNamespaces({});
    assert.equal(rest.length, 0);
    assert.match(msg!, /spec\.allowedNamespaces: \{\} is ambiguous/);
    assert.match(msg!, /selector \(\{\} for every namespace\)/);
  });
  it('rejects {list: null, selector: null} like {}', () => {
    assert.equal(validateAllowedNamespaces({ list: null, selector: null }).length, 1);
  });
  it('names the bad list entry', () => {
    assert.deepEqual(validateAllowedNamespaces({ list: ['ok', 'Bad_Name'] }), [
      'spec.allowedNamespaces.list[1]: "Bad_Name" is not a valid namespace name',
    ]);
  });
  it('rejects unknown fields and wrong shapes', () => {
    assert.match(validateAllowedNamespaces({ lst: ['a'] }).join(), /lst: unknown field/);
    assert.match(validateAllowedNamespaces('team-a').join(), /must be an object/);
    assert.match(validateAllowedNamespaces({ list: 'team-a' }).join(), /list: must be a list/);
  });
});

describe('validateLabelSelector names the bad part', () => {
  const p = 'spec.allowedNamespaces.selector';
  const cases: [string, unknown, RegExp][] = [
    [
      'unknown operator',
      { matchExpressions: [{ key: 'a', operator: 'Equals', values: ['x'] }] },
      /matchExpressions\[0\]\.operator: "Equals" is not a valid operator \(use In, NotIn, Exists, DoesNotExist\)/,
    ],
    [
      'lower-case operator',
      { matchExpressions: [{ key: 'a', operator: 'in', values: ['x'] }] },
      /operator: "in" is not a valid operator/,
    ],
    ['missing operator', { matchExpressions: [{ key: 'a' }] }, /operator: null is not a valid operator/],
    [
      'In without values',
      { matchExpressions: [{ key: 'a', operator: 'In' }] },
      /matchExpressions\[0\]\.values: must be non-empty when operator is In/,
    ],
    [
      'NotIn with []',
      { matchExpressions: [{ key: 'a', operator: 'NotIn', values: [] }] },
      /values: must be non-empty when operator is NotIn/,
    ],
    [
      'Exists with values',
      { matchExpressions: [{ key: 'a', operator: 'Exists', values: ['x'] }] },
      /values: must be empty when operator is Exists/,
    ],
    [
      'DoesNotExist with values',
      { matchExpressions: [{ key: 'a', operator: 'DoesNotExist', values: ['x'] }] },
      /must be empty when operator is DoesNotExist/,
    ],
    ['bad key in matchLabels', { matchLabels: { 'bad key': 'v' } }, /matchLabels: key "bad key" name part/],
    ['bad prefix', { matchLabels: { 'UPPER.io/x': 'v' } }, /prefix must be a DNS-1123 subdomain/],
    ['bad value in matchLabels', { matchLabels: { k: '-v' } }, /matchLabels\["k"\]: value "-v"/],
    ['value too long', { matchLabels: { k: 'v'.repeat(64) } }, /at most 63 characters/],
    [
      'bad key in expression',
      { matchExpressions: [{ key: '', operator: 'Exists' }] },
      /matchExpressions\[0\]\.key: "" must be a non-empty string/,
    ],
    [
      'bad value in expression',
      { matchExpressions: [{ key: 'k', operator: 'In', values: ['ok', 'not ok'] }] },
      /matchExpressions\[0\]\.values\[1\]: "not ok"/,
    ],
    ['unknown selector field', { matchLabel: { k: 'v' } }, /selector\.matchLabel: unknown field/],
    ['matchExpressions not a list', { matchExpressions: { key: 'k' } }, /matchExpressions: must be a list/],
  ];
  for (const [name, sel, re] of cases) {
    it(name, () => {
      const errs = validateLabelSelector(sel, p);
      assert.ok(errs.length > 0, 'expected an error');
      assert.match(errs.join('\n'), re);
      assert.ok(
        errs.every((e) => e.startsWith(p)),
        'every message names the field path',
      );
    });
  }
  it('accepts the empty value and prefixed keys', () => {
    assert.deepEqual(validateLabelSelector({ matchLabels: { 'example.com/tier': '' } }, p), []);
    assert.equal(labelKeyError('a/b/c') !== undefined, true);
  });
  it('labelSelectorMatches an empty selector against no labels', () => {
    assert.ok(labelSelectorMatches({}, undefined));
  });
  it('namespace names follow DNS-1123 labels', () => {
    assert.ok(isDns1123Label('team-a'));
    assert.ok(!isDns1123Label('a'.repeat(64)));
    assert.ok(!isDns1123Label('-a'));
    assert.ok(!isDns1123Label(''));
  });
});

describe('quote: messages quote bad values briefly', () => {
  it('caps a huge value at 80 characters and never throws', () => {
    assert.equal(quote('x'.repeat(1_000_000)).length, 80);
    assert.equal(quote('ok'), '"ok"');
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    assert.equal(quote(cyclic), '<object>');
    assert.ok(validateAllowedNamespaces({ list: ['A'.repeat(100_000)] })[0]!.length < 200);
  });
});
