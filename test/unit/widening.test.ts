import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isNamespaceAllowed } from '../../functions/lib/allowed-namespaces.ts';
import type { AllowedNamespaces } from '../../functions/lib/api.ts';
import { isWidening, mayRevoke } from '../../functions/lib/widening.ts';

// One representative of every SPEC §2 form; the pair table below covers forms × forms.
const FORMS: Record<string, unknown> = {
  absent: undefined,
  null: null,
  'list []': { list: [] },
  'list [a]': { list: ['a'] },
  'list [a,b]': { list: ['a', 'b'] },
  'selector {}': { selector: {} },
  'selector env=prod': { selector: { matchLabels: { env: 'prod' } } },
  'selector env=prod,tier In(x)': {
    selector: { matchLabels: { env: 'prod' }, matchExpressions: [{ key: 'tier', operator: 'In', values: ['x'] }] },
  },
  'selector env=dev': { selector: { matchLabels: { env: 'dev' } } },
  'list [a] + selector env=prod': { list: ['a'], selector: { matchLabels: { env: 'prod' } } },
  '{} (invalid)': {},
};

// Expected verdict for every ordered pair (old → new), written out so a reader can check
// each against SPEC §10. `W` = widening (SAR needed), `n` = not widening.
const F = Object.keys(FORMS);
const TABLE: Record<string, string> = {
  //                                 absent null  l[]  l[a] l[ab] s{}  s=p  s=p+ s=d  l+s  {}
  absent: ' n     n     n    W    W     W    W    W    W    W    W',
  null: ' n     n     n    W    W     W    W    W    W    W    W',
  'list []': ' n     n     n    W    W     W    W    W    W    W    W',
  'list [a]': ' n     n     n    n    W     W    W    W    W    W    W',
  'list [a,b]': ' n     n     n    n    n     W    W    W    W    W    W',
  'selector {}': ' n     n     n    W    W     n    n    n    n    W    W',
  'selector env=prod': ' n     n     n    W    W     W    n    n    W    W    W',
  'selector env=prod,tier In(x)': ' n     n     n    W    W     W    W    n    W    W    W',
  'selector env=dev': ' n     n     n    W    W     W    W    W    n    W    W',
  'list [a] + selector env=prod': ' n     n     n    n    W     W    n    n    W    n    W',
  '{} (invalid)': ' W     W     W    W    W     W    W    W    W    W    W',
};

describe('isWidening: every pair of allowedNamespaces forms (SPEC §10)', () => {
  for (const from of F) {
    const row = TABLE[from]!.trim().split(/\s+/);
    assert.equal(row.length, F.length, `row ${from} has one cell per form`);
    F.forEach((to, i) => {
      const expected = row[i] === 'W';
      it(`${from} → ${to}: ${expected ? 'widening' : 'not widening'}`, () => {
        assert.equal(isWidening(FORMS[from], FORMS[to]).widening, expected);
      });
    });
  }
});

describe('isWidening: changes within one form', () => {
  const rows: [string, unknown, unknown, boolean][] = [
    ['list gains a name', { list: ['a'] }, { list: ['a', 'c'] }, true],
    ['list loses a name', { list: ['a', 'b'] }, { list: ['b'] }, false],
    ['list reordered', { list: ['a', 'b'] }, { list: ['b', 'a'] }, false],
    ['list swaps a name', { list: ['a'] }, { list: ['b'] }, true],
    [
      'selector gains a requirement',
      { selector: { matchLabels: { env: 'prod' } } },
      { selector: { matchLabels: { env: 'prod', team: 'x' } } },
      false,
    ],
    [
      'selector gains an expression',
      { selector: { matchLabels: { env: 'prod' } } },
      { selector: { matchLabels: { env: 'prod' }, matchExpressions: [{ key: 'k', operator: 'Exists' }] } },
      false,
    ],
    [
      'selector loses a requirement',
      { selector: { matchLabels: { env: 'prod', team: 'x' } } },
      { selector: { matchLabels: { env: 'prod' } } },
      true,
    ],
    [
      'selector value changed',
      { selector: { matchLabels: { env: 'prod' } } },
      { selector: { matchLabels: { env: 'dev' } } },
      true,
    ],
    [
      'In values narrowed is still conservative widening',
      { selector: { matchExpressions: [{ key: 'env', operator: 'In', values: ['a', 'b'] }] } },
      { selector: { matchExpressions: [{ key: 'env', operator: 'In', values: ['a'] }] } },
      true,
    ],
    [
      'operator changed',
      { selector: { matchExpressions: [{ key: 'env', operator: 'Exists' }] } },
      { selector: { matchExpressions: [{ key: 'env', operator: 'DoesNotExist' }] } },
      true,
    ],
    [
      'expressions reordered',
      {
        selector: {
          matchExpressions: [
            { key: 'a', operator: 'Exists' },
            { key: 'b', operator: 'In', values: ['y', 'x'] },
          ],
        },
      },
      {
        selector: {
          matchExpressions: [
            { key: 'b', operator: 'In', values: ['x', 'y'] },
            { key: 'a', operator: 'Exists' },
          ],
        },
      },
      false,
    ],
    [
      'matchLabels rewritten as In',
      { selector: { matchLabels: { env: 'prod' } } },
      { selector: { matchExpressions: [{ key: 'env', operator: 'In', values: ['prod'] }] } },
      false,
    ],
    [
      'empty matchLabels is the same as {}',
      { selector: {} },
      { selector: { matchLabels: {}, matchExpressions: [] } },
      false,
    ],
    [
      'selector removed, list kept',
      { list: ['a'], selector: { matchLabels: { env: 'prod' } } },
      { list: ['a'] },
      false,
    ],
    ['selector {} → list', { selector: {} }, { list: ['a'] }, true],
    [
      'new name the old selector matched is still widening',
      { selector: { matchLabels: { env: 'prod' } } },
      { selector: { matchLabels: { env: 'prod' } }, list: ['prod-ns'] },
      true,
    ],
    [
      'invalid new selector',
      { list: ['a'] },
      { list: ['a'], selector: { matchExpressions: [{ key: 'k', operator: 'Near' }] } },
      true,
    ],
  ];
  for (const [name, from, to, expected] of rows) {
    it(`${name}: ${expected ? 'widening' : 'not widening'}`, () => {
      const v = isWidening(from, to);
      assert.equal(v.widening, expected);
      assert.ok(v.reason.length > 0);
    });
  }

  it('names what was added in the reason', () => {
    assert.match(isWidening({ list: ['a'] }, { list: ['a', 'z', 'c'] }).reason, /list gains c, z/);
  });
});

describe('isWidening is conservative: never "not widening" when a namespace became allowed', () => {
  // Check the verdict against the real allow decision on a set of sample namespaces: if any
  // namespace is allowed after but not before, the verdict must be widening.
  const samples: { name: string; labels: Record<string, string> }[] = [
    { name: 'a', labels: {} },
    { name: 'b', labels: { env: 'prod' } },
    { name: 'c', labels: { env: 'prod', tier: 'x' } },
    { name: 'd', labels: { env: 'dev' } },
    { name: 'prod-ns', labels: { env: 'prod' } },
  ];
  for (const from of F) {
    for (const to of F) {
      it(`${from} → ${to}`, () => {
        const gained = samples.filter(
          (n) =>
            isNamespaceAllowed(FORMS[to] as AllowedNamespaces, n) &&
            !isNamespaceAllowed(FORMS[from] as AllowedNamespaces, n),
        );
        if (gained.length > 0)
          assert.equal(
            isWidening(FORMS[from], FORMS[to]).widening,
            true,
            `gains ${gained.map((g) => g.name).join(',')}`,
          );
      });
    }
  }
});

describe('mayRevoke: can a change take access away (the webhook skips its lookup when not)', () => {
  const cases: [string, unknown, unknown, boolean][] = [
    ['a name added', { list: ['a'] }, { list: ['a', 'b'] }, false],
    ['a name removed', { list: ['a', 'b'] }, { list: ['a'] }, true],
    ['list to selector {}', { list: ['a'] }, { selector: {} }, false],
    [
      'selector loosened',
      { selector: { matchLabels: { t: 'x', e: 'p' } } },
      { selector: { matchLabels: { t: 'x' } } },
      false,
    ],
    [
      'selector tightened',
      { selector: { matchLabels: { t: 'x' } } },
      { selector: { matchLabels: { t: 'x', e: 'p' } } },
      true,
    ],
    ['selector removed', { selector: { matchLabels: { t: 'x' } } }, { list: ['a'] }, true],
    [
      'selector unchanged, name added',
      { list: ['a'], selector: { matchLabels: { t: 'x' } } },
      { list: ['a', 'b'], selector: { matchLabels: { t: 'x' } } },
      false,
    ],
    ['invalid old value', {}, { list: ['a'] }, true],
  ];
  for (const [what, before, after, expected] of cases) it(what, () => assert.equal(mayRevoke(before, after), expected));
});
