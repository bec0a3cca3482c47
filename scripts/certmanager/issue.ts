/**
 * Signing for the cert-manager stand-in, with the `openssl` CLI as the control plane's PKI is made
 * (scripts/controlplane/pki.ts): a new private key per issuance (cert-manager's
 * `rotationPolicy: Always`, its default), signed by itself or by a CA key pair.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { subject } from '../controlplane/pki.ts';
import { EC_CURVES, validityDays, type Certificate, type Issued } from './decide.ts';

const exec = promisify(execFile);

/** A CA's key pair and the root of its chain, PEM. */
export interface SigningPair {
  cert: string;
  key: string;
  /** The root (the CA Secret's `ca.crt`, or its certificate when it is the root). */
  root: string;
}

/**
 * `openssl req` arguments for a new key as `spec.privateKey` asks (cert-manager's default: RSA 2048).
 * @throws Error for a key the stand-in does not make (Ed25519, an ECDSA size without a curve).
 */
function newKey(cert: Certificate, keyPath: string): string[] {
  const { algorithm = 'RSA', size } = cert.spec.privateKey ?? {};
  const curve = EC_CURVES[size ?? 256];
  if (algorithm === 'ECDSA' && curve)
    return ['-newkey', 'ec', '-pkeyopt', `ec_paramgen_curve:${curve}`, '-nodes', '-keyout', keyPath];
  if (algorithm === 'RSA') return ['-newkey', `rsa:${size ?? 2048}`, '-nodes', '-keyout', keyPath];
  throw new Error(`privateKey ${algorithm} ${size ?? ''}: not made by this stand-in (RSA, or ECDSA 256/384/521)`);
}

/** Usages the stand-in writes as key usage (always both) and as extended key usage. */
const KEY_USAGES = new Set(['digital signature', 'key encipherment', 'cert sign']);
const EXTENDED_USAGES: Readonly<Record<string, string>> = { 'server auth': 'serverAuth', 'client auth': 'clientAuth' };

/**
 * The X.509 extensions cert-manager puts in (pkg/util/pki/csr.go): a CA gets `CA:TRUE` and may
 * sign certificates; a leaf gets its `usages` (default digital signature, key encipherment) and
 * its DNS names.
 */
function extensions(cert: Certificate): string {
  const { isCA, usages = ['digital signature', 'key encipherment'], dnsNames = [] } = cert.spec;
  const unknown = usages.filter((u) => !KEY_USAGES.has(u) && !(u in EXTENDED_USAGES));
  if (unknown.length) throw new Error(`usages ${unknown.join(', ')}: not made by this stand-in`);
  const eku = usages.map((u) => EXTENDED_USAGES[u]).filter(Boolean);
  const lines = isCA
    ? ['basicConstraints=critical,CA:TRUE', 'keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign']
    : ['basicConstraints=critical,CA:FALSE', 'keyUsage=critical,digitalSignature,keyEncipherment'];
  if (eku.length) lines.push(`extendedKeyUsage=${eku.join(',')}`);
  if (dnsNames.length) lines.push(`subjectAltName=${dnsNames.map((n) => `DNS:${n}`).join(',')}`);
  return lines.join('\n') + '\n';
}

/**
 * Issues a certificate for `cert`: self-signed when `signer` is undefined, else signed by it.
 * @returns the chain (`tls.crt`), the new key and the root (`ca.crt`).
 * @throws Error from openssl, or for a key algorithm it does not make.
 */
export async function issue(cert: Certificate, signer: SigningPair | undefined, workDir: string): Promise<Issued> {
  const dir = mkdtempSync(join(workDir, 'issue-'));
  try {
    const f = (n: string) => join(dir, n);
    writeFileSync(f('ext'), extensions(cert));
    const subj = subject(cert.spec.commonName ?? cert.spec.dnsNames?.[0] ?? cert.metadata.name);
    const days = String(validityDays(cert));
    const serial = `0x${randomBytes(16).toString('hex')}`;
    if (!signer) {
      await exec('openssl', [
        'req',
        '-x509',
        ...newKey(cert, f('key')),
        '-subj',
        subj,
        '-days',
        days,
        '-set_serial',
        serial,
        '-extensions',
        'v3',
        '-config',
        config(f('ext')),
        '-out',
        f('crt'),
      ]);
      const self = readFileSync(f('crt'), 'utf8');
      return { chain: self, key: readFileSync(f('key'), 'utf8'), ca: self };
    }
    writeFileSync(f('ca.crt'), signer.cert);
    writeFileSync(f('ca.key'), signer.key, { mode: 0o600 });
    await exec('openssl', ['req', '-new', ...newKey(cert, f('key')), '-subj', subj, '-out', f('csr')]);
    await exec('openssl', [
      'x509',
      '-req',
      '-in',
      f('csr'),
      '-CA',
      f('ca.crt'),
      '-CAkey',
      f('ca.key'),
      '-set_serial',
      serial,
      '-days',
      days,
      '-extfile',
      f('ext'),
      '-out',
      f('crt'),
    ]);
    // The signer's own certificate joins the chain unless it is the (self-signed) root.
    const intermediate = signer.cert.trim() === signer.root.trim() ? '' : signer.cert;
    return {
      chain: readFileSync(f('crt'), 'utf8') + intermediate,
      key: readFileSync(f('key'), 'utf8'),
      ca: signer.root,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** An openssl config whose section `v3` holds the extensions (what `req -x509` reads them from). */
function config(extFile: string): string {
  const path = `${extFile}.cnf`;
  writeFileSync(path, `[req]\ndistinguished_name=dn\n[dn]\n[v3]\n${readFileSync(extFile, 'utf8')}`);
  return path;
}
