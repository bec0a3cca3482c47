/**
 * The cert-manager stand-in's rules (scripts/certmanager/decide.ts) on certificates it really
 * issues with openssl: when to issue, what the Secret and status hold, which Secret signs,
 * where cainjector reads from.
 */
import assert from 'node:assert/strict';
import { createPrivateKey, X509Certificate } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import {
  injectFrom,
  issuanceReason,
  issuerReadyCondition,
  issuerStatus,
  parseDuration,
  readyStatus,
  renewalTime,
  secretFor,
  signerOf,
  validityDays,
  type Certificate,
} from '../../scripts/certmanager/decide.ts';
import { issue } from '../../scripts/certmanager/issue.ts';

const dir = mkdtempSync(join(tmpdir(), 'captf-cm-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const certificate = (name: string, spec: Partial<Certificate['spec']> = {}): Certificate => ({
  metadata: { name, namespace: 'ns', generation: 2 },
  spec: { secretName: `${name}-tls`, issuerRef: { name: 'ca', kind: 'Issuer', group: 'cert-manager.io' }, ...spec },
});
const caCert = certificate('root', {
  isCA: true,
  commonName: 'root',
  duration: '87600h',
  privateKey: { algorithm: 'ECDSA', size: 256 },
});
const leafCert = certificate('leaf', {
  dnsNames: ['a.ns.svc', 'a.ns.svc.cluster.local'],
  duration: '2160h',
  renewBefore: '360h',
  usages: ['server auth'],
  privateKey: { algorithm: 'ECDSA', size: 256 },
});
const view = (s: ReturnType<typeof secretFor>) => ({ data: s.data, annotations: s.metadata.annotations });

describe('the stand-in issues as cert-manager does', async () => {
  const root = await issue(caCert, undefined, dir);
  const leaf = await issue(leafCert, { cert: root.chain, key: root.key, root: root.ca }, dir);

  it('self-signed: ca.crt is the certificate itself, a CA for its duration', () => {
    assert.equal(root.ca, root.chain);
    const x = new X509Certificate(root.chain);
    assert.equal(x.ca, true);
    assert.equal(validityDays(caCert), 3650);
  });

  it('CA-signed: the chain leaves out the self-signed root, ca.crt is the root, names and usage as asked', () => {
    const x = new X509Certificate(leaf.chain);
    assert.equal(leaf.ca, root.ca);
    assert.equal(leaf.chain.match(/BEGIN CERTIFICATE/g)?.length, 1);
    assert.ok(x.verify(new X509Certificate(root.ca).publicKey), 'signed by the root');
    assert.equal(x.subjectAltName, 'DNS:a.ns.svc, DNS:a.ns.svc.cluster.local');
    assert.equal(x.ca, false);
    assert.ok(x.checkPrivateKey(createPrivateKey(leaf.key)), 'the key is the pair of the certificate');
  });

  it('a current Secret needs nothing; each policy of the trigger chain names its reason', () => {
    const now = new Date();
    const secret = view(secretFor(leafCert, leaf));
    assert.equal(issuanceReason(leafCert, secret, now), undefined);
    assert.equal(issuanceReason(leafCert, undefined, now), 'DoesNotExist');
    assert.equal(
      issuanceReason(leafCert, { ...secret, data: { 'tls.crt': secret.data['tls.crt'] } }, now),
      'MissingData',
    );
    const otherIssuer = { ...leafCert, spec: { ...leafCert.spec, issuerRef: { name: 'other' } } };
    assert.equal(issuanceReason(otherIssuer, secret, now), 'IncorrectIssuer');
    const renamed = { ...leafCert, metadata: { ...leafCert.metadata, name: 'x' } };
    assert.equal(issuanceReason(renamed, secret, now), 'IncorrectCertificate');
    const moreNames = { ...leafCert, spec: { ...leafCert.spec, dnsNames: ['b.ns.svc'] } };
    assert.equal(issuanceReason(moreNames, secret, now), 'SecretMismatch');
    assert.equal(issuanceReason(leafCert, secret, new Date(now.getTime() + 80 * 86_400_000)), 'Renewing');
    const asked = {
      ...leafCert,
      status: { conditions: [{ type: 'Issuing', status: 'True' as const, reason: 'ManuallyTriggered' }] },
    };
    assert.equal(issuanceReason(asked, secret, now), 'ManuallyTriggered');
  });

  it("a key that is not the certificate's, or not what the spec asks, is issued again", async () => {
    const now = new Date();
    const secret = view(secretFor(leafCert, leaf));
    const swapped = { ...secret, data: { ...secret.data, 'tls.key': view(secretFor(caCert, root)).data['tls.key'] } };
    assert.equal(issuanceReason(leafCert, swapped, now), 'InvalidKeyPair');
    const garbage = { ...secret, data: { ...secret.data, 'tls.key': Buffer.from('not a key').toString('base64') } };
    assert.equal(issuanceReason(leafCert, garbage, now), 'InvalidKeyPair');
    const rsa = { ...leafCert, spec: { ...leafCert.spec, privateKey: { algorithm: 'RSA', size: 2048 } } };
    assert.equal(issuanceReason(rsa, secret, now), 'SecretMismatch');
    const named = { ...leafCert, spec: { ...leafCert.spec, commonName: 'other' } };
    assert.equal(issuanceReason(named, secret, now), 'SecretMismatch');
  });

  it('a Secret without annotations is adopted for an Issuer, not for a ClusterIssuer (SecretIssuerAnnotationsMatch)', () => {
    const bare = { data: view(secretFor(leafCert, leaf)).data, annotations: {} };
    assert.equal(issuanceReason(leafCert, bare, new Date()), undefined);
    const clusterRef = { ...leafCert, spec: { ...leafCert.spec, issuerRef: { name: 'ca', kind: 'ClusterIssuer' } } };
    assert.equal(issuanceReason(clusterRef, bare, new Date()), 'IncorrectIssuer');
  });

  it('what it cannot make is refused, loudly: part-day durations, Ed25519, other ECDSA sizes, unknown usages', async () => {
    assert.throws(() => validityDays(certificate('x', { duration: '1h' })), /whole days only/);
    assert.throws(() => validityDays(certificate('x', { duration: '0' })), /expected e.g. 2160h/);
    await assert.rejects(issue(certificate('x', { privateKey: { algorithm: 'Ed25519' } }), undefined, dir), /not made/);
    await assert.rejects(
      issue(certificate('x', { privateKey: { algorithm: 'ECDSA', size: 512 } }), undefined, dir),
      /not made/,
    );
    await assert.rejects(issue(certificate('x', { usages: ['code signing'] }), undefined, dir), /usages code signing/);
  });

  it('the status: Ready, validity, renewal time, revision counted per issuance, Issuing cleared', () => {
    const x = new X509Certificate(leaf.chain);
    const asked = { ...leafCert, status: { revision: 1, conditions: [{ type: 'Issuing', status: 'True' as const }] } };
    const s = readyStatus(asked, x, true, new Date());
    assert.deepEqual(
      s.conditions.map((c) => [c.type, c.status, c.observedGeneration]),
      [['Ready', 'True', 2]],
    );
    assert.equal(s.revision, 2);
    assert.equal(new Date(s.notAfter).getTime() - new Date(s.renewalTime).getTime(), 360 * 3600_000);
  });
});

describe('pure rules', () => {
  it('durations as Go writes them', () => {
    assert.equal(parseDuration('2160h'), 2160 * 3600_000);
    assert.equal(parseDuration('1h30m'), 5400_000);
    assert.throws(() => parseDuration('90d'), /expected e.g. 2160h/);
  });

  it('renewal: renewBefore when shorter than the lifetime, else a third of it', () => {
    const from = new Date('2026-01-01T00:00:00Z');
    const to = new Date('2026-01-31T00:00:00Z');
    assert.equal(renewalTime(from, to, '24h').toISOString(), '2026-01-30T00:00:00.000Z');
    assert.equal(renewalTime(from, to, '9999h').toISOString(), '2026-01-21T00:00:00.000Z');
    assert.equal(renewalTime(from, to).toISOString(), '2026-01-21T00:00:00.000Z');
  });

  it("a CA issuer's Secret: the Certificate's namespace, or cert-manager's for a ClusterIssuer", () => {
    const ca = { metadata: { name: 'x' }, spec: { ca: { secretName: 's' } } };
    assert.deepEqual(signerOf({ ...ca, kind: 'Issuer' }, 'ns'), {
      self: false,
      secret: { namespace: 'ns', name: 's' },
    });
    assert.deepEqual(signerOf({ ...ca, kind: 'ClusterIssuer' }, 'ns'), {
      self: false,
      secret: { namespace: 'cert-manager', name: 's' },
    });
    assert.deepEqual(signerOf({ metadata: { name: 'x' }, spec: { selfSigned: {} } }, 'ns'), { self: true });
    assert.equal(signerOf({ metadata: { name: 'x' }, spec: {} }, 'ns'), undefined);
  });

  it('an issuer is Ready when it can sign; its status is written only when that changes', () => {
    const ca = { kind: 'Issuer', metadata: { name: 'ca', namespace: 'ns' }, spec: { ca: { secretName: 's' } } };
    const signer = signerOf(ca, 'ns')!;
    const missing = issuerReadyCondition(signer, false);
    assert.deepEqual([missing.status, missing.reason], ['False', 'ErrGetKeyPair']);
    assert.match(missing.message!, /ns\/s/);
    const ready = issuerReadyCondition(signer, true);
    const now = new Date('2026-12-03T10:00:00.123Z');
    const status = issuerStatus(ca, ready, now)!;
    assert.equal(status.conditions[0]!.lastTransitionTime, '2026-12-03T10:00:00Z', 'to the second, as stored');
    assert.equal(issuerStatus({ ...ca, status }, ready, now), undefined);
  });

  it('inject-ca-from: <namespace>/<name> only', () => {
    assert.deepEqual(injectFrom({ 'cert-manager.io/inject-ca-from': 'captf-system/captf-admission-tls' }), {
      namespace: 'captf-system',
      name: 'captf-admission-tls',
    });
    assert.equal(injectFrom({ 'cert-manager.io/inject-ca-from': 'no-slash' }), undefined);
    assert.equal(injectFrom(undefined), undefined);
  });
});
