/**
 * The decisions of the cert-manager stand-in (./certmanager.ts), pure: when a Certificate needs a
 * new certificate, which key pair signs it, what its Secret and status hold, and what cainjector
 * writes into a webhook's `caBundle`. Each follows cert-manager v1.21.2 (the module the CRDs come
 * from, scripts/tools/go/crds); the file it follows is named beside it.
 */
import { createPrivateKey, X509Certificate, type KeyObject } from 'node:crypto';

/** Where a ClusterIssuer's Secrets live (cert-manager's `--cluster-resource-namespace` as its Helm chart sets it). */
export const CLUSTER_RESOURCE_NAMESPACE = 'cert-manager';
/** cainjector's annotation on a webhook configuration: `<namespace>/<Certificate>` (pkg/apis/certmanager/v1/types.go). */
export const INJECT_CA_FROM = 'cert-manager.io/inject-ca-from';

/** The annotations cert-manager writes on a Certificate's Secret (pkg/apis/certmanager/v1/types.go). */
export const SECRET_ANNOTATIONS = {
  certificateName: 'cert-manager.io/certificate-name',
  issuerName: 'cert-manager.io/issuer-name',
  issuerKind: 'cert-manager.io/issuer-kind',
  issuerGroup: 'cert-manager.io/issuer-group',
  commonName: 'cert-manager.io/common-name',
  altNames: 'cert-manager.io/alt-names',
} as const;

/** A condition as cert-manager writes them. */
export interface CmCondition {
  type: string;
  status: 'True' | 'False' | 'Unknown';
  reason?: string;
  message?: string;
  lastTransitionTime?: string;
  observedGeneration?: number;
}

/** The fields of a cert-manager Certificate the stand-in reads and writes. */
export interface Certificate {
  apiVersion?: string;
  kind?: string;
  metadata: { name: string; namespace: string; generation?: number; resourceVersion?: string };
  spec: {
    secretName: string;
    commonName?: string;
    dnsNames?: string[];
    isCA?: boolean;
    duration?: string;
    renewBefore?: string;
    usages?: string[];
    privateKey?: { algorithm?: string; size?: number };
    issuerRef: { name: string; kind?: string; group?: string };
  };
  status?: {
    conditions?: CmCondition[];
    notBefore?: string;
    notAfter?: string;
    renewalTime?: string;
    revision?: number;
  };
}

/** A cert-manager Issuer or ClusterIssuer, of the two types the stand-in plays. */
export interface Issuer {
  kind?: string;
  metadata: { name: string; namespace?: string; generation?: number; resourceVersion?: string };
  spec: { selfSigned?: object; ca?: { secretName: string } };
  status?: { conditions?: CmCondition[] };
}

/** A Secret as the stand-in reads it: base64 data and annotations. */
export interface SecretView {
  data?: Record<string, string>;
  annotations?: Record<string, string>;
}

/** The issuer kind a reference names (cert-manager's default is `Issuer`). */
export const issuerKind = (ref: Certificate['spec']['issuerRef']): string => ref.kind ?? 'Issuer';

/**
 * Parses a Go duration of hours, minutes and seconds (`2160h`, `1h30m`, `90s`), as cert-manager's
 * `duration` and `renewBefore` are written.
 * @returns milliseconds.
 * @throws Error naming the text when it is not one.
 */
export function parseDuration(text: string): number {
  const units: Record<string, number> = { h: 3600_000, m: 60_000, s: 1000, ms: 1 };
  const parts = [...text.matchAll(/(\d+(?:\.\d+)?)(ms|h|m|s)/g)];
  if (!parts.length || parts.map((p) => p[0]).join('') !== text)
    throw new Error(`duration ${text}: expected e.g. 2160h`);
  return parts.reduce((sum, p) => sum + Number(p[1]) * units[p[2]!]!, 0);
}

/** cert-manager's default lifetime when `duration` is unset: 90 days (pkg/apis/certmanager/v1/const.go). */
const DEFAULT_DURATION_MS = 2160 * 3600_000;

/**
 * The lifetime to issue for, in days: the stand-in signs with openssl 3.0's `-days`, so a
 * `duration` that is not a whole number of days is refused rather than stretched (every
 * Certificate of the manifests and of Knative asks for whole days).
 * @throws Error naming the duration.
 */
export function validityDays(cert: Certificate): number {
  const ms = cert.spec.duration ? parseDuration(cert.spec.duration) : DEFAULT_DURATION_MS;
  if (ms < 86_400_000 || ms % 86_400_000 !== 0)
    throw new Error(`duration ${cert.spec.duration}: this stand-in issues whole days only`);
  return ms / 86_400_000;
}

/**
 * When a certificate is due for renewal (pkg/util/pki/renewaltime.go `RenewalTime`): `renewBefore`
 * before `notAfter` when it is shorter than the lifetime, else a third of the lifetime before it;
 * truncated to the second.
 */
export function renewalTime(notBefore: Date, notAfter: Date, renewBefore?: string): Date {
  const lifetime = notAfter.getTime() - notBefore.getTime();
  const before = renewBefore ? parseDuration(renewBefore) : 0;
  const ahead = before > 0 && before < lifetime ? before : Math.floor(lifetime / 3);
  return new Date(Math.floor((notAfter.getTime() - ahead) / 1000) * 1000);
}

/** One policy of the trigger chain: the reason to issue, or undefined to ask the next. */
type Policy = (cert: Certificate, secret: SecretView | undefined, now: Date) => string | undefined;

/** The certificate in a Secret, or undefined when it does not parse. */
function leafOf(secret: SecretView | undefined): X509Certificate | undefined {
  try {
    return new X509Certificate(Buffer.from(secret?.data?.['tls.crt'] ?? '', 'base64'));
  } catch {
    return undefined;
  }
}

/** The private key in a Secret, or undefined when it does not parse. */
function keyOf(secret: SecretView | undefined): KeyObject | undefined {
  try {
    return createPrivateKey(Buffer.from(secret?.data?.['tls.key'] ?? '', 'base64'));
  } catch {
    return undefined;
  }
}

/** Kinds and groups compare with their defaults filled in (pkg/api/util/issuers.go `IssuerKindsEqual`, `IssuerGroupsEqual`). */
const kindOr = (k: string | undefined) => k || 'Issuer';
const groupOr = (g: string | undefined) => g || 'cert-manager.io';

/**
 * The Secret names another issuer (pkg/api/util/issuers.go `SecretIssuerAnnotationsMatch`):
 * the name is compared only when one of the three annotations is there; kind and group with
 * their defaults, so a Secret without annotations is adopted for an Issuer of cert-manager.io.
 */
function issuerDiffers(cert: Certificate, secret: SecretView | undefined): boolean {
  const a = secret?.annotations ?? {};
  const ref = cert.spec.issuerRef;
  const [name, kind, group] = [
    a[SECRET_ANNOTATIONS.issuerName],
    a[SECRET_ANNOTATIONS.issuerKind],
    a[SECRET_ANNOTATIONS.issuerGroup],
  ];
  if ((name !== undefined || kind !== undefined || group !== undefined) && name !== ref.name) return true;
  return kindOr(kind) !== kindOr(ref.kind) || groupOr(group) !== groupOr(ref.group);
}

/** The key is not of the algorithm and size the spec asks (cert-manager's default: RSA 2048). */
function keyDiffersFromSpec(cert: Certificate, key: KeyObject): boolean {
  const { algorithm = 'RSA', size } = cert.spec.privateKey ?? {};
  const d = key.asymmetricKeyDetails ?? {};
  if (algorithm === 'ECDSA') return key.asymmetricKeyType !== 'ec' || d.namedCurve !== EC_CURVES[size ?? 256];
  if (algorithm === 'RSA') return key.asymmetricKeyType !== 'rsa' || d.modulusLength !== (size ?? 2048);
  return true;
}

/** ECDSA sizes and their curves (Node's names; pkg/util/pki/generate.go). */
export const EC_CURVES: Readonly<Record<number, string>> = { 256: 'prime256v1', 384: 'secp384r1', 521: 'secp521r1' };

/**
 * The trigger chain, in cert-manager's order (internal/controller/certificates/policies/
 * policies.go `NewTriggerPolicyChain` and checks.go, reasons from constants.go); `ManuallyTriggered`
 * is the `Issuing` condition `cmctl renew` sets, which cert-manager's issuing controller acts on.
 * The CertificateRequest checks compare the Secret with the spec directly (the stand-in keeps no
 * requests).
 */
const TRIGGER_CHAIN: readonly Policy[] = [
  (cert) => {
    const issuing = cert.status?.conditions?.find((c) => c.type === 'Issuing' && c.status === 'True');
    return issuing ? (issuing.reason ?? 'ManuallyTriggered') : undefined;
  },
  (_, secret) => (secret ? undefined : 'DoesNotExist'),
  (_, secret) => (secret?.data?.['tls.crt'] && secret.data['tls.key'] ? undefined : 'MissingData'),
  (_, secret) => {
    // SecretPublicKeysDiffer: the key must parse and be the certificate's.
    const key = keyOf(secret);
    const x509 = leafOf(secret);
    return key && x509 && x509.checkPrivateKey(key) ? undefined : 'InvalidKeyPair';
  },
  (cert, secret) => (issuerDiffers(cert, secret) ? 'IncorrectIssuer' : undefined),
  (cert, secret) => {
    const name = secret?.annotations?.[SECRET_ANNOTATIONS.certificateName];
    return name !== undefined && name !== cert.metadata.name ? 'IncorrectCertificate' : undefined;
  },
  (cert, secret) => (keyDiffersFromSpec(cert, keyOf(secret)!) ? 'SecretMismatch' : undefined),
  (cert, secret) => {
    const x509 = leafOf(secret)!;
    const cn = /(?:^|\n)CN=([^\n]*)/.exec(x509.subject)?.[1];
    const same =
      sameNames(x509, cert) &&
      x509.ca === (cert.spec.isCA ?? false) &&
      (!cert.spec.commonName || cn === cert.spec.commonName);
    return same ? undefined : 'SecretMismatch';
  },
  (cert, secret, now) => {
    const x509 = leafOf(secret)!;
    const due = renewalTime(new Date(x509.validFrom), new Date(x509.validTo), cert.spec.renewBefore);
    return now >= due ? 'Renewing' : undefined;
  },
];

/**
 * Why a Certificate needs a new certificate now, or undefined when its Secret is current: the
 * first reason of {@link TRIGGER_CHAIN} (the Secret exists with both keys, names this
 * Certificate and its issuer, holds a certificate for the spec's names and CA flag, and is not
 * past its renewal time).
 */
export function issuanceReason(cert: Certificate, secret: SecretView | undefined, now: Date): string | undefined {
  for (const policy of TRIGGER_CHAIN) {
    const reason = policy(cert, secret, now);
    if (reason) return reason;
  }
  return undefined;
}

/** The certificate's DNS names are the spec's (order aside). */
function sameNames(x509: X509Certificate, cert: Certificate): boolean {
  const have = (x509.subjectAltName ?? '')
    .split(', ')
    .filter((s) => s.startsWith('DNS:'))
    .map((s) => s.slice(4))
    .sort();
  return JSON.stringify(have) === JSON.stringify([...(cert.spec.dnsNames ?? [])].sort());
}

/** Which key pair signs a Certificate: its own new key (self-signed) or a CA Secret's. */
export type Signer = { self: true } | { self: false; secret: { namespace: string; name: string } };

/**
 * The signer an issuer stands for (pkg/controller/certificaterequests/{selfsigned,ca}): a CA
 * issuer's Secret lives in the Certificate's namespace for an Issuer and in
 * {@link CLUSTER_RESOURCE_NAMESPACE} for a ClusterIssuer.
 * @returns undefined for an issuer type the stand-in does not play (ACME, Vault, …).
 */
export function signerOf(issuer: Issuer, certNamespace: string): Signer | undefined {
  if (issuer.spec.selfSigned) return { self: true };
  if (!issuer.spec.ca) return undefined;
  const namespace = issuer.kind === 'ClusterIssuer' ? CLUSTER_RESOURCE_NAMESPACE : certNamespace;
  return { self: false, secret: { namespace, name: issuer.spec.ca.secretName } };
}

/**
 * An issuer's `Ready` condition (pkg/issuer/ca/setup.go): a self-signed issuer is ready; a CA
 * issuer while its Secret holds a key pair, else not ready, naming the Secret.
 */
export function issuerReadyCondition(signer: Signer, hasKeyPair: boolean): CmCondition {
  if (signer.self || hasKeyPair)
    return { type: 'Ready', status: 'True', reason: 'IsReady', message: 'Signing CA verified' };
  const { namespace, name } = signer.secret;
  return {
    type: 'Ready',
    status: 'False',
    reason: 'ErrGetKeyPair',
    message: `Error getting keypair for CA issuer: Secret ${namespace}/${name} is missing or has no tls.crt and tls.key`,
  };
}

/** An issuer's status with `ready` as its `Ready` condition, or undefined when that is what it has. */
export function issuerStatus(issuer: Issuer, ready: CmCondition, now: Date): { conditions: CmCondition[] } | undefined {
  const old = issuer.status?.conditions?.find((c) => c.type === 'Ready');
  if (old?.status === ready.status && old.reason === ready.reason) return undefined;
  const observedGeneration = issuer.metadata.generation ?? 1;
  return { conditions: setCondition(issuer.status?.conditions ?? [], { ...ready, observedGeneration }, now) };
}

/** A certificate just issued, PEM. */
export interface Issued {
  /** tls.crt: the leaf and any intermediates, not a self-signed root (pkg/util/pki/parse_certificate_chain.go). */
  chain: string;
  key: string;
  /** ca.crt: the root of the chain; the certificate itself when self-signed. */
  ca: string;
}

/**
 * The Secret cert-manager writes for an issued certificate (internal/controller/certificates/
 * issuing/internal/secret.go): type `kubernetes.io/tls`, `tls.crt`, `tls.key`, `ca.crt`, and the
 * annotations naming the Certificate and its issuer.
 */
export function secretFor(cert: Certificate, issued: Issued) {
  const ref = cert.spec.issuerRef;
  const b64 = (s: string) => Buffer.from(s).toString('base64');
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    type: 'kubernetes.io/tls',
    metadata: {
      name: cert.spec.secretName,
      namespace: cert.metadata.namespace,
      labels: { 'controller.cert-manager.io/fao': 'true' },
      annotations: {
        [SECRET_ANNOTATIONS.certificateName]: cert.metadata.name,
        [SECRET_ANNOTATIONS.issuerName]: ref.name,
        [SECRET_ANNOTATIONS.issuerKind]: issuerKind(ref),
        [SECRET_ANNOTATIONS.issuerGroup]: ref.group ?? 'cert-manager.io',
        [SECRET_ANNOTATIONS.commonName]: cert.spec.commonName ?? '',
        [SECRET_ANNOTATIONS.altNames]: (cert.spec.dnsNames ?? []).join(','),
      },
    },
    data: { 'tls.crt': b64(issued.chain), 'tls.key': b64(issued.key), 'ca.crt': b64(issued.ca) },
  };
}

/** Replaces (or adds) the condition of `next.type`, keeping its transition time when the status is unchanged. */
export function setCondition(conditions: readonly CmCondition[], next: CmCondition, now: Date): CmCondition[] {
  const old = conditions.find((c) => c.type === next.type);
  const lastTransitionTime = old?.status === next.status ? old.lastTransitionTime : iso(now);
  return [...conditions.filter((c) => c.type !== next.type), { ...next, lastTransitionTime }];
}

/**
 * A Certificate's status once its Secret holds `x509` (internal/controller/certificates/
 * readiness): `Ready=True`, the validity, the renewal time, `revision` counted up when a new
 * certificate was issued, no `Issuing` condition.
 */
export function readyStatus(cert: Certificate, x509: X509Certificate, issuedNow: boolean, now: Date) {
  const notBefore = new Date(x509.validFrom);
  const notAfter = new Date(x509.validTo);
  const conditions = setCondition(
    (cert.status?.conditions ?? []).filter((c) => c.type !== 'Issuing'),
    {
      type: 'Ready',
      status: 'True',
      reason: 'Ready',
      message: 'Certificate is up to date and has not expired',
      ...(cert.metadata.generation !== undefined ? { observedGeneration: cert.metadata.generation } : {}),
    },
    now,
  );
  const revision = (cert.status?.revision ?? 0) + (issuedNow ? 1 : 0);
  return {
    ...cert.status,
    conditions,
    notBefore: iso(notBefore),
    notAfter: iso(notAfter),
    renewalTime: iso(renewalTime(notBefore, notAfter, cert.spec.renewBefore)),
    ...(revision ? { revision } : {}),
  };
}

/** RFC 3339 to the second, as Kubernetes stores times. */
export const iso = (d: Date) => d.toISOString().replace(/\.\d{3}Z$/, 'Z');

/**
 * The Certificate a webhook configuration's {@link INJECT_CA_FROM} names
 * (pkg/controller/cainjector/sources.go `certificateDataSource`).
 * @returns undefined when there is no such annotation, or it is not `<namespace>/<name>`.
 */
export function injectFrom(
  annotations: Record<string, string> | undefined,
): { namespace: string; name: string } | undefined {
  const value = annotations?.[INJECT_CA_FROM];
  const m = value ? /^([a-z0-9.-]+)\/([a-z0-9.-]+)$/.exec(value) : null;
  return m ? { namespace: m[1]!, name: m[2]! } : undefined;
}
