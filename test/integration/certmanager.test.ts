/**
 * The cert-manager stand-in (scripts/certmanager/) against the real API server with cert-manager's
 * CRDs: a CA bootstrapped as cert-manager documents it issues a leaf; a Certificate it cannot
 * make fails on its own (Ready=False, the reason) without holding up the others; a current
 * Certificate's status is not rewritten on every pass; a Secret someone else broke is issued
 * again, keeping their labels. The stand-in reconciles every namespace: only this file's objects
 * are asserted on (the shared control plane holds no other real Certificates).
 */
import assert from 'node:assert/strict';
import { createPrivateKey, X509Certificate } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { startCertManager } from '../../scripts/certmanager/certmanager.ts';
import { CERT_MANAGER_CRDS, installThirdPartyCRDs } from '../../scripts/controlplane/crds.ts';
import { eventually } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';

const w = fx.world('certmanager');
const a = w.clients;
await installThirdPartyCRDs(a.kc, CERT_MANAGER_CRDS);
const ns = await w.namespace();
const dir = mkdtempSync(join(tmpdir(), 'captf-cm-'));
const lines: string[] = [];
const cm = startCertManager(a.kc, { dir, log: (l) => lines.push(l), everyMs: 200 });
after(async () => {
  await cm.stop();
  rmSync(dir, { recursive: true, force: true });
});

const ref = (plural: string, name: string) => ({
  group: 'cert-manager.io',
  version: 'v1',
  namespace: ns,
  plural,
  name,
});
const create = (plural: string, kind: string, name: string, spec: object) =>
  a.custom.createNamespacedCustomObject({
    ...ref(plural, name),
    body: { apiVersion: 'cert-manager.io/v1', kind, metadata: { name }, spec },
  });
const certificate = (name: string, spec: object) =>
  create('certificates', 'Certificate', name, {
    secretName: name,
    privateKey: { algorithm: 'ECDSA', size: 256 },
    ...spec,
  });
type Status = {
  metadata: { resourceVersion: string };
  status?: { conditions?: { type: string; status: string; reason?: string; message?: string }[] };
};
const read = async (name: string) => (await a.custom.getNamespacedCustomObject(ref('certificates', name))) as Status;
const ready = async (name: string) => (await read(name)).status?.conditions?.find((c) => c.type === 'Ready');
const secret = (name: string) => a.core.readNamespacedSecret({ namespace: ns, name });
const pem = (data: Record<string, string> | undefined, key: string) => Buffer.from(data![key]!, 'base64').toString();

describe('the cert-manager stand-in on the real API server', () => {
  it('bootstraps a CA (self-signed Issuer → CA Certificate → CA Issuer) and issues a leaf from it; a bad Certificate fails alone', async () => {
    await certificate('bad', { duration: '1h', dnsNames: ['bad.example'], issuerRef: { name: 'self' } });
    await create('issuers', 'Issuer', 'self', { selfSigned: {} });
    await certificate('root', { isCA: true, commonName: 'root', duration: '87600h', issuerRef: { name: 'self' } });
    await create('issuers', 'Issuer', 'ca', { ca: { secretName: 'root' } });
    await certificate('leaf', {
      dnsNames: ['leaf.ns.svc'],
      duration: '2160h',
      usages: ['server auth'],
      issuerRef: { name: 'ca' },
    });
    await eventually('the leaf to be Ready', async () => (await ready('leaf'))?.status === 'True', 30_000);
    const leaf = (await secret('leaf')).data;
    assert.equal(pem(leaf, 'ca.crt'), pem((await secret('root')).data, 'tls.crt'), "the leaf's ca.crt is the root");
    assert.ok(new X509Certificate(pem(leaf, 'tls.crt')).verify(new X509Certificate(pem(leaf, 'ca.crt')).publicKey));
    const bad = await eventually('the bad one to be Failed', async () => {
      const c = await ready('bad');
      return c?.reason === 'Failed' ? c : undefined;
    });
    assert.equal(bad.status, 'False');
    assert.match(bad.message!, /whole days only/);
    await assert.rejects(secret('bad'), 'nothing issued for it');
  });

  it('does not rewrite a current status, and issues again into a Secret someone broke, keeping their labels', async () => {
    const before = (await read('leaf')).metadata.resourceVersion;
    for (let i = 0; i < 5; i++) await cm.pass();
    assert.equal((await read('leaf')).metadata.resourceVersion, before, 'five passes wrote nothing');
    const s = await secret('leaf');
    const oldCert = pem(s.data, 'tls.crt');
    s.metadata!.labels = { ...s.metadata!.labels, 'team.example/owner': 'ops' };
    s.data!['tls.key'] = Buffer.from('not a key').toString('base64');
    await a.core.replaceNamespacedSecret({ namespace: ns, name: 'leaf', body: s });
    const fixed = await eventually('the leaf issued again', async () => {
      const now = await secret('leaf');
      return pem(now.data, 'tls.crt') !== oldCert ? now : undefined;
    });
    assert.equal(fixed.metadata!.labels!['team.example/owner'], 'ops');
    assert.ok(
      new X509Certificate(pem(fixed.data, 'tls.crt')).checkPrivateKey(createPrivateKey(pem(fixed.data, 'tls.key'))),
    );
    assert.ok(
      lines.some((l) => l.includes(`issued ${ns}/leaf (InvalidKeyPair)`)),
      lines.join('\n'),
    );
  });
});
