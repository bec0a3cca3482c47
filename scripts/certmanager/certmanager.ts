/**
 * A stand-in for cert-manager's controller and cainjector, for tests and `npm start` on a
 * machine where cert-manager's binaries cannot be had (the module proxy does not serve its
 * `cmd/*` modules). It plays what the manifests and Knative's cluster-local TLS use and nothing
 * more: self-signed and CA Issuers and ClusterIssuers; Certificates → `kubernetes.io/tls`
 * Secrets with `tls.crt`, `tls.key`, `ca.crt` and cert-manager's status; renewal when due or
 * asked for (`cmctl renew`'s `Issuing` condition); `cert-manager.io/inject-ca-from` on
 * ValidatingWebhookConfigurations → `caBundle`. Its rules are in ./decide.ts, each citing the
 * upstream file it follows. It polls (every `everyMs`) instead of watching: a handful of objects.
 */
import { X509Certificate } from 'node:crypto';
import { isDeepStrictEqual } from 'node:util';
import { mkdirSync } from 'node:fs';
import {
  AdmissionregistrationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  type KubeConfig,
  type V1Secret,
} from '@kubernetes/client-node';
import { apiStatus, isNotFound } from '../../functions/lib/kube.ts';
import { firstLine, sleep } from '../lib/wait.ts';
import {
  injectFrom,
  issuanceReason,
  issuerReadyCondition,
  issuerStatus,
  issuerKind,
  readyStatus,
  secretFor,
  setCondition,
  signerOf,
  type Certificate,
  type Issued,
  type Issuer,
  type Signer,
} from './decide.ts';
import { issue, type SigningPair } from './issue.ts';

const GROUP = 'cert-manager.io';
const VERSION = 'v1';

/** Options of {@link startCertManager}. */
export interface CertManagerOptions {
  /** A folder for openssl's scratch files (removed after each issuance). */
  dir: string;
  log: (line: string) => void;
  /** Pause between passes, in milliseconds (default 500). */
  everyMs?: number;
}

/** The running stand-in. */
export interface CertManager {
  /** Runs one pass now (issue what is due, inject what changed); resolves when it is done. */
  pass(): Promise<void>;
  /** Stops after the current pass. */
  stop(): Promise<void>;
}

/**
 * Starts the stand-in against `kc` (acting as its user: the cluster admin here, as cert-manager's
 * own ServiceAccount would be broad). A failing pass is logged (first line only: no Secret data)
 * and retried on the next.
 */
export function startCertManager(kc: KubeConfig, opts: CertManagerOptions): CertManager {
  mkdirSync(opts.dir, { recursive: true });
  const api = {
    custom: kc.makeApiClient(CustomObjectsApi),
    core: kc.makeApiClient(CoreV1Api),
    adm: kc.makeApiClient(AdmissionregistrationV1Api),
  };
  let stopped = false;
  let last = '';
  let running = Promise.resolve();
  const backoff: Backoff = new Map();
  const pass = () => {
    running = running.then(async () => {
      try {
        await reconcileAll(api, { dir: opts.dir, log: opts.log, backoff });
        last = '';
      } catch (err) {
        // 429: the API server sheds load while it starts (priority and fairness); the next pass retries.
        if (apiStatus(err) === 429) return;
        const msg = firstLine(err);
        if (msg !== last) opts.log(`[cert-manager] pass failed (retrying): ${msg}`);
        last = msg;
      }
    });
    return running;
  };
  const loop = (async () => {
    while (!stopped) {
      await pass();
      await sleep(opts.everyMs ?? 500);
    }
  })();
  return {
    pass,
    stop: async () => {
      stopped = true;
      await loop;
    },
  };
}

type Api = { custom: CustomObjectsApi; core: CoreV1Api; adm: AdmissionregistrationV1Api };

/** Per object (`<kind> <namespace>/<name>`): its failures and issuances, to back off and to log a change once. */
type Backoff = Map<string, { failures: number; until: number; last: string; issued: number[] }>;

/** Issuances of one Certificate within a minute beyond which it waits (two Certificates fighting over one Secret). */
const ISSUANCES_PER_MINUTE = 3;

/**
 * One pass: issuers' status, every Certificate, then cainjector. Each object is handled on its
 * own, as cert-manager's controllers do: one that fails (an unsupported key, a bad duration, a
 * conflict) waits with exponential backoff up to a minute, gets `Ready=False` with the reason
 * when it is a Certificate, and does not hold up the others.
 */
async function reconcileAll(
  api: Api,
  o: { dir: string; log: (line: string) => void; backoff: Backoff },
): Promise<void> {
  const issuers = await listIssuers(api);
  const certs = (await listOrNone(api, 'certificates')) as Certificate[];
  const isolated = async (
    key: string,
    work: () => Promise<string | undefined>,
    onError?: (msg: string) => Promise<void>,
  ) => {
    const b = o.backoff.get(key) ?? { failures: 0, until: 0, last: '', issued: [] };
    if (Date.now() < b.until) return;
    try {
      const issued = await work();
      b.failures = 0;
      b.last = '';
      b.issued = [...b.issued.filter((t) => t > Date.now() - 60_000), ...(issued ? [Date.now()] : [])];
      if (b.issued.length >= ISSUANCES_PER_MINUTE) {
        o.log(
          `[cert-manager] ${key} was issued ${b.issued.length} times within a minute (two Certificates for one Secret?); waiting 30 s`,
        );
        b.issued = [];
        b.until = Date.now() + 30_000;
      }
    } catch (err) {
      if (apiStatus(err) === 429) return; // the API server sheds load while it starts
      const msg = firstLine(err);
      b.failures++;
      b.until = Date.now() + Math.min(60_000, 500 * 2 ** b.failures);
      if (msg !== b.last) o.log(`[cert-manager] ${key}: ${msg} (retrying)`);
      b.last = msg;
      await onError?.(msg).catch(() => undefined);
    }
    o.backoff.set(key, b);
  };
  for (const i of issuers)
    await isolated(`${i.kind} ${i.metadata.namespace ?? ''}/${i.metadata.name}`, async () => {
      await markIssuerReady(api, i);
      return undefined;
    });
  for (const cert of certs)
    await isolated(
      `Certificate ${cert.metadata.namespace}/${cert.metadata.name}`,
      () => reconcileCertificate(api, { cert, issuers, dir: o.dir, log: o.log }),
      (msg) => markFailed(api, cert, msg),
    );
  await injectCABundles(api, certs, o.log);
}

/** Lists a cert-manager kind in every namespace (none while its CRD is not installed). */
async function listOrNone(api: Api, plural: string): Promise<unknown[]> {
  try {
    const list = (await api.custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural })) as {
      items: unknown[];
    };
    return list.items;
  } catch (err) {
    if (isNotFound(err)) return [];
    throw err;
  }
}

async function listIssuers(api: Api): Promise<Issuer[]> {
  const issuers = (await listOrNone(api, 'issuers')) as Issuer[];
  const cluster = (await listOrNone(api, 'clusterissuers')) as Issuer[];
  return [...issuers.map((i) => ({ ...i, kind: 'Issuer' })), ...cluster.map((i) => ({ ...i, kind: 'ClusterIssuer' }))];
}

/**
 * An issuer's `Ready` condition (Knative and `kubectl wait` look for it): a self-signed one is
 * ready; a CA one while its Secret holds a key pair (pkg/issuer/ca/setup.go), else not ready,
 * naming the Secret. Written only when it changes.
 */
async function markIssuerReady(api: Api, issuer: Issuer): Promise<void> {
  const signer = signerOf(issuer, issuer.metadata.namespace ?? '');
  if (!signer) return;
  const hasPair = !signer.self && !!(await signingPair(api, signer.secret));
  const status = issuerStatus(issuer, issuerReadyCondition(signer, hasPair), new Date());
  if (!status) return;
  const body = { ...issuer, apiVersion: `${GROUP}/${VERSION}`, status };
  await writeIssuerStatus(api, issuer, body);
}

/** Replaces an Issuer's or ClusterIssuer's status with `body`'s. */
function writeIssuerStatus(api: Api, issuer: Issuer, body: object): Promise<unknown> {
  const { name, namespace } = issuer.metadata;
  const at = { group: GROUP, version: VERSION, name, body };
  return issuer.kind === 'ClusterIssuer'
    ? api.custom.replaceClusterCustomObjectStatus({ ...at, plural: 'clusterissuers' })
    : api.custom.replaceNamespacedCustomObjectStatus({ ...at, plural: 'issuers', namespace: namespace! });
}

/** A Certificate that could not be issued: `Ready=False` with the reason, as cert-manager reports a failed issuance. */
async function markFailed(api: Api, cert: Certificate, message: string): Promise<void> {
  const fresh = (await api.custom.getNamespacedCustomObject(certificateAt(cert))) as Certificate;
  const conditions = setCondition(
    fresh.status?.conditions ?? [],
    { type: 'Ready', status: 'False', reason: 'Failed', message, observedGeneration: fresh.metadata.generation ?? 1 },
    new Date(),
  );
  if (isDeepStrictEqual(conditions, fresh.status?.conditions)) return;
  await api.custom.replaceNamespacedCustomObjectStatus({
    ...certificateAt(cert),
    body: { ...fresh, status: { ...fresh.status, conditions } },
  });
}

/** Where a Certificate is, for the custom objects API. */
const certificateAt = (cert: Certificate) => ({
  group: GROUP,
  version: VERSION,
  plural: 'certificates',
  namespace: cert.metadata.namespace,
  name: cert.metadata.name,
});

/** Reads a Secret, or undefined when there is none. */
async function readSecret(api: Api, namespace: string, name: string): Promise<V1Secret | undefined> {
  return api.core.readNamespacedSecret({ namespace, name }).catch((err: unknown) => {
    if (isNotFound(err)) return undefined;
    throw err;
  });
}

/**
 * One Certificate: {@link issueWhenDue}, then its status when that changed.
 * @returns why it was issued now, if it was.
 */
async function reconcileCertificate(
  api: Api,
  o: { cert: Certificate; issuers: Issuer[]; dir: string; log: (line: string) => void },
): Promise<string | undefined> {
  const { cert } = o;
  const signer = signerFor(cert, o.issuers);
  if (!signer) return undefined;
  const now = new Date();
  const held = await issueWhenDue(api, { ...o, signer, now });
  if (!held) return undefined;
  const x509 = new X509Certificate(Buffer.from(held.secret.data!['tls.crt']!, 'base64'));
  const status = readyStatus(cert, x509, !!held.reason, now);
  // The API server returns fields in its own order: compare as values, not as text.
  if (!held.reason && isDeepStrictEqual(status, cert.status)) return undefined;
  await api.custom.replaceNamespacedCustomObjectStatus({ ...certificateAt(cert), body: { ...cert, status } });
  return held.reason;
}

/**
 * Issues into the Certificate's Secret when {@link issuanceReason} says so and the issuer can
 * sign (a CA issuer whose Secret is not there yet waits, as cert-manager's does).
 * @returns the Secret as it now is and the reason it was issued (none: it was current), or
 *   undefined while it cannot be issued.
 */
async function issueWhenDue(
  api: Api,
  o: { cert: Certificate; signer: Signer; now: Date; dir: string; log: (line: string) => void },
): Promise<{ secret: V1Secret; reason?: string } | undefined> {
  const { cert, signer } = o;
  const current = await readSecret(api, cert.metadata.namespace, cert.spec.secretName);
  const reason = issuanceReason(
    cert,
    current && { data: current.data, annotations: current.metadata?.annotations },
    o.now,
  );
  if (!reason) return current && { secret: current };
  const pair = signer.self ? undefined : await signingPair(api, signer.secret);
  if (!signer.self && !pair) return undefined;
  const secret = await writeIssued(api, { cert, current, issued: await issue(cert, pair, o.dir) });
  o.log(
    `[cert-manager] issued ${cert.metadata.namespace}/${cert.metadata.name} (${reason}) into Secret ${cert.spec.secretName}`,
  );
  return { secret, reason };
}

/** Writes an issued certificate into the Certificate's Secret (created, or replaced at the version read). */
async function writeIssued(
  api: Api,
  o: { cert: Certificate; current: V1Secret | undefined; issued: Issued },
): Promise<V1Secret> {
  const fresh = secretFor(o.cert, o.issued);
  const { namespace } = o.cert.metadata;
  if (!o.current) return api.core.createNamespacedSecret({ namespace, body: fresh });
  // Others' labels, annotations and keys stay (cert-manager applies only its own fields); the
  // resourceVersion makes a replace over someone else's newer write a conflict, retried next pass.
  const m = o.current.metadata ?? {};
  const body = {
    ...fresh,
    metadata: {
      ...fresh.metadata,
      labels: { ...m.labels, ...fresh.metadata.labels },
      annotations: { ...m.annotations, ...fresh.metadata.annotations },
      resourceVersion: m.resourceVersion,
    },
    data: { ...o.current.data, ...fresh.data },
  };
  return api.core.replaceNamespacedSecret({ namespace, name: o.cert.spec.secretName, body });
}

/** The signer of the issuer a Certificate names (an Issuer in its namespace, or a ClusterIssuer), if it is one the stand-in plays. */
function signerFor(cert: Certificate, issuers: readonly Issuer[]) {
  const ref = cert.spec.issuerRef;
  const { namespace } = cert.metadata;
  const issuer = issuers.find(
    (i) =>
      i.kind === issuerKind(ref) &&
      i.metadata.name === ref.name &&
      (i.kind === 'ClusterIssuer' || i.metadata.namespace === namespace),
  );
  return issuer && signerOf(issuer, namespace);
}

/** A CA issuer's key pair, or undefined while its Secret is missing or incomplete. */
async function signingPair(api: Api, at: { namespace: string; name: string }): Promise<SigningPair | undefined> {
  const s = await readSecret(api, at.namespace, at.name);
  const text = (k: string) => (s?.data?.[k] ? Buffer.from(s.data[k], 'base64').toString() : undefined);
  const cert = text('tls.crt');
  const key = text('tls.key');
  if (!cert || !key) return undefined;
  return { cert, key, root: text('ca.crt') ?? cert };
}

/**
 * cainjector: every webhook of a ValidatingWebhookConfiguration annotated with
 * `cert-manager.io/inject-ca-from` gets the `ca.crt` of that Certificate's Secret as `caBundle`.
 */
async function injectCABundles(api: Api, certs: Certificate[], log: (line: string) => void): Promise<void> {
  const configs = await api.adm.listValidatingWebhookConfiguration();
  for (const vwc of configs.items) {
    const from = injectFrom(vwc.metadata?.annotations);
    const ca = from && (await caOf(api, certs, from));
    if (!ca || (vwc.webhooks ?? []).every((h) => h.clientConfig.caBundle === ca)) continue;
    for (const h of vwc.webhooks ?? []) h.clientConfig.caBundle = ca;
    await api.adm.replaceValidatingWebhookConfiguration({ name: vwc.metadata!.name!, body: vwc });
    log(
      `[cert-manager] injected the CA of ${from.namespace}/${from.name} into ValidatingWebhookConfiguration ${vwc.metadata!.name}`,
    );
  }
}

/** The `ca.crt` (base64) of the Secret of the Certificate `at`, or undefined while there is none. */
async function caOf(
  api: Api,
  certs: Certificate[],
  at: { namespace: string; name: string },
): Promise<string | undefined> {
  const cert = certs.find((c) => c.metadata.namespace === at.namespace && c.metadata.name === at.name);
  const secret = cert && (await readSecret(api, at.namespace, cert.spec.secretName));
  return secret?.data?.['ca.crt'];
}
