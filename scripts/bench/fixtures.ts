/**
 * Objects the bench creates, written against the API (SPEC §1) with the bench's own client
 * and constants, so nothing here moves when the product's code changes.
 */
import { randomUUID } from 'node:crypto';
// undici's own fetch: Node's built-in fetch bundles another undici and rejects this Agent.
import { Agent, fetch } from 'undici';
import type { BenchClient, KubeObject } from './client.ts';
import { CLIENT_CONCURRENCY, inParallel } from './client.ts';
import { WatchedCollection } from './collection.ts';

/** apiVersion of the project's kinds (SPEC §1). */
export const GROUP_VERSION = 'infrastructure.cluster.x-k8s.io/v1beta2';
/** Collection path of TerraformClusterIdentities (cluster-scoped). */
export const IDENTITIES = `/apis/${GROUP_VERSION}/terraformclusteridentities`;
/** Namespace of the operator's source Secrets. */
export const SOURCE_NAMESPACE = 'captf-system';
/** Label every namespace a bench identity allows carries (the identities select on it). */
export const ALLOWED_LABEL = 'captf-bench/allowed';
/** Label selector of mirrors (SPEC §3). */
export const MIRROR_SELECTOR = 'labelSelector=captf.io%2Fmirrored%3Dtrue';

/** A consumer kind the bench creates. */
export type ConsumerPlural = 'terraformmachines' | 'terraformclusters';
const KIND: Record<ConsumerPlural, string> = {
  terraformmachines: 'TerraformMachine',
  terraformclusters: 'TerraformCluster',
};

/** Collection path of a consumer kind, in one namespace or all. */
export const consumersPath = (plural: ConsumerPlural, namespace?: string): string =>
  `/apis/${GROUP_VERSION}${namespace ? `/namespaces/${namespace}` : ''}/${plural}`;

/** A consumer as the bench reads it. */
export type Consumer = KubeObject & { status?: { conditions?: { type: string; status: string; reason?: string }[] } };

/** True when the consumer has condition `type` with status True. */
export const hasTrue = (c: Consumer, type: string): boolean =>
  Boolean(c.status?.conditions?.some((x) => x.type === type && x.status === 'True'));

/** Creates namespaces (labelled as allowed) with bounded concurrency. */
export async function createNamespaces(
  admin: BenchClient,
  names: readonly string[],
  labels: Record<string, string> = { [ALLOWED_LABEL]: 'true' },
): Promise<void> {
  await inParallel(names.length, CLIENT_CONCURRENCY, (i) =>
    admin.call('POST', '/api/v1/namespaces', { metadata: { name: names[i], labels } }),
  );
}

/** Creates or replaces the data of a source Secret in {@link SOURCE_NAMESPACE}. */
export async function putSourceSecret(admin: BenchClient, name: string, data: Record<string, string>): Promise<void> {
  const b64 = Object.fromEntries(Object.entries(data).map(([k, v]) => [k, Buffer.from(v).toString('base64')]));
  const body = { metadata: { name, namespace: SOURCE_NAMESPACE }, type: 'Opaque', data: b64 };
  const r = await admin.raw('POST', `/api/v1/namespaces/${SOURCE_NAMESPACE}/secrets`, body);
  if (r.status === 409) await admin.call('PUT', `/api/v1/namespaces/${SOURCE_NAMESPACE}/secrets/${name}`, body);
  else if (r.status >= 300) throw new Error(`creating Secret ${name}: HTTP ${r.status}`);
}

/** Creates identity `name` on source Secret `secret`, allowing `allowedNamespaces` (SPEC §2). */
export async function createIdentity(
  admin: BenchClient,
  identity: { name: string; secret: string; allowedNamespaces: unknown; labels?: Record<string, string> },
): Promise<void> {
  await admin.call('POST', IDENTITIES, identityBody(identity));
}

/** The body of an identity on the source Secret `secret` (in the bench's source namespace). */
export const identityBody = (identity: {
  name: string;
  secret: string;
  allowedNamespaces: unknown;
  labels?: Record<string, string>;
}) => ({
  apiVersion: GROUP_VERSION,
  kind: 'TerraformClusterIdentity',
  metadata: { name: identity.name, labels: identity.labels ?? {} },
  spec: {
    secretRef: { name: identity.secret, namespace: SOURCE_NAMESPACE },
    allowedNamespaces: identity.allowedNamespaces,
  },
});

/** The body of a consumer of `plural` named `name` on identity `identity`. */
export const consumerBody = (
  plural: ConsumerPlural,
  name: string,
  identity: string,
  labels: Record<string, string> = {},
) => ({
  apiVersion: GROUP_VERSION,
  kind: KIND[plural],
  metadata: { name, labels },
  spec: { identityRef: { name: identity } },
});

/**
 * Creates consumers `(namespace, name)` of `plural` on `identity` at the bench's client concurrency.
 * @returns milliseconds from the first request to the last answer.
 */
export async function createConsumers(
  admin: BenchClient,
  consumers: {
    plural: ConsumerPlural;
    items: readonly { namespace: string; name: string }[];
    identity: string;
    labels?: Record<string, string>;
  },
): Promise<number> {
  const { plural, items, identity, labels = {} } = consumers;
  const t0 = performance.now();
  await inParallel(items.length, CLIENT_CONCURRENCY, (i) =>
    admin.call(
      'POST',
      consumersPath(plural, items[i]!.namespace),
      consumerBody(plural, items[i]!.name, identity, labels),
    ),
  );
  return performance.now() - t0;
}

/** Items `name-<i>` spread over namespaces, `perNamespace` in each, in namespace order. */
export function spreadOver(
  namespaces: readonly string[],
  perNamespace: number,
  prefix: string,
): { namespace: string; name: string }[] {
  return namespaces.flatMap((namespace) =>
    Array.from({ length: perNamespace }, (_, i) => ({ namespace, name: `${prefix}-${i}` })),
  );
}

/** A mirror as the bench reads it. */
export type Mirror = KubeObject & { data?: Record<string, string> };

/** A watched collection of every mirror in the cluster (label selector, all namespaces). */
export const watchMirrors = (admin: BenchClient): Promise<WatchedCollection<Mirror>> =>
  new WatchedCollection<Mirror>(admin, '/api/v1/secrets', MIRROR_SELECTOR).start();

/** Name of the mirror of `identity` (SPEC §3; the bench's identities are short). */
export const mirrorOf = (identity: string): string => `captf-creds-${identity}`;

/** A CloudEvent in binary HTTP mode, as Knative delivers it. */
export interface EventRequest {
  headers: Record<string, string>;
  body: string;
}

/** `ev` with the `Authorization` header a sender of the function signs with (system.ts `sign`). */
export const signedWith = (authorization: string, ev: EventRequest): EventRequest => ({
  ...ev,
  headers: { ...ev.headers, authorization },
});

/** A PingSource tick of the named PingSource (manifests/base/eventing.yaml). */
export function pingEvent(pingSource: 'captf-resync' | 'captf-identity-status'): EventRequest {
  return {
    headers: {
      'ce-specversion': '1.0',
      'ce-id': randomUUID(),
      'ce-type': 'dev.knative.sources.ping',
      'ce-source': `/apis/v1/namespaces/${SOURCE_NAMESPACE}/pingsources/${pingSource}`,
      'content-type': 'application/json',
    },
    body: '{}',
  };
}

/** A Reference-mode ApiServerSource update event about a consumer. */
export function consumerEvent(plural: ConsumerPlural, namespace: string, name: string): EventRequest {
  const kind = KIND[plural];
  return {
    headers: {
      'ce-specversion': '1.0',
      'ce-id': randomUUID(),
      'ce-type': 'dev.knative.apiserver.ref.update',
      'ce-source': 'https://127.0.0.1',
      'ce-subject': `/apis/${GROUP_VERSION}/namespaces/${namespace}/${plural}/${name}`,
      'ce-kind': kind,
      'ce-apiversion': GROUP_VERSION,
      'ce-name': name,
      'ce-namespace': namespace,
      'content-type': 'application/json',
    },
    body: JSON.stringify({ kind, namespace, name, apiVersion: GROUP_VERSION }),
  };
}

const patient = new Agent({ headersTimeout: 0, bodyTimeout: 0 });

/**
 * POSTs an event and waits for the answer (however long the function takes).
 * @returns HTTP status, parsed JSON answer and milliseconds from send to answer.
 */
export async function postEvent(url: string, ev: EventRequest): Promise<{ status: number; body: unknown; ms: number }> {
  const t0 = performance.now();
  // A resync may take longer than fetch's default 300 s header timeout: the bench waits.
  const res = await fetch(url, {
    method: 'POST',
    headers: ev.headers,
    body: ev.body,
    signal: AbortSignal.timeout(1_800_000),
    dispatcher: patient,
  });
  const text = await res.text();
  const ms = performance.now() - t0;
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // keep text
  }
  return { status: res.status, body, ms };
}
