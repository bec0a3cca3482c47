import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { admissionConfigFromEnv } from '../../functions/admission/index.ts';
import { parseReview, reviewResponse } from '../../functions/admission/admission-review.ts';
import { admissionReview, identityRequest } from '../helpers/admission.ts';
import * as fx from '../helpers/fixtures.ts';

/** An AdmissionReview's JSON, with `over` replacing its top-level fields. */
const review = (request: unknown, over: Record<string, unknown> = {}) =>
  JSON.stringify({ ...admissionReview(request), ...over });
const good = identityRequest('CREATE', fx.identity('aws'), undefined, {
  uid: 'abc',
  userInfo: { username: 'alice', uid: 'u1', groups: ['g'], extra: { scopes: ['a', 'b'] } },
  dryRun: true,
});

describe('parseReview: malformed reviews get a 400 or a denial echoing the uid', () => {
  const rows: [string, unknown, 400 | 'deny', RegExp][] = [
    ['empty body', '', 400, /empty/],
    ['not JSON', '{nope', 400, /not JSON/],
    ['a JSON array', '[]', 400, /not a JSON object/],
    [
      'wrong apiVersion',
      review(good, { apiVersion: 'admission.k8s.io/v1beta1' }),
      400,
      /expected apiVersion admission\.k8s\.io\/v1 .*"admission\.k8s\.io\/v1beta1"/,
    ],
    ['wrong kind', review(good, { kind: 'Pod' }), 400, /kind AdmissionReview/],
    ['missing request', review(undefined), 400, /has no request/],
    ['missing uid', review({ ...good, uid: undefined }), 400, /no uid/],
    ['missing userInfo', review({ ...good, userInfo: undefined }), 'deny', /request\.userInfo is missing/],
    ['userInfo without username', review({ ...good, userInfo: { groups: [] } }), 'deny', /username is missing/],
    [
      'groups not strings',
      review({ ...good, userInfo: { username: 'a', groups: [1] } }),
      'deny',
      /groups must be a list of strings/,
    ],
    [
      'extra not lists',
      review({ ...good, userInfo: { username: 'a', extra: { k: 'v' } } }),
      'deny',
      /extra\["k"\] must be a list/,
    ],
    ['missing operation', review({ ...good, operation: undefined }), 'deny', /operation is missing/],
    // Only a caller other than the API server names an object so; it reaches no lookup and no message.
    [
      'a name that is no object name',
      review({ ...good, operation: 'DELETE', name: 'n'.repeat(254) }),
      'deny',
      /request\.name is not an object name/,
    ],
    ['a name in capitals', review({ ...good, name: 'AWS' }), 'deny', /request\.name is not an object name/],
  ];
  for (const [name, body, expected, message] of rows) {
    it(name, () => {
      const p = parseReview(body);
      assert.equal(p.ok, false);
      if (expected === 400) {
        assert.ok(!p.ok && 'httpStatus' in p);
        if (!p.ok && 'httpStatus' in p) assert.match(p.error, message);
      } else {
        assert.ok(!p.ok && 'uid' in p);
        if (!p.ok && 'uid' in p) {
          assert.equal(p.uid, 'abc');
          assert.equal(p.decision.allowed, false);
          assert.match(p.decision.message, message);
        }
      }
    });
  }

  it('never quotes the body in an error', () => {
    const p = parseReview('{"secret":"SENTINEL-xyz"');
    assert.ok(!p.ok && 'httpStatus' in p && !p.error.includes('SENTINEL'));
  });

  it('reads a good review: user, groups, uid, extra, dryRun', () => {
    const p = parseReview(review(good));
    assert.ok(p.ok);
    if (p.ok) {
      assert.deepEqual(p.request.userInfo, {
        username: 'alice',
        uid: 'u1',
        groups: ['g'],
        extra: { scopes: ['a', 'b'] },
      });
      assert.equal(p.request.dryRun, true);
      assert.equal(p.request.operation, 'CREATE');
      assert.equal(p.request.name, 'aws');
    }
  });
});

describe('reviewResponse', () => {
  it('echoes the uid and carries the status of a denial', () => {
    assert.deepEqual(reviewResponse('x', { allowed: false, code: 403, reason: 'Forbidden', message: 'm' }), {
      apiVersion: 'admission.k8s.io/v1',
      kind: 'AdmissionReview',
      response: { uid: 'x', allowed: false, status: { code: 403, reason: 'Forbidden', message: 'm' } },
    });
    assert.deepEqual(reviewResponse('y', { allowed: true, why: 'ok' }).response, { uid: 'y', allowed: true });
  });
});

describe('admissionConfigFromEnv', () => {
  it('defaults to cert-manager file names and HTTPS, callers unchecked', () => {
    assert.deepEqual(admissionConfigFromEnv({}), {
      plainHttp: false,
      certFile: '/var/run/captf/tls/tls.crt',
      keyFile: '/var/run/captf/tls/tls.key',
      reloadMs: 10_000,
      caFile: undefined,
      clientNames: [],
    });
  });
  it('reads the flag and paths', () => {
    const c = admissionConfigFromEnv({
      CAPTF_ADMISSION_PLAIN_HTTP: 'true',
      CAPTF_TLS_CERT_FILE: '/c',
      CAPTF_TLS_KEY_FILE: '/k',
      CAPTF_TLS_RELOAD_MS: '200',
    });
    assert.deepEqual(c, {
      plainHttp: true,
      certFile: '/c',
      keyFile: '/k',
      reloadMs: 200,
      caFile: undefined,
      clientNames: [],
    });
  });
  it('rejects bad values by name', () => {
    assert.throws(() => admissionConfigFromEnv({ CAPTF_ADMISSION_PLAIN_HTTP: 'yes' }), /CAPTF_ADMISSION_PLAIN_HTTP/);
    assert.throws(() => admissionConfigFromEnv({ CAPTF_TLS_RELOAD_MS: 'soon' }), /CAPTF_TLS_RELOAD_MS/);
  });
});

describe('userInfo.extra keeps every key', () => {
  it('a key named __proto__ stays a key of extra, so it reaches the SubjectAccessReview', () => {
    const body = `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","userInfo":{"username":"a","extra":{"__proto__":["x"],"scope":["y"]}}}}`;
    const r = parseReview(body);
    assert.ok(r.ok);
    assert.deepEqual(Object.keys(r.request.userInfo.extra ?? {}).sort(), ['__proto__', 'scope']);
  });
});
