/**
 * SPEC §15: what an API or transport error may say (functions/lib/api-errors.ts). The server's
 * own message is not kept: a proxy that echoes request headers would put the ServiceAccount
 * token into a log line and answers.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  isServiceAccountUser,
  usernameFromCredentials,
  apiStatus,
  describeError,
  isFieldPath,
  isTransportError,
  keptCauses,
  rbacForbiddenMessages,
  redactApiError,
  RedactedApiError,
  rememberRequest,
  requestAttributes,
  sentBody,
  transportCodes,
  type RequestAttributes,
} from '../../functions/lib/api-errors.ts';
import { headerEchoPage, statusBody } from '../helpers/fault-proxy.ts';

const TOKEN = 'eyJhbGciOiJSUzI1NiIsImtpZCI6IkFCQyJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6eDp5In0.c2lnbmF0dXJl';
const SENTINEL = 'SENTINEL-TOKEN-5f0c2a9e7b31d4c8';
const SERVER = 'https://10.0.0.1:6443';
const USER = 'system:serviceaccount:captf-system:captf-mirror-sync';

/** An API error as client-node throws it for a Status answer. */
const status = (code: number, fields: { reason?: string; message?: string; details?: unknown }) => ({
  code,
  body: JSON.stringify(statusBody({ status: code, ...fields })),
  headers: {},
});
/** What a request asks, as requestAttributes reads it: `fields`, the rest empty. */
const asked = (fields: Partial<RequestAttributes>): RequestAttributes => ({
  verb: '',
  group: '',
  resource: '',
  subresource: '',
  namespace: '',
  name: '',
  ...fields,
});
const createSecret = asked({
  verb: 'create',
  resource: 'secrets',
  namespace: 'team-a',
  objectName: 'captf-creds-aws',
  user: USER,
});
/** A consumer's status patch. */
const statusPatch = asked({
  verb: 'patch',
  group: 'infrastructure.cluster.x-k8s.io',
  resource: 'terraformclusters',
  subresource: 'status',
  namespace: 't',
  name: 'c1',
});
const noLeak = (text: string) => {
  for (const v of [SENTINEL, TOKEN, TOKEN.slice(0, 40)]) assert.ok(!text.includes(v), text);
};

describe('requestAttributes: what was asked, as kube-apiserver RequestInfoFactory reads a URL', () => {
  it('reads verb, group, resource, subresource, namespace and name', () => {
    assert.deepEqual(
      requestAttributes('POST', `${SERVER}/api/v1/namespaces/team-a/secrets?fieldManager=x`),
      asked({ verb: 'create', resource: 'secrets', namespace: 'team-a' }),
    );
    assert.deepEqual(
      requestAttributes(
        'PATCH',
        `${SERVER}/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/t/terraformclusters/c1/status?force=true`,
      ),
      statusPatch,
    );
    assert.equal(requestAttributes('GET', `${SERVER}/api/v1/namespaces/t/secrets/s`)?.verb, 'get');
    assert.equal(requestAttributes('GET', `${SERVER}/api/v1/secrets?labelSelector=a%3Db`)?.verb, 'list');
    assert.equal(requestAttributes('GET', `${SERVER}/api/v1/secrets?watch=true`)?.verb, 'watch');
    assert.equal(requestAttributes('PUT', `${SERVER}/api/v1/namespaces/t/secrets/s`)?.verb, 'update');
    assert.equal(requestAttributes('DELETE', `${SERVER}/api/v1/namespaces/t/secrets/s`)?.verb, 'delete');
    assert.equal(requestAttributes('DELETE', `${SERVER}/api/v1/namespaces/t/secrets`)?.verb, 'deletecollection');
  });
  it("reads a namespace's own URL as resource namespaces in that namespace", () => {
    assert.deepEqual(
      requestAttributes('GET', `${SERVER}/api/v1/namespaces/team-a`),
      asked({ verb: 'get', resource: 'namespaces', namespace: 'team-a', name: 'team-a' }),
    );
    assert.equal(requestAttributes('PUT', `${SERVER}/api/v1/namespaces/team-a/finalize`)?.subresource, 'finalize');
  });
  it('strips the base path of the server URL, and knows cluster-scoped requests', () => {
    const r = requestAttributes(
      'POST',
      'https://rancher.example/k8s/clusters/c-1/apis/authorization.k8s.io/v1/subjectaccessreviews',
      '/k8s/clusters/c-1/',
    );
    assert.deepEqual(r, asked({ verb: 'create', group: 'authorization.k8s.io', resource: 'subjectaccessreviews' }));
  });
  it('gives nothing for non-resource paths, bad URLs and parts that are not printable ASCII', () => {
    assert.equal(requestAttributes('GET', `${SERVER}/version`), undefined);
    assert.equal(requestAttributes('GET', `${SERVER}/api/v1`), undefined);
    assert.equal(requestAttributes('GET', 'not a url'), undefined);
    assert.equal(requestAttributes('GET', `${SERVER}/api/v1/namespaces/t/secrets/a%0Ab`), undefined);
    assert.equal(requestAttributes('GET', `${SERVER}/api/v1/namespaces/t/secrets/%E0%A4%A`), undefined);
    assert.equal(requestAttributes('OPTIONS', `${SERVER}/api/v1/secrets`), undefined);
  });
  it("takes a create's object name and the field names (never values) from the body it sent", () => {
    const facts = sentBody(
      JSON.stringify({ metadata: { name: 'm' }, data: { AWS_KEY: 'dmFsdWU=' }, list: [{ x: 1 }] }),
    );
    assert.equal(facts.objectName, 'm');
    assert.deepEqual([...facts.fields!].sort(), ['AWS_KEY', 'data', 'list', 'metadata', 'name', 'x']);
    assert.deepEqual(sentBody('{bad'), {});
    assert.deepEqual(sentBody(undefined), {});
  });
});

describe('rbacForbiddenMessages: the exact sentence of kube-apiserver (responsewriters.Forbidden + NewForbidden)', () => {
  it('namespaced, without a name (a create)', () => {
    assert.deepEqual(rbacForbiddenMessages(createSecret, USER), [
      `secrets is forbidden: User "${USER}" cannot create resource "secrets" in API group "" in the namespace "team-a"`,
    ]);
  });
  it('named, with group and subresource', () => {
    assert.deepEqual(rbacForbiddenMessages(statusPatch, 'u'), [
      'terraformclusters.infrastructure.cluster.x-k8s.io "c1" is forbidden: User "u" cannot patch resource ' +
        '"terraformclusters/status" in API group "infrastructure.cluster.x-k8s.io" in the namespace "t"',
    ]);
  });
  it('cluster scope, HTML-escaped as upstream, nothing for values that are not printable ASCII', () => {
    const sar = { ...createSecret, group: 'authorization.k8s.io', resource: 'subjectaccessreviews', namespace: '' };
    assert.deepEqual(rbacForbiddenMessages(sar, 'a&b'), [
      'subjectaccessreviews.authorization.k8s.io is forbidden: User "a&amp;b" cannot create resource ' +
        '"subjectaccessreviews" in API group "authorization.k8s.io" at the cluster scope',
    ]);
    assert.deepEqual(rbacForbiddenMessages(createSecret, 'ü'), []);
  });
});

describe('describeError: only what the product knows, and words Kubernetes defines', () => {
  it('quotes a 403 whose sentence is exactly the RBAC denial for our user and request', () => {
    const [sentence] = rbacForbiddenMessages(createSecret, USER);
    const text = describeError(status(403, { reason: 'Forbidden', message: sentence }), createSecret);
    assert.equal(text, `HTTP 403 Forbidden (create secrets in namespace "team-a" as "${USER}"): ${sentence}`);
  });
  it('withholds an RBAC-shaped 403 naming another user, with a reason appended, or when our user is unknown', () => {
    const [sentence] = rbacForbiddenMessages(createSecret, USER);
    const forged = rbacForbiddenMessages(createSecret, SENTINEL)[0]!;
    for (const [message, request] of [
      [forged, createSecret],
      [`${sentence}: RBAC: ${SENTINEL}`, createSecret],
      [sentence, { ...createSecret, user: undefined }],
      [sentence, undefined],
    ] as const) {
      const text = describeError(status(403, { reason: 'Forbidden', message }), request);
      assert.match(text, /^HTTP 403 Forbidden.*: refused \(by a policy or webhook\); its message is withheld$/);
      noLeak(text);
    }
  });
  it('gives only the code (and the request) for a body that is not a Status: an HTML page echoing our headers', () => {
    const html = headerEchoPage({ authorization: `Bearer ${TOKEN}` }, SENTINEL);
    const err = { code: 502, body: html, headers: {} };
    assert.equal(describeError(err), 'HTTP 502');
    rememberRequest(err.headers, { ...createSecret, name: 'x', verb: 'get' });
    assert.equal(describeError(err), 'HTTP 502 (get secrets "x" in namespace "team-a")');
    assert.equal(describeError({ code: 500, body: JSON.stringify({ message: SENTINEL }) }), 'HTTP 500');
  });
  it("drops a reason Kubernetes does not define, a message, details that are not what was asked, causes' messages", () => {
    const err = status(422, {
      reason: `Invalid-${SENTINEL}`,
      message: `value ${SENTINEL} refused`,
      details: {
        name: SENTINEL,
        kind: SENTINEL,
        causes: [
          { reason: 'FieldValueInvalid', field: 'metadata.name', message: SENTINEL },
          { reason: 'FieldValueForbidden', field: `data.${SENTINEL}`, message: SENTINEL },
          { reason: SENTINEL, field: 'spec' },
        ],
      },
    });
    const text = describeError(err, createSecret);
    assert.equal(
      text,
      'HTTP 422 (create secrets in namespace "team-a"); causes: metadata.name FieldValueInvalid, FieldValueForbidden',
    );
    noLeak(text);
  });
  it("names a create's object when the answer's details.name equals the name it sent", () => {
    const err = status(409, { reason: 'AlreadyExists', details: { name: 'captf-creds-aws', kind: 'secrets' } });
    assert.equal(
      describeError(err, createSecret),
      'HTTP 409 AlreadyExists (create secrets "captf-creds-aws" in namespace "team-a")',
    );
  });
  it('names the codes of a transport failure, never its messages', () => {
    const refused = new TypeError('fetch failed', {
      cause: Object.assign(new Error(`connect ECONNREFUSED 127.0.0.1:1 ${SENTINEL}`), { code: 'ECONNREFUSED' }),
    });
    assert.equal(describeError(refused), 'transport error: ECONNREFUSED');
    const tls = new TypeError('fetch failed', {
      cause: Object.assign(new Error(`Hostname/IP does not match: ${SENTINEL}`), {
        code: 'ERR_TLS_CERT_ALTNAME_INVALID',
      }),
    });
    assert.equal(
      describeError(tls, { ...createSecret, name: 's', verb: 'get' }),
      'transport error (get secrets "s" in namespace "team-a"): ERR_TLS_CERT_ALTNAME_INVALID',
    );
    const nested = new TypeError('fetch failed', {
      cause: new AggregateError([Object.assign(new Error('x'), { code: 'ECONNREFUSED' })], 'x'),
    });
    assert.deepEqual(transportCodes(nested), ['ECONNREFUSED']);
    const forged = new TypeError('fetch failed', { cause: { code: `E${SENTINEL}`, message: SENTINEL } });
    assert.equal(describeError(forged), 'transport error: no error code');
    const abort = new DOMException('The operation was aborted due to timeout', 'TimeoutError');
    assert.equal(apiStatus(abort), undefined, 'a DOMException code is not an HTTP code');
    assert.ok(isTransportError(abort));
    assert.equal(describeError(abort), 'transport error: TimeoutError');
  });
  it("withholds errors known to quote an answer, keeps the product's own", () => {
    let syntax: unknown;
    try {
      JSON.parse(`<html>${SENTINEL}`);
    } catch (e) {
      syntax = e;
    }
    assert.equal(describeError(syntax), 'an answer that is not valid JSON (SyntaxError; its text is withheld)');
    const media = new Error(`The mediaType text/${SENTINEL} is not supported by ObjectSerializer.parse.`);
    assert.equal(describeError(media), 'an answer with an unsupported Content-Type (withheld)');
    assert.equal(
      describeError(new Error('the lookup took longer than 3000 ms\nstack')),
      'the lookup took longer than 3000 ms',
    );
    assert.equal(describeError(SENTINEL), 'a non-Error value was thrown (string)');
  });
  it('redactApiError keeps the code and cause types for isConflict and friends, with the same text', () => {
    const err = status(403, {
      reason: 'Forbidden',
      message: SENTINEL,
      details: { causes: [{ reason: 'NamespaceTerminating', field: 'metadata.namespace', message: SENTINEL }] },
    });
    const r = redactApiError(err) as RedactedApiError;
    assert.ok(r instanceof RedactedApiError);
    assert.equal(r.code, 403);
    assert.deepEqual(r.causes, ['NamespaceTerminating']);
    assert.equal(describeError(r), r.message);
    noLeak(r.message);
    const transport = new TypeError('fetch failed');
    assert.equal(redactApiError(transport), transport);
  });
});

describe('keptCauses and isFieldPath', () => {
  it('keeps field paths as apimachinery prints them, bounded', () => {
    for (const f of ['metadata.name', 'spec.containers[0].image', 'data[AWS_ACCESS_KEY_ID]', 'metadata.labels[a.b/c]'])
      assert.ok(isFieldPath(f), f);
    for (const f of [
      '',
      'Data.x',
      `data.${SENTINEL}`,
      'metadata name',
      `a${'b'.repeat(60)}`,
      `x.${'y'.repeat(40)}`.repeat(4),
      42,
    ])
      assert.ok(!isFieldPath(f), String(f));
  });
  it('keeps a field path only when made of names the request sent or ObjectMeta names', () => {
    const causes = [
      { reason: 'FieldValueInvalid', field: 'data[AWS_KEY]' },
      { reason: 'FieldValueInvalid', field: 'data.abcdef' },
      { reason: 'FieldValueRequired', field: 'metadata.name' },
      { reason: 'FieldValueInvalid', field: 'spec.containers[0].image' },
    ];
    assert.deepEqual(keptCauses(causes, ['data', 'AWS_KEY']), [
      { type: 'FieldValueInvalid', field: 'data[AWS_KEY]' },
      { type: 'FieldValueInvalid' },
      { type: 'FieldValueRequired', field: 'metadata.name' },
    ]);
    assert.deepEqual(keptCauses(causes.slice(3), ['containers', 'image']), [
      { type: 'FieldValueInvalid', field: 'spec.containers[0].image' },
    ]);
  });
  it('keeps at most five causes, without repeats', () => {
    const many = Array.from({ length: 9 }, (_, i) => ({ reason: 'FieldValueRequired', field: `spec.f${i}` }));
    assert.equal(keptCauses(many, ['f1', 'f2', 'f3', 'f4', 'f5', 'f6', 'f7', 'f8', 'f0']).length, 5);
    assert.deepEqual(keptCauses([{ reason: 'FieldValueRequired' }, { reason: 'FieldValueRequired' }]), [
      { type: 'FieldValueRequired' },
    ]);
    assert.deepEqual(keptCauses('x'), []);
  });
});

describe('usernameFromCredentials: who we are comes from our own credentials, never from an answer', () => {
  const jwt = (claims: object) =>
    ['{"alg":"RS256"}', JSON.stringify(claims), 'sig'].map((p) => Buffer.from(p).toString('base64url')).join('.');
  // openssl req -x509 -subj "/O=editors/CN=alice@example.com" and -subj '/CN=a b"quote'
  const ALICE = `-----BEGIN CERTIFICATE-----
MIIBszCCAVmgAwIBAgIUFFrXJaEj0Xq2g+J07vjZSJkR4RswCgYIKoZIzj0EAwIw
LjEQMA4GA1UECgwHZWRpdG9yczEaMBgGA1UEAwwRYWxpY2VAZXhhbXBsZS5jb20w
IBcNMjYxMjAyMDUwNTQ4WhgPMjEyNjExMDgwNTA1NDhaMC4xEDAOBgNVBAoMB2Vk
aXRvcnMxGjAYBgNVBAMMEWFsaWNlQGV4YW1wbGUuY29tMFkwEwYHKoZIzj0CAQYI
KoZIzj0DAQcDQgAE/IepxUbn0Py4TXdTK86DTi53xPtGjAtsDJx8CMiI7Rk+RwaZ
prmuNClH9e3M1C+WoUXw4wXaNaqmszunc66ju6NTMFEwHQYDVR0OBBYEFCISgcZm
w5mawSO3rJGE4Umi8LgDMB8GA1UdIwQYMBaAFCISgcZmw5mawSO3rJGE4Umi8LgD
MA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIhAL0ndAzNNPeivxqO
3P0bL4pPLq5rRmCIKgZfMT2xbsRfAiAfXgPDBu97MDqWSqegVhTeUwBtsLS0HYg4
lqLYoT7Ekg==
-----END CERTIFICATE-----`;
  const ODD = `-----BEGIN CERTIFICATE-----
MIIBgDCCASWgAwIBAgIUdq0aNyXJ9BaCcreTGokKB0xqtBYwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJYSBiInF1b3RlMCAXDTI2MTIwMjA1MDU0OFoYDzIxMjYxMTA4
MDUwNTQ4WjAUMRIwEAYDVQQDDAlhIGIicXVvdGUwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAAT1S/0GfscjENmocP/Dew31RUFqh4m+SZMkVbJEipJtbUwUFbudblCS
12w7c29IVYV3ZP5R5k1L7vCuT61O/mC4o1MwUTAdBgNVHQ4EFgQU0M/3ypZODgss
ZkN3Oapnr9Gaz+EwHwYDVR0jBBgwFoAU0M/3ypZODgssZkN3Oapnr9Gaz+EwDwYD
VR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNJADBGAiEAx/A1VlJwXmHp5YfL5jKg
msAUkdJxW1/IMDJ7gcOEWxQCIQCiB4mH0IouIU0xhkxp6fVQ+eVS7XgYEnoO1avJ
npndsg==
-----END CERTIFICATE-----`;
  const rows: [string, Parameters<typeof usernameFromCredentials>[0], string | undefined][] = [
    [
      'a ServiceAccount token: its subject',
      { bearer: jwt({ sub: 'system:serviceaccount:captf-system:captf-mirror-sync' }) },
      'system:serviceaccount:captf-system:captf-mirror-sync',
    ],
    ['a token whose subject is not a ServiceAccount', { bearer: jwt({ sub: 'SENTINEL with spaces' }) }, undefined],
    ['a token that is not a JWT', { bearer: 'opaque-token' }, undefined],
    ['a client certificate: its CN', { certPem: ALICE }, 'alice@example.com'],
    ['a CN outside the safe alphabet', { certPem: ODD }, undefined],
    ['garbage PEM', { certPem: 'not a certificate' }, undefined],
    ['nothing', {}, undefined],
  ];
  for (const [name, own, want] of rows) it(name, () => assert.equal(usernameFromCredentials(own), want));
  it('tells a ServiceAccount username by its shape', () => {
    assert.ok(isServiceAccountUser('system:serviceaccount:ns:sa'));
    assert.ok(!isServiceAccountUser('system:serviceaccount:ns:SA with "quotes"'));
    assert.ok(!isServiceAccountUser('alice'));
  });
});
