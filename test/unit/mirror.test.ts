import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, it } from 'node:test';
import { TERRAFORM_CLUSTER } from '../../functions/lib/api.ts';
import { RedactedApiError, redactApiError } from '../../functions/lib/kube.ts';
import {
  ANNOTATION_IDENTITY,
  ANNOTATION_SOURCE_HASH,
  LABEL_MANAGED,
  LABEL_MIRRORED,
  desiredMirror,
  isCurrent,
  isOurs,
  isReservedSourceName,
  mirrorIdentityOf,
  reservedSourceMessage,
  mirrorName,
  sourceHash,
  withOwnerReference,
  withoutOwnerReference,
} from '../../functions/lib/mirror.ts';
import * as fx from '../helpers/fixtures.ts';

const b64 = (s: string | Buffer) => Buffer.from(s).toString('base64');
/** One key and value as the source hash frames them: len(key) key len(value) value, lengths 32-bit big-endian. */
const frame = (k: string, v: Buffer | string) => {
  const [kb, vb] = [Buffer.from(k), Buffer.from(v)];
  const l = (n: number) => {
    const x = Buffer.alloc(4);
    x.writeUInt32BE(n);
    return x;
  };
  return Buffer.concat([l(kb.length), kb, l(vb.length), vb]);
};

// The README publishes these three vectors; changing one is a breaking change.
export const HASH_VECTORS = {
  empty: 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
  oneKey: '0c4d04284a524af214338a695ecea1f5de00b1f6eb90d138cc100d4ec4c797c7',
  severalBinary: '5177d47a50abf918fd1c67cb34c3bf47debf1701e1926a4da231ee582953bdce',
};

describe('mirror name (SPEC §3)', () => {
  it('is captf-creds-<identity> when it fits', () => {
    assert.equal(mirrorName('aws-prod'), 'captf-creds-aws-prod');
  });
  it('keeps the plain form at exactly 253 characters', () => {
    const id = 'a'.repeat(253 - 'captf-creds-'.length);
    assert.equal(mirrorName(id), `captf-creds-${id}`);
    assert.equal(mirrorName(id).length, 253);
  });
  it('uses the first 16 hex of SHA-256 of the identity name beyond 253 characters', () => {
    const id = 'b'.repeat(242);
    const expected = 'captf-creds-' + createHash('sha256').update(id).digest('hex').slice(0, 16);
    assert.equal(mirrorName(id), expected);
    assert.equal(mirrorName(id).length, 28);
  });
});

describe('source hash (SPEC §3)', () => {
  it('hashes empty or absent data as the empty input', () => {
    assert.equal(sourceHash({}), HASH_VECTORS.empty);
    assert.equal(sourceHash(undefined), HASH_VECTORS.empty);
    assert.equal(sourceHash(null), HASH_VECTORS.empty);
  });
  it('frames one key as len(key) key len(value) value, big-endian', () => {
    assert.equal(sourceHash({ token: b64('s3cr3t') }), HASH_VECTORS.oneKey);
  });
  it('sorts keys by byte order and hashes binary values byte for byte', () => {
    const data = {
      'b.bin': b64(Buffer.from([0x00, 0xff, 0x10, 0x80])),
      a: b64('alpha'),
      AWS_SECRET_ACCESS_KEY: b64(Buffer.from([0xde, 0xad, 0xbe, 0xef, 0x00])),
    };
    assert.equal(sourceHash(data), HASH_VECTORS.severalBinary);
    // Independent construction of the canonical input.
    const input = Buffer.concat([
      frame('AWS_SECRET_ACCESS_KEY', Buffer.from([0xde, 0xad, 0xbe, 0xef, 0x00])),
      frame('a', Buffer.from('alpha')),
      frame('b.bin', Buffer.from([0x00, 0xff, 0x10, 0x80])),
    ]);
    assert.equal(createHash('sha256').update(input).digest('hex'), HASH_VECTORS.severalBinary);
  });
  it('does not depend on key insertion order and separates key/value boundaries', () => {
    assert.equal(sourceHash({ x: b64('1'), y: b64('2') }), sourceHash({ y: b64('2'), x: b64('1') }));
    assert.notEqual(sourceHash({ ab: b64('c') }), sourceHash({ a: b64('bc') }));
    assert.notEqual(sourceHash({ k: b64('') }), sourceHash({}));
  });
  it('sorts by UTF-8 bytes, not UTF-16 code units', () => {
    // U+FF5E (EF BD 9E) sorts before U+1F600 (F0 9F 98 80) in UTF-8, after it in UTF-16.
    const a = sourceHash({ '\uff5e': b64('1'), '\u{1f600}': b64('2') });
    const expected = createHash('sha256')
      .update(Buffer.concat([frame('\uff5e', '1'), frame('\u{1f600}', '2')]))
      .digest('hex');
    assert.equal(a, expected);
  });
});

describe('ours and current (SPEC §3)', () => {
  const owner = {
    apiVersion: fx.apiVersionOf(TERRAFORM_CLUSTER),
    kind: 'TerraformCluster',
    name: 'c1',
    uid: 'u1',
  };
  const m = desiredMirror('aws', 'team-a', { k: b64('v') }, owner);
  it('builds the mirror with labels, annotations, one owner reference and the data', () => {
    assert.equal(m.metadata.name, 'captf-creds-aws');
    assert.equal(m.type, 'Opaque');
    assert.deepEqual(m.metadata.labels, {
      [LABEL_MIRRORED]: 'true',
      [LABEL_MANAGED]: 'true',
      'captf.io/mirror-of': 'aws',
    });
    assert.deepEqual(m.metadata.annotations, {
      [ANNOTATION_SOURCE_HASH]: sourceHash({ k: b64('v') }),
      [ANNOTATION_IDENTITY]: 'aws',
    });
    assert.deepEqual(m.metadata.ownerReferences, [owner]);
    assert.deepEqual(m.data, { k: b64('v') });
  });
  it("is ours only with the label, the identity annotation, and not as that identity's own source", () => {
    const rows: [string, Parameters<typeof isOurs>, boolean][] = [
      ['labels and annotation', [m, 'aws', { namespace: 'ops', name: 'aws-creds' }], true],
      ['identity gone (no secretRef)', [m, 'aws', undefined], true],
      ['another identity', [m, 'gcp', undefined], false],
      ['no label', [{ metadata: { labels: {}, annotations: m.metadata.annotations } }, 'aws', undefined], false],
      ['no annotation', [{ metadata: { labels: m.metadata.labels } }, 'aws', undefined], false],
      ['absent', [undefined, 'aws', undefined], false],
      ['the Secret its own identity names', [m, 'aws', { namespace: 'team-a', name: 'captf-creds-aws' }], false],
      ['a Secret of that name elsewhere', [m, 'aws', { namespace: 'ops', name: 'captf-creds-aws' }], true],
    ];
    for (const [name, args, want] of rows) assert.equal(isOurs(...args), want, name);
  });
  it('reserves the mirror prefix and names the identity a reserved name belongs to', () => {
    assert.ok(isReservedSourceName('captf-creds-aws'));
    assert.ok(isReservedSourceName('captf-creds-'));
    assert.ok(!isReservedSourceName('captf-cred-aws'));
    assert.ok(!isReservedSourceName('aws-captf-creds-x'));
    assert.ok(!isReservedSourceName(undefined));
    assert.equal(mirrorIdentityOf('captf-creds-aws-prod'), 'aws-prod');
    assert.equal(mirrorIdentityOf('captf-creds-'), undefined);
    assert.equal(mirrorIdentityOf('captf-creds-Bad_Name'), undefined);
    assert.equal(mirrorIdentityOf('aws'), undefined);
    assert.match(reservedSourceMessage('captf-creds-aws-prod'), /reserved for the mirrors.*"aws-prod"/);
    assert.doesNotMatch(reservedSourceMessage('captf-creds-x_y'), /TerraformClusterIdentity/);
  });
  it('is current only when the annotation and the data both hash to the source', () => {
    const h = sourceHash({ k: b64('v') });
    assert.ok(isCurrent(m, h));
    assert.ok(!isCurrent({ ...m, data: { k: b64('edited') } }, h), 'hand-edited data with the annotation kept');
    assert.ok(!isCurrent({ ...m, metadata: { ...m.metadata, annotations: {} } }, h));
    assert.ok(!isCurrent(m, sourceHash({ k: b64('rotated') })));
  });
});

describe('owner references (SPEC §3, §6)', () => {
  const ref = (
    name: string,
    uid: string,
    kind = 'TerraformCluster',
    apiVersion = fx.apiVersionOf(TERRAFORM_CLUSTER),
  ) => ({
    apiVersion,
    kind,
    name,
    uid,
  });
  const foreign = { apiVersion: 'apps/v1', kind: 'Deployment', name: 'x', uid: 'd1', controller: true };
  it('adds a missing reference', () => {
    assert.deepEqual(withOwnerReference([foreign], ref('a', '1')), { refs: [foreign, ref('a', '1')], changed: true });
  });
  it('reports no change when the exact reference is present', () => {
    const refs = [ref('a', '1'), foreign];
    assert.deepEqual(withOwnerReference(refs, ref('a', '1')), { refs, changed: false });
  });
  it('replaces a stale UID of the same group, kind and name', () => {
    const out = withOwnerReference([ref('a', 'old'), foreign, ref('b', '2')], ref('a', 'new'));
    assert.deepEqual(out, { refs: [foreign, ref('b', '2'), ref('a', 'new')], changed: true });
  });
  it('treats another version of the same group as the same owner', () => {
    const out = withOwnerReference(
      [ref('a', '1', 'TerraformCluster', fx.apiVersionOf({ ...TERRAFORM_CLUSTER, version: 'v1beta1' }))],
      ref('a', '1'),
    );
    assert.deepEqual(out, { refs: [ref('a', '1')], changed: true });
  });
  it('clears controller/blockOwnerDeletion on our own reference', () => {
    const out = withOwnerReference([{ ...ref('a', '1'), controller: true }], ref('a', '1'));
    assert.deepEqual(out, { refs: [ref('a', '1')], changed: true });
  });
  it('keeps a same-name reference of another kind', () => {
    const m = ref('a', '9', 'TerraformMachine');
    assert.deepEqual(withOwnerReference([m], ref('a', '1')).refs, [m, ref('a', '1')]);
  });
  it('removes only the named owner, and only the given UID when one is given', () => {
    const refs = [ref('a', '1'), ref('b', '2'), foreign];
    assert.deepEqual(withoutOwnerReference(refs, ref('a', '1')), { refs: [ref('b', '2'), foreign], changed: true });
    assert.deepEqual(withoutOwnerReference(refs, ref('a', 'other')), { refs, changed: false });
    assert.deepEqual(withoutOwnerReference(refs, { ...ref('a', ''), uid: undefined }).refs, [ref('b', '2'), foreign]);
    assert.deepEqual(withoutOwnerReference(undefined, ref('a', '1')), { refs: [], changed: false });
  });
});

describe('redactApiError keeps only Kubernetes-defined words', () => {
  it('drops a webhook-chosen reason and cause fields that may carry data', () => {
    const err = {
      code: 422,
      body: JSON.stringify({
        kind: 'Status',
        reason: 'Bad-AKIAEXAMPLE',
        message: 'value AKIAEXAMPLE refused',
        details: {
          causes: [
            { reason: 'FieldValueInvalid', field: 'data.AKIAEXAMPLE' },
            { reason: 'AKIAEXAMPLE', field: 'x' },
            { reason: 'NamespaceTerminating' },
          ],
        },
      }),
    };
    const r = redactApiError(err) as RedactedApiError;
    assert.ok(!r.message.includes('AKIAEXAMPLE'), r.message);
    assert.equal(r.message, 'HTTP 422; causes: FieldValueInvalid, NamespaceTerminating');
    assert.deepEqual(r.causes, ['FieldValueInvalid', 'NamespaceTerminating']);
    const known = redactApiError({ code: 403, body: { kind: 'Status', reason: 'Forbidden' } }) as RedactedApiError;
    assert.match(known.message, /^HTTP 403 Forbidden: refused \(by a policy or webhook\); its message is withheld$/);
  });
});
