/**
 * Consumer kinds from configuration and the API lookups every function shares: an
 * identity's consumers (field selector on `spec.identityRef.name`, SPEC §1/§7/§10) and
 * paginated lists of every consumer (resync, SPEC §12). Reads only; never cached.
 */
import { DEFAULT_CONSUMER_KINDS, FIELD_MANAGER, IDENTITY_REF_FIELD, type Consumer, type ConsumerKind } from './api.ts';
import { RESET_MANAGER } from './conditions.ts';
import { setTimeout as sleep } from 'node:timers/promises';
import { isDns1123Label } from './allowed-namespaces.ts';
import { isTransportError } from './api-errors.ts';
import { apiStatus, describeError, isNotFound, listAllPages, type Clients } from './kube.ts';
import { consumerObjects } from './objects.ts';

/** Environment variable listing consumer kinds: `group/version/Kind[/plural]`, comma-separated. */
export const CONSUMER_KINDS_ENV = 'CAPTF_CONSUMER_KINDS';

/** Default page size of list calls (SPEC §12: paginated). */
export const PAGE_SIZE = 250;

let currentPageSize = PAGE_SIZE;

/** Objects per page of every list call of this process (`CAPTF_PAGE_SIZE`, default 250). */
export function pageSize(): number {
  return currentPageSize;
}

/**
 * Reads `CAPTF_PAGE_SIZE` (1–5000, default {@link PAGE_SIZE}) and makes it the page size.
 * @throws Error naming the variable when it is out of range.
 */
export function setPageSizeFromEnv(env: NodeJS.ProcessEnv): void {
  const raw = env.CAPTF_PAGE_SIZE?.trim() || String(PAGE_SIZE);
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1 || n > 5000)
    throw new Error(`CAPTF_PAGE_SIZE=${raw} must be an integer from 1 to 5000`);
  currentPageSize = n;
}

/**
 * Parses consumer kinds from `$CAPTF_CONSUMER_KINDS` (e.g.
 * `infrastructure.cluster.x-k8s.io/v1beta2/TerraformCluster`); the plural defaults to the
 * lower-cased kind + "s". Unset or empty → the two shipped kinds.
 * @throws Error naming the malformed entry.
 */
export function consumerKindsFromEnv(env: NodeJS.ProcessEnv = process.env): ConsumerKind[] {
  const raw = env[CONSUMER_KINDS_ENV]?.trim();
  if (!raw) return DEFAULT_CONSUMER_KINDS.map((k) => ({ ...k }));
  return raw.split(',').map((entry) => {
    const parts = entry.trim().split('/');
    if (parts.length < 3 || parts.length > 4 || parts.some((p) => !p)) {
      throw new Error(`${CONSUMER_KINDS_ENV}: ${JSON.stringify(entry)} is not group/version/Kind[/plural]`);
    }
    const [group, version, kind, plural] = parts as [string, string, string, string | undefined];
    return { group, version, kind, plural: plural ?? `${kind.toLowerCase()}s` };
  });
}

/** The configured kind matching an `apiVersion` and `kind`, if any. */
export function findConsumerKind(
  kinds: readonly ConsumerKind[],
  apiVersion: string,
  kind: string,
): ConsumerKind | undefined {
  return kinds.find((k) => `${k.group}/${k.version}` === apiVersion && k.kind === kind);
}

/** `group/version/Kind`, as configuration and messages spell a kind. */
export const kindName = (k: ConsumerKind): string => `${k.group}/${k.version}/${k.kind}`;

/**
 * The configured kinds with their scope, as the API server's discovery (`GET
 * /apis/<group>/<version>`, one request per group/version) serves them, so that a
 * cluster-scoped kind is never listed in a namespace. A CRD's scope cannot change, so once
 * at start is enough. Without `$CAPTF_CONSUMER_KINDS` the shipped kinds are returned as
 * they are (namespaced, by their CRDs) and nothing is asked.
 * @throws Error naming the kind and what to change: not served, served under another plural
 *   than the configured one, or discovery failed (the process should not start).
 */
export async function discoverConsumerKinds(
  clients: Clients,
  env: NodeJS.ProcessEnv = process.env,
): Promise<ConsumerKind[]> {
  const kinds = consumerKindsFromEnv(env);
  if (!env[CONSUMER_KINDS_ENV]?.trim()) return kinds;
  return Promise.all(kinds.map((k) => discoverOne(clients, k)));
}

/** Attempts of a discovery request at start, and each one's deadline (ms). */
const DISCOVERY_ATTEMPTS = 3;
const DISCOVERY_DEADLINE_MS = 10_000;

async function discoverOne(clients: Clients, k: ConsumerKind): Promise<ConsumerKind> {
  const found = await servedResource(clients, k);
  if (!found)
    throw new Error(
      `${CONSUMER_KINDS_ENV}: ${kindName(k)} is not served by the API server; install its CRD or remove it from the list`,
    );
  // Discovery's answer is foreign text: only a valid plural and a boolean scope are used or shown.
  if (!isDns1123Label(found.name) || typeof found.namespaced !== 'boolean')
    throw new Error(`${CONSUMER_KINDS_ENV}: the API server's discovery answer for ${kindName(k)} is not usable`);
  if (found.name !== k.plural)
    throw new Error(
      `${CONSUMER_KINDS_ENV}: ${kindName(k)} is served as ${JSON.stringify(found.name)}, not ${JSON.stringify(k.plural)}; write ${kindName(k)}/${found.name}`,
    );
  return { ...k, namespaced: found.namespaced };
}

/**
 * The served resource of `k`, or undefined when its group/version does not serve it (404
 * included). A failed or hung request is tried {@link DISCOVERY_ATTEMPTS} times, each within
 * {@link DISCOVERY_DEADLINE_MS}, 1 s and 2 s apart.
 * @throws Error saying the API server could not be asked (or answered nonsense), and why.
 */
async function servedResource(
  clients: Clients,
  k: ConsumerKind,
): Promise<{ name?: unknown; namespaced?: unknown } | undefined> {
  let last: unknown;
  for (let attempt = 1; attempt <= DISCOVERY_ATTEMPTS; attempt++) {
    if (attempt > 1) await sleep(1000 * (attempt - 1));
    try {
      return await withDeadline(clients.discovery.resourceOf(`${k.group}/${k.version}`, k.kind), DISCOVERY_DEADLINE_MS);
    } catch (err) {
      if (isNotFound(err)) return undefined;
      last = err;
    }
  }
  const why =
    apiStatus(last) !== undefined || isTransportError(last) || last instanceof DeadlineError
      ? describeError(last)
      : 'its answer could not be read';
  throw new Error(
    `${CONSUMER_KINDS_ENV}: could not discover ${kindName(k)} from the API server (${DISCOVERY_ATTEMPTS} attempts): ${why}`,
    { cause: last },
  );
}

class DeadlineError extends Error {}

/** `p`, or a {@link DeadlineError} after `ms` (the request itself is left to finish). */
async function withDeadline<T>(p: Promise<T>, ms: number): Promise<T> {
  const timer = new AbortController();
  try {
    return await Promise.race([
      p,
      sleep(ms, undefined, { signal: timer.signal }).then(() => {
        throw new DeadlineError(`no answer within ${ms / 1000} s`);
      }),
    ]);
  } finally {
    timer.abort();
  }
}

/**
 * Whether an object of `kind` can be where a request says it is (SPEC §4: a bad event answers
 * 4xx): a namespaced kind needs a namespace, a cluster-scoped one has none.
 * @returns the reason it cannot, or undefined.
 */
export function scopeMismatch(kind: ConsumerKind, namespace: string | undefined): string | undefined {
  const clusterScoped = kind.namespaced === false;
  if (!namespace && !clusterScoped) return `${kind.kind} is namespaced, but no namespace was given`;
  if (namespace && clusterScoped) return `${kind.kind} is cluster-scoped, but namespace ${namespace} was given`;
  return undefined;
}

/**
 * Lists every object of one consumer kind in all namespaces (or one), page by page (an
 * expired continue token restarts the list: kube.ts `listAllPages`). A cluster-scoped kind has
 * nothing in a namespace, so it is not asked there.
 * Items get `apiVersion` and `kind` filled in (list items may omit them).
 * @param opts.fieldSelector e.g. `spec.identityRef.name=aws-prod`.
 * @param keep what to keep of each consumer, as each page arrives (a long list then holds
 *   only that: {@link slimConsumer}, or less); default the consumer itself.
 * @throws the API error of a failed page.
 */
export async function listConsumers<K = Consumer>(
  clients: Clients,
  kind: ConsumerKind,
  opts: { namespace?: string; fieldSelector?: string } = {},
  keep: (c: Consumer) => K = (c) => c as K,
): Promise<K[]> {
  if (opts.namespace && kind.namespaced === false) return [];
  const objects = consumerObjects(clients, kind);
  const list = await listAllPages(
    (cont) => objects.list({ ...opts, limit: currentPageSize, _continue: cont }),
    clients.logger,
    keep,
  );
  return list.items;
}

/**
 * What decisions and condition writes read of a consumer (SPEC §4, §16), kept from a listed
 * one so a pass over thousands holds no more: kind, name, namespace, UID, generation,
 * resourceVersion, deletionTimestamp, `spec.identityRef`, `status.conditions`, and of
 * `managedFields` only the condition types other managers claim (conditions.ts
 * `typesClaimedByOthers` reads nothing else; our own entry is most of it).
 */
export function slimConsumer(c: Consumer): Consumer {
  const md = c.metadata;
  const claims = (md.managedFields ?? []).flatMap((e) => {
    const conditions = (e.fieldsV1 as { 'f:status'?: { 'f:conditions'?: unknown } } | undefined)?.['f:status']?.[
      'f:conditions'
    ];
    if (!conditions || typeof conditions !== 'object' || e.manager === FIELD_MANAGER || e.manager === RESET_MANAGER)
      return [];
    const keys = Object.fromEntries(Object.keys(conditions).map((k) => [k, {}]));
    return [{ manager: e.manager, fieldsV1: { 'f:status': { 'f:conditions': keys } } }];
  });
  return {
    apiVersion: c.apiVersion,
    kind: c.kind,
    metadata: {
      name: md.name,
      namespace: md.namespace,
      uid: md.uid,
      generation: md.generation,
      resourceVersion: md.resourceVersion,
      ...(md.deletionTimestamp ? { deletionTimestamp: md.deletionTimestamp } : {}),
      ...(claims.length ? { managedFields: claims } : {}),
    },
    spec: c.spec?.identityRef ? { identityRef: c.spec.identityRef } : {},
    ...(c.status?.conditions ? { status: { conditions: c.status.conditions } } : {}),
  } as Consumer;
}

/**
 * Every consumer (of every configured kind) whose `spec.identityRef.name` is `identityName`,
 * deleting ones included.
 * @param opts.namespace restricts the lookup to one namespace.
 * @throws the API error of a failed list.
 */
export async function consumersOfIdentity(
  clients: Clients,
  kinds: readonly ConsumerKind[],
  identityName: string,
  opts: { namespace?: string } = {},
): Promise<Consumer[]> {
  const out: Consumer[] = [];
  for (const kind of kinds)
    out.push(
      ...(await listConsumers(clients, kind, { ...opts, fieldSelector: `${IDENTITY_REF_FIELD}=${identityName}` })),
    );
  return out;
}
