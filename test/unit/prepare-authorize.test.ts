/**
 * The pure decisions of prepare's caller check (SPEC §5, functions/mirror-sync/authorize.ts):
 * header parsing, the TokenReview's verdict with its audience, the SubjectAccessReview's
 * attributes, cache keys that never hold the token, refusals that do not depend on the
 * object, and 503s that carry no server text.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { TERRAFORM_CLUSTER, TERRAFORM_MACHINE } from '../../functions/lib/api.ts';
import type { Outcome } from '../../functions/lib/http.ts';
import {
  DEFAULT_PREPARE_AUDIENCE,
  accessKey,
  challenge,
  forbidden,
  prepareAccessReview,
  prepareAttributes,
  prepareAuthFromEnv,
  reviewFailed,
  unauthorizedBody,
} from '../../functions/mirror-sync/authorize.ts';
import { bearerToken, reviewedUser, tokenKey } from '../../functions/lib/token-review.ts';

const TC = TERRAFORM_CLUSTER;
/** The error text of an outcome that is not `done`. */
const errorOf = (o: Outcome): string => (o.kind === 'done' ? '' : o.error);
const AUD = DEFAULT_PREPARE_AUDIENCE;

describe('bearerToken (RFC 6750)', () => {
  const table: [string | undefined, string | undefined][] = [
    [undefined, undefined],
    ['', undefined],
    ['Bearer', undefined],
    ['Bearer ', undefined],
    ['Basic dXNlcjpwYXNz', undefined],
    ['Bearer a b', undefined],
    ['Bearer a,b', undefined],
    ['Bearer "abc"', undefined],
    ['Bearerabc', undefined],
    ['Bearer abc', 'abc'],
    ['bearer abc', 'abc'],
    ['BEARER   eyJh.eyJz.c2ln', 'eyJh.eyJz.c2ln'],
    ['Bearer a-._~+/b==', 'a-._~+/b=='],
    ['Bearer ab=c', undefined],
  ];
  for (const [header, want] of table)
    it(`${JSON.stringify(header)} → ${JSON.stringify(want)}`, () => assert.equal(bearerToken(header), want));
});

describe('reviewedUser: authenticated for our audience, or nobody', () => {
  const user = { username: 'system:serviceaccount:p:m', uid: 'u-1', groups: ['g'], extra: { k: ['v'] } };
  it('a token authenticated for our audience gives its user, every field kept', () => {
    assert.deepEqual(reviewedUser({ authenticated: true, audiences: [AUD], user }, AUD), user);
  });
  it("refuses one whose audiences lack ours (the API server's own audience), none, or not authenticated", () => {
    assert.equal(
      reviewedUser({ authenticated: true, audiences: ['https://kubernetes.default.svc'], user }, AUD),
      undefined,
    );
    assert.equal(reviewedUser({ authenticated: true, user }, AUD), undefined);
    assert.equal(reviewedUser({ authenticated: false, audiences: [AUD], user }, AUD), undefined);
    assert.equal(reviewedUser({ authenticated: true, audiences: [AUD], user: { username: '' } }, AUD), undefined);
    assert.equal(reviewedUser(undefined, AUD), undefined);
  });
  it('absent optional fields stay absent', () => {
    assert.deepEqual(reviewedUser({ authenticated: true, audiences: [AUD], user: { username: 'u' } }, AUD), {
      username: 'u',
    });
  });
});

describe('the SubjectAccessReview', () => {
  it('asks create on <plural>/prepare in the object namespace, for its name, as the reviewed user', () => {
    const attrs = prepareAttributes(TC, { namespace: 'team-a', name: 'prod' });
    assert.deepEqual(prepareAccessReview({ username: 'm', uid: 'u', groups: ['g'], extra: { k: ['v'] } }, attrs), {
      apiVersion: 'authorization.k8s.io/v1',
      kind: 'SubjectAccessReview',
      spec: {
        user: 'm',
        uid: 'u',
        groups: ['g'],
        extra: { k: ['v'] },
        resourceAttributes: {
          verb: 'create',
          group: TC.group,
          resource: TC.plural,
          subresource: 'prepare',
          namespace: 'team-a',
          name: 'prod',
        },
      },
    });
  });
});

describe('cache keys', () => {
  const token = 'eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXBheWxvYWQ.c2ln';
  it('are SHA-256 hex, never contain the token, and differ per token and per attribute', () => {
    const t = tokenKey(token);
    assert.match(t, /^tr:[0-9a-f]{64}$/);
    assert.ok(!t.includes(token));
    assert.notEqual(t, tokenKey(`${token}x`));
    const a = accessKey(t, prepareAttributes(TC, { namespace: 'n', name: 'a' }));
    assert.match(a, /^sar:[0-9a-f]{64}$/);
    assert.notEqual(a, accessKey(t, prepareAttributes(TC, { namespace: 'n', name: 'b' })));
    assert.notEqual(a, accessKey(t, prepareAttributes(TC, { namespace: 'm', name: 'a' })));
    assert.notEqual(a, accessKey(tokenKey('other'), prepareAttributes(TC, { namespace: 'n', name: 'a' })));
    assert.notEqual(a, accessKey(t, prepareAttributes(TERRAFORM_MACHINE, { namespace: 'n', name: 'a' })));
  });
});

describe('refusals say nothing about the object', () => {
  it('the 403 is the same for any name in a namespace, and names neither user nor server reason', () => {
    const a = forbidden(prepareAttributes(TC, { namespace: 'team-a', name: 'exists' }));
    const b = forbidden(prepareAttributes(TC, { namespace: 'team-a', name: 'does-not' }));
    assert.deepEqual(a, b);
    assert.deepEqual(a, {
      kind: 'forbidden',
      reason: 'Forbidden',
      error:
        'the caller may not create terraformclusters/prepare (infrastructure.cluster.x-k8s.io) in namespace team-a',
    });
    assert.match(forbidden(prepareAttributes(TC, { namespace: '', name: 'x' })).kind, /forbidden/);
  });
  it('401 bodies and challenges depend on the header shape and the audience only', () => {
    assert.equal(unauthorizedBody('no-token', AUD).reason, 'Unauthorized');
    assert.match(unauthorizedBody('invalid-token', AUD).error, /not valid for audience captf-mirror-sync/);
    assert.equal(challenge('no-token', AUD), 'Bearer realm="captf-mirror-sync"');
    assert.equal(challenge('invalid-token', AUD), 'Bearer realm="captf-mirror-sync", error="invalid_token"');
  });
});

describe('reviewFailed: 503 with no server text', () => {
  it('names the HTTP status of an API error, never its message', () => {
    const err = { code: 500, body: { message: 'SERVER-SAYS-SECRET' }, message: 'HTTP-CODE: 500 SERVER-SAYS-SECRET' };
    const o = reviewFailed('TokenReview', err);
    assert.equal(o.kind, 'retry');
    assert.equal(o.reason, 'AuthorizationUnavailable');
    assert.ok(!errorOf(o).includes('SECRET'));
    assert.match(errorOf(o), /TokenReview failed \(HTTP 500\)/);
  });
  it('names a transport code found on the error or its causes', () => {
    const err = Object.assign(new TypeError('fetch failed: SECRET'), { cause: { code: 'ECONNREFUSED' } });
    const o = errorOf(reviewFailed('SubjectAccessReview', err));
    assert.match(o, /SubjectAccessReview failed \(transport error: ECONNREFUSED\)/);
    assert.ok(!o.includes('SECRET'));
  });
});

describe('prepareAuthFromEnv', () => {
  it('defaults to the audience captf-mirror-sync and a 10 s cache', () => {
    assert.deepEqual(prepareAuthFromEnv({}), { audience: 'captf-mirror-sync', cacheTtlMs: 10_000 });
  });
  it('takes a URL audience and 0–10 s', () => {
    assert.deepEqual(
      prepareAuthFromEnv({
        CAPTF_PREPARE_AUDIENCE: 'https://captf.example/prepare',
        CAPTF_PREPARE_AUTH_CACHE_SECONDS: '0',
      }),
      { audience: 'https://captf.example/prepare', cacheTtlMs: 0 },
    );
  });
  it('refuses a bad audience or a cache over 10 s, naming the variable', () => {
    assert.throws(() => prepareAuthFromEnv({ CAPTF_PREPARE_AUDIENCE: 'a b' }), /CAPTF_PREPARE_AUDIENCE/);
    assert.throws(() => prepareAuthFromEnv({ CAPTF_PREPARE_AUDIENCE: 'a"b' }), /CAPTF_PREPARE_AUDIENCE/);
    assert.throws(
      () => prepareAuthFromEnv({ CAPTF_PREPARE_AUTH_CACHE_SECONDS: '11' }),
      /CAPTF_PREPARE_AUTH_CACHE_SECONDS/,
    );
    assert.throws(
      () => prepareAuthFromEnv({ CAPTF_PREPARE_AUTH_CACHE_SECONDS: '1.5' }),
      /CAPTF_PREPARE_AUTH_CACHE_SECONDS/,
    );
  });
});
