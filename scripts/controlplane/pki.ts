/**
 * Certificates for the local control plane and its users, made with the `openssl` CLI so a
 * shell script can do exactly the same with the files left in `<dir>/pki/` (CN = user name,
 * O = groups: Kubernetes' client-certificate authentication).
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';

const exec = promisify(execFile);

/** Paths of a PEM certificate and its private key. */
export interface CertPair {
  cert: string;
  key: string;
}

/** An `openssl -subj` subject: CN and one O per organisation. */
export function subject(cn: string, orgs: readonly string[] = []): string {
  // openssl -subj syntax: escape the separators it treats specially.
  const esc = (s: string) => s.replace(/[\\/=+,]/g, (c) => `\\${c}`);
  return `/CN=${esc(cn)}${orgs.map((o) => `/O=${esc(o)}`).join('')}`;
}

/** `openssl req` arguments for a new unencrypted ECDSA P-256 key written to `keyPath`. */
export function newEcKey(keyPath: string): string[] {
  return ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', keyPath];
}

/**
 * Creates a self-signed CA (ECDSA P-256, 10 years) at `<dir>/<name>.crt|.key`.
 * @throws Error from openssl.
 */
export async function createCA(dir: string, name: string, cn: string): Promise<CertPair> {
  mkdirSync(dir, { recursive: true });
  const pair = { cert: join(dir, `${name}.crt`), key: join(dir, `${name}.key`) };
  await exec('openssl', [
    'req',
    '-x509',
    ...newEcKey(pair.key),
    '-out',
    pair.cert,
    '-days',
    '3650',
    '-subj',
    subject(cn),
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign,cRLSign',
  ]);
  return pair;
}

/** What to put in a leaf certificate. */
export interface LeafOptions {
  ca: CertPair;
  dir: string;
  /** File base name; defaults to the CN with unsafe characters replaced. */
  name?: string;
  cn: string;
  /** Organisations: the user's groups for client certificates. */
  orgs?: readonly string[];
  /** Subject alternative names for serving certificates, e.g. `['IP:127.0.0.1', 'DNS:localhost']`. */
  sans?: readonly string[];
  usage: 'client' | 'server';
}

/**
 * Creates a leaf certificate (ECDSA P-256, one year) signed by `ca`.
 * @returns paths of the new certificate and key.
 * @throws Error from openssl.
 */
export async function createLeaf(opts: LeafOptions): Promise<CertPair> {
  mkdirSync(opts.dir, { recursive: true });
  const base = opts.name ?? opts.cn.replace(/[^A-Za-z0-9_.-]/g, '_');
  const pair = { cert: join(opts.dir, `${base}.crt`), key: join(opts.dir, `${base}.key`) };
  const csr = join(opts.dir, `${base}.csr`);
  const ext = join(opts.dir, `${base}.ext`);
  const lines = [
    'basicConstraints=critical,CA:FALSE',
    'keyUsage=critical,digitalSignature,keyEncipherment',
    `extendedKeyUsage=${opts.usage === 'server' ? 'serverAuth' : 'clientAuth'}`,
  ];
  if (opts.sans?.length) lines.push(`subjectAltName=${opts.sans.join(',')}`);
  writeFileSync(ext, lines.join('\n') + '\n');
  await exec('openssl', ['req', '-new', ...newEcKey(pair.key), '-out', csr, '-subj', subject(opts.cn, opts.orgs)]);
  await exec('openssl', [
    'x509',
    '-req',
    '-in',
    csr,
    '-CA',
    opts.ca.cert,
    '-CAkey',
    opts.ca.key,
    // A random serial instead of -CAcreateserial: concurrent mints must not share a file.
    '-set_serial',
    `0x${randomBytes(16).toString('hex')}`,
    '-days',
    '365',
    '-extfile',
    ext,
    '-out',
    pair.cert,
  ]);
  return pair;
}

/** A webhook's serving certificate and the CA that signed it. */
export interface WebhookPair {
  ca: CertPair;
  /** Serving certificate for 127.0.0.1 and localhost (CN captf-admission). */
  leaf: CertPair;
  /** PEM of `ca`: the webhook configuration's caBundle, and what a client trusts. */
  caPem: string;
}

/**
 * Creates a CA `<dir>/webhook-ca.*` named `caCN` and a serving certificate `<dir>/admission.*`
 * for 127.0.0.1 and localhost, as cert-manager would issue the admission webhook's.
 * @throws Error from openssl.
 */
export async function createWebhookPair(dir: string, caCN: string): Promise<WebhookPair> {
  const ca = await createCA(dir, 'webhook-ca', caCN);
  const leaf = await createLeaf({
    ca,
    dir,
    name: 'admission',
    cn: 'captf-admission',
    sans: ['IP:127.0.0.1', 'DNS:localhost'],
    usage: 'server',
  });
  return { ca, leaf, caPem: readFileSync(ca.cert, 'utf8') };
}

/**
 * Creates the service-account signing key pair (RSA 2048) at `<dir>/sa.key` and `<dir>/sa.pub`.
 * @throws Error from openssl.
 */
export async function createServiceAccountKeys(dir: string): Promise<{ key: string; pub: string }> {
  mkdirSync(dir, { recursive: true });
  const key = join(dir, 'sa.key');
  const pub = join(dir, 'sa.pub');
  await exec('openssl', ['genpkey', '-algorithm', 'RSA', '-pkeyopt', 'rsa_keygen_bits:2048', '-out', key]);
  await exec('openssl', ['pkey', '-in', key, '-pubout', '-out', pub]);
  return { key, pub };
}
