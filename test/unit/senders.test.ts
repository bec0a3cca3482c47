/**
 * The pure decisions of sender identity (SPEC §12, functions/lib/senders.ts): the setting read
 * from the environment (fail closed: `oidc` unless said otherwise, and then complete), subject
 * matching as Knative's EventPolicy does it, refusals that name nothing, the OIDC
 * ServiceAccount names Knative gives Triggers, how long a verified token is reused, and the
 * senders EventPolicies add.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  eventAuthFromEnv,
  isSender,
  oidcServiceAccountName,
  policySenders,
  refusal,
  targetOfAudience,
  type EventPolicyLike,
  MAX_EVENT_AUTH_CACHE_SECONDS,
} from '../../functions/lib/senders.ts';
import { mayBeFor, reuseFor } from '../../functions/lib/token-review.ts';

const SA = 'system:serviceaccount:captf-system:captf-mirror-sync-ref-add-oidc-eventing.knative.dev-trigger';
const complete = {
  CAPTF_EVENT_AUDIENCE: 'serving.knative.dev/service/captf-system/captf-mirror-sync',
  CAPTF_EVENT_SENDERS: SA,
};

describe('eventAuthFromEnv: fail closed', () => {
  it('is oidc when nothing is said, and then needs an audience and senders', () => {
    assert.throws(() => eventAuthFromEnv({}), /CAPTF_EVENT_AUDIENCE/);
    assert.throws(() => eventAuthFromEnv({ CAPTF_EVENT_AUDIENCE: 'a' }), /CAPTF_EVENT_SENDERS/);
    assert.throws(
      () => eventAuthFromEnv({ CAPTF_EVENT_AUDIENCE: 'a', CAPTF_EVENT_SENDERS: ' , ' }),
      /CAPTF_EVENT_SENDERS/,
    );
    assert.deepEqual(eventAuthFromEnv(complete), {
      mode: 'oidc',
      audience: complete.CAPTF_EVENT_AUDIENCE,
      senders: [SA],
      cacheTtlMs: 60_000,
    });
  });

  it('off only when said, in those words', () => {
    assert.deepEqual(eventAuthFromEnv({ CAPTF_EVENT_AUTH: 'off' }), { mode: 'off' });
    for (const v of ['false', 'OFF', 'none', 'disabled'])
      assert.throws(() => eventAuthFromEnv({ ...complete, CAPTF_EVENT_AUTH: v }), /must be oidc or off/);
  });

  it('refuses senders that would let anyone in, and malformed ones', () => {
    for (const bad of ['*', 'system:serviceaccount:ns:a b', 'a*b', 'sa,*'])
      assert.throws(() => eventAuthFromEnv({ ...complete, CAPTF_EVENT_SENDERS: bad }), /CAPTF_EVENT_SENDERS/, bad);
    assert.throws(() => eventAuthFromEnv({ ...complete, CAPTF_EVENT_AUDIENCE: 'a b' }), /CAPTF_EVENT_AUDIENCE/);
  });

  it('reads the cache time in whole seconds within bounds', () => {
    const ttl = (v: string) => {
      const c = eventAuthFromEnv({ ...complete, CAPTF_EVENT_AUTH_CACHE_SECONDS: v });
      return c.mode === 'oidc' ? c.cacheTtlMs : -1;
    };
    assert.equal(ttl('0'), 0);
    assert.equal(ttl(String(MAX_EVENT_AUTH_CACHE_SECONDS)), MAX_EVENT_AUTH_CACHE_SECONDS * 1000);
    for (const bad of ['-1', '1.5', String(MAX_EVENT_AUTH_CACHE_SECONDS + 1), 'x'])
      assert.throws(() => ttl(bad), /CAPTF_EVENT_AUTH_CACHE_SECONDS/, bad);
  });
});

describe("isSender: Knative's subject matching", () => {
  const cases: [string, string[], boolean][] = [
    [SA, [SA], true],
    [`${SA}x`, [SA], false],
    [SA.slice(0, -1), [SA], false],
    ['system:serviceaccount:captf-system:anything', ['system:serviceaccount:captf-system:*'], true],
    ['system:serviceaccount:captf-system-evil:x', ['system:serviceaccount:captf-system:*'], false],
    ['system:serviceaccount:other:x', ['a', 'system:serviceaccount:other:x'], true],
    ['', [SA], false],
  ];
  for (const [subject, senders, want] of cases)
    it(`${subject || '(empty)'} in [${senders.join(', ')}]: ${want}`, () =>
      assert.equal(isSender(subject, senders), want));
});

describe('refusal: says what is missing, names nothing', () => {
  it('401 with a challenge for a missing or invalid token, 403 for a subject that is no sender', () => {
    assert.equal(refusal('no-token').status, 401);
    assert.equal(refusal('no-token').challenge, 'Bearer');
    assert.equal(refusal('invalid-token').challenge, 'Bearer error="invalid_token"');
    assert.equal(refusal('not-a-sender').status, 403);
    assert.equal(refusal('not-a-sender').challenge, undefined);
    // The bodies are constants: no subject, audience, object or outcome can reach them.
    assert.equal(refusal('no-token').body.error, refusal('invalid-token').body.error);
  });
});

describe("oidcServiceAccountName: the names Knative gives a Trigger's OIDC ServiceAccount", () => {
  // Computed by knative/pkg kmeta.ChildName (v0.0.0-20260531000007-52dbd5ece63f) with the suffix
  // knative/eventing pkg/auth/serviceaccount.go builds, lowercased.
  const known: [string, string][] = [
    ['a', 'a-oidc-eventing.knative.dev-trigger'],
    ['captf-mirror-sync-ref-add', 'captf-mirror-sync-ref-add-oidc-eventing.knative.dev-trigger'],
    ['captf-identity-status-refresh', 'captf-identity-status-refresh-oidc-eventing.knative.dev-trigger'],
    ['captf-identity-status-ref-update', 'captf-identity-status-ref-updat512474050ad4784b442a2b57c533d34a'],
    ['captf-identity-status-ref-delete', 'captf-identity-status-ref-deletc7c49e2d89a53b3ef736e509df338cd2'],
    [
      'a-very-long-trigger-name-that-goes-on-and-on-beyond-sixty-three-chars',
      'a-very-long-trigger-name-that-g2472e39aac1ecad91424376900fae49b',
    ],
  ];
  for (const [trigger, sa] of known)
    it(`${trigger} → ${sa}`, () => {
      assert.equal(oidcServiceAccountName(trigger), sa);
      assert.ok(sa.length <= 63);
    });
});

describe('reuseFor: a verified token is reused for the cache time, never past its expiry', () => {
  const jwt = (claims: object) =>
    ['{"alg":"RS256"}', JSON.stringify(claims), 'sig'].map((p) => Buffer.from(p).toString('base64url')).join('.');
  const now = 1_800_000_000_000;
  it('the cache time when the token lives longer', () =>
    assert.equal(reuseFor(jwt({ exp: now / 1000 + 3600 }), 60_000, now), 60_000));
  it('what is left of its life when that is shorter', () =>
    assert.equal(reuseFor(jwt({ exp: now / 1000 + 10 }), 60_000, now), 10_000));
  it('never, once expired', () => assert.equal(reuseFor(jwt({ exp: now / 1000 - 1 }), 60_000, now), 0));
  it('the cache time for a token without a readable exp', () => {
    assert.equal(reuseFor('opaque', 60_000, now), 60_000);
    assert.equal(reuseFor('a.!!!.c', 60_000, now), 60_000);
    assert.equal(reuseFor(jwt({ exp: 'soon' }), 60_000, now), 60_000);
  });
});

describe('mayBeFor: a token its own claims rule out costs no TokenReview', () => {
  const AUD = 'serving.knative.dev/service/captf-system/captf-mirror-sync';
  const NOW = 1_800_000_000_000;
  const jwt = (claims: object) =>
    ['{"alg":"RS256"}', JSON.stringify(claims), 'sig'].map((p) => Buffer.from(p).toString('base64url')).join('.');

  it('lets through a JWT naming the audience, alone or in a list, unexpired or without exp', () => {
    assert.equal(mayBeFor(jwt({ aud: [AUD], exp: NOW / 1000 + 60 }), AUD, NOW), true);
    assert.equal(mayBeFor(jwt({ aud: AUD }), AUD, NOW), true);
    assert.equal(mayBeFor(jwt({ aud: ['other', AUD] }), AUD, NOW), true);
  });

  it('refuses what is no JWT, names another audience or none, or expired by its own claim', () => {
    for (const token of [
      'bm90LWEtdG9rZW4',
      'a.b',
      'a.b.c.d',
      `${Buffer.from('{}').toString('base64url')}.${Buffer.from('[1]').toString('base64url')}.x`,
      jwt({ aud: ['kubernetes.default.svc'] }),
      jwt({ aud: `${AUD}x` }),
      jwt({ sub: 'system:serviceaccount:x:y' }),
      jwt({ aud: [AUD], exp: NOW / 1000 }),
    ])
      assert.equal(mayBeFor(token, AUD, NOW), false, token);
  });
});

describe('EventPolicies that let senders in (knative/eventing pkg/auth/event_policy.go)', () => {
  const target = targetOfAudience(complete.CAPTF_EVENT_AUDIENCE)!;
  const ready = [{ type: 'Ready', status: 'True' }];
  const policy = (
    name: string,
    spec: EventPolicyLike['spec'],
    from: string[],
    conditions = ready,
  ): EventPolicyLike => ({
    metadata: { name, namespace: 'captf-system' },
    spec,
    status: { from, conditions },
  });
  const ksvc = (name: string) => ({ ref: { apiVersion: 'serving.knative.dev/v1', kind: 'Service', name } });

  it('reads the target from a Knative audience, and nothing from any other', () => {
    assert.deepEqual(target, {
      group: 'serving.knative.dev',
      kind: 'service',
      namespace: 'captf-system',
      name: 'captf-mirror-sync',
    });
    for (const a of ['mt-broker-filter', 'a/b/c', 'a/b/c/d/e', 'a//c/d'])
      assert.equal(targetOfAudience(a), undefined, a);
  });

  it('takes status.from of Ready policies that name the Service (case aside) or target the whole namespace', () => {
    const got = policySenders(
      [
        policy('named', { to: [ksvc('CAPTF-Mirror-Sync')] }, ['system:serviceaccount:t:a']),
        policy('everything', {}, ['system:serviceaccount:t:b-*']),
        policy('other-service', { to: [ksvc('captf-identity-status')] }, ['system:serviceaccount:t:c']),
        policy('other-group', { to: [{ ref: { apiVersion: 'v1', kind: 'Service', name: 'captf-mirror-sync' } }] }, [
          'system:serviceaccount:t:d',
        ]),
        policy('by-label', { to: [{ selector: { apiVersion: 'serving.knative.dev/v1', kind: 'Service' } }] }, [
          'system:serviceaccount:t:e',
        ]),
        { ...policy('elsewhere', {}, ['system:serviceaccount:t:f']), metadata: { name: 'x', namespace: 'tenant' } },
      ],
      target,
    );
    assert.deepEqual(got, { senders: ['system:serviceaccount:t:a', 'system:serviceaccount:t:b-*'], skipped: [] });
    assert.ok(isSender('system:serviceaccount:t:b-1', got.senders));
  });

  it('adds nobody for a policy not Ready yet, one with filters, or a bare `*`', () => {
    const got = policySenders(
      [
        policy('unresolved', {}, ['system:serviceaccount:t:a'], [{ type: 'Ready', status: 'False' }]),
        policy('filtered', { filters: [{ exact: { type: 'x' } }] }, ['system:serviceaccount:t:b']),
        policy('star', {}, ['*']),
      ],
      target,
    );
    assert.deepEqual(got, {
      senders: [],
      skipped: [
        { name: 'unresolved', why: 'not-ready' },
        { name: 'filtered', why: 'has-filters' },
      ],
    });
  });
});
