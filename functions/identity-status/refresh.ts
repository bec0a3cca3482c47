/**
 * SPEC §9: refreshing identities' `Ready` condition and `status.namespaces` against the API
 * server. The imperative shell around decide.ts: it reads (identities, consumers, mirror
 * metadata, the source Secret's existence), lets `decideStatus` decide, and writes the status
 * subresource only when something changed. It never creates or changes a mirror.
 *
 * Secrets are only ever read as metadata (`PartialObjectMetadata`), so this function never
 * receives credential data at all, let alone logs it.
 */
import pLimit from 'p-limit';
import { type ConsumerKind, type TerraformClusterIdentity } from '../lib/api.ts';
import { PAGE_SIZE, consumersOfIdentity, listConsumers } from '../lib/consumers.ts';
import {
  describeError,
  isForbidden,
  isNotFound,
  listAllPages,
  METADATA,
  METADATA_LIST,
  retryOnConflict,
  type Clients,
} from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import { identities } from '../lib/objects.ts';
import {
  ANNOTATION_IDENTITY,
  LABEL_MIRRORED,
  isOurs,
  isReservedSourceName,
  mirrorName,
  namesSecret,
  type SecretLike,
} from '../lib/mirror.ts';
import { decideStatus, statusApplyBody, type SourceState, type Usage } from './decide.ts';

/** What a refresh needs; built per request by the handler. */
export interface RefreshDeps {
  /** API clients of the function's user (their counter measures calls per request). */
  clients: Clients;
  consumerKinds: readonly ConsumerKind[];
  /** Identities refreshed at once during a ping (source GET + status write each). */
  concurrency: number;
  /** Label selector limiting which identities this instance refreshes; undefined = all. */
  identitySelector: string | undefined;
  logger: Logger;
  /** Clock for `lastTransitionTime`; default `new Date()`. */
  now?: () => Date;
}

/** The outcome for one identity; also the shape of its log line. */
export interface RefreshResult {
  identity: string;
  /** refreshed: status now matches; gone: the identity no longer exists (or left the selector); failed: an API error, retry. */
  outcome: 'refreshed' | 'gone' | 'failed';
  ready?: 'True' | 'False' | 'Unknown';
  reason?: string;
  namespaces?: string[];
  /** Fields that differed and were written (`Ready`, `namespaces`); empty when nothing was written. */
  changed?: string[];
  /** Short, safe description of the API error when `outcome` is failed. */
  error?: string;
  durationMs: number;
}

/**
 * Lists identities in scope, page by page (SPEC §12: paginated; an expired continue token restarts the list).
 * @param fieldSelector e.g. `metadata.name=aws-prod` to look one up.
 * @throws the API error of a failed page.
 */
async function listIdentities(deps: RefreshDeps, fieldSelector?: string): Promise<TerraformClusterIdentity[]> {
  const objects = identities(deps.clients);
  const labelSelector = deps.identitySelector;
  const list = await listAllPages(
    (cont) => objects.list({ limit: PAGE_SIZE, _continue: cont, labelSelector, fieldSelector }),
    deps.clients.logger,
  );
  return list.items;
}

/** One identity by name if it exists and is in scope (a field-selector list, so the label selector applies too). */
async function getIdentity(deps: RefreshDeps, name: string): Promise<TerraformClusterIdentity | undefined> {
  return (await listIdentities(deps, `metadata.name=${name}`))[0];
}

/** Mirror Secrets' metadata, cluster-wide, page by page; only Secrets that are some identity's mirror. */
async function* listMirrors(
  deps: RefreshDeps,
  fieldSelector?: string,
): AsyncGenerator<{ identity: string; namespace: string }> {
  // Only what tells a mirror is kept of each, page by page (not owner references or field managers).
  const list = await listAllPages(
    (cont) =>
      deps.clients.core.listSecretForAllNamespaces(
        { labelSelector: `${LABEL_MIRRORED}=true`, fieldSelector, limit: PAGE_SIZE, _continue: cont },
        METADATA_LIST,
      ),
    deps.clients.logger,
    ({ metadata: md }) => ({
      metadata: { name: md?.name, namespace: md?.namespace, labels: md?.labels, annotations: md?.annotations },
    }),
  );
  for (const s of list.items) {
    const secret = s as SecretLike;
    const identity = secret.metadata?.annotations?.[ANNOTATION_IDENTITY];
    // SPEC §3: ours = label + matching annotation; the mirror is the one with the mirror's name.
    // The identity's own source is taken out once the identity is known (withoutOwnSource).
    if (
      identity &&
      isOurs(secret, identity, undefined) &&
      secret.metadata?.name === mirrorName(identity) &&
      secret.metadata.namespace
    ) {
      yield { identity, namespace: secret.metadata.namespace };
    }
  }
}

function add(map: Map<string, Set<string>>, key: string, value: string): void {
  let set = map.get(key);
  if (!set) map.set(key, (set = new Set()));
  set.add(value);
}

/**
 * Usage of every identity at once, for a ping: every consumer of every kind listed once and
 * every mirror listed once, grouped by identity name. Deleting consumers are included.
 */
async function usageOfAll(
  deps: RefreshDeps,
): Promise<{ consumers: Map<string, Set<string>>; mirrors: Map<string, Set<string>> }> {
  const consumers = new Map<string, Set<string>>();
  const mirrors = new Map<string, Set<string>>();
  for (const kind of deps.consumerKinds) {
    // Only the identity and namespace of each are kept, page by page: a ping over thousands
    // of consumers never holds their whole objects at once.
    const uses = await listConsumers(deps.clients, kind, {}, (c) => [c.spec?.identityRef?.name, c.metadata.namespace]);
    for (const [id, ns] of uses) if (id && ns) add(consumers, id, ns);
  }
  for await (const m of listMirrors(deps)) add(mirrors, m.identity, m.namespace);
  return { consumers, mirrors };
}

/** Usage of one identity: field-selector lookups of its consumers and of Secrets with its mirror's name. */
async function usageOfOne(deps: RefreshDeps, name: string): Promise<Usage> {
  const consumers = await consumersOfIdentity(deps.clients, deps.consumerKinds, name);
  const mirrorNamespaces: string[] = [];
  for await (const m of listMirrors(deps, `metadata.name=${mirrorName(name)}`))
    if (m.identity === name) mirrorNamespaces.push(m.namespace);
  return { consumerNamespaces: consumers.map((c) => c.metadata.namespace ?? ''), mirrorNamespaces };
}

/**
 * The usage without the namespace whose Secret at the mirror's name is the identity's own
 * source (SPEC §3: that Secret is not its mirror, whatever its labels).
 */
function withoutOwnSource(identity: TerraformClusterIdentity, usage: Usage): Usage {
  const name = identity.metadata.name ?? '';
  const ref = identity.spec?.secretRef;
  const own = (ns: string) => namesSecret(ref, { metadata: { namespace: ns, name: mirrorName(name) } });
  return { ...usage, mirrorNamespaces: [...usage.mirrorNamespaces].filter((ns) => !own(ns)) };
}

/**
 * SPEC §9: GETs the source Secret directly (never cached), metadata only.
 * @returns found / not-found (404) / forbidden (403).
 * @throws any other API error (retryable).
 */
async function sourceState(deps: RefreshDeps, identity: TerraformClusterIdentity): Promise<SourceState> {
  const ref = identity.spec?.secretRef;
  if (!ref?.name || !ref.namespace) return 'not-found';
  // A mirror is never a source (SPEC §3): such a name is not even read.
  if (isReservedSourceName(ref.name)) return 'is-mirror';
  let read: unknown;
  try {
    read = await deps.clients.core.readNamespacedSecret({ name: ref.name, namespace: ref.namespace }, METADATA);
  } catch (err) {
    if (isNotFound(err)) return 'not-found';
    if (isForbidden(err)) return 'forbidden';
    throw err;
  }
  // A 200 that is not that Secret (a proxy's page parses as a string) proves nothing: retried.
  if (!namesSecret(ref, read as SecretLike)) throw new Error('the answer to the source read is not that Secret');
  return 'found';
}

/**
 * Refreshes one identity: decides its status from `usage` (or, when absent, from fresh
 * field-selector lookups) and applies it to the status subresource when something changed,
 * with the identity's resourceVersion as precondition. On 409 it re-reads the identity and
 * its usage and tries again (bounded), so a write never rests on data older than the
 * identity it overwrites. Never throws: API errors become `outcome: 'failed'`.
 * Logs one line: `identity refreshed` {identity, ready, reason, namespaces, changed, durationMs}.
 * @param identity the identity as listed or read.
 * @param usage its usage when the caller gathered it in bulk (ping).
 */
export async function refreshIdentity(
  deps: RefreshDeps,
  identity: TerraformClusterIdentity,
  usage?: Usage,
): Promise<RefreshResult> {
  const name = identity.metadata.name ?? '';
  const t0 = performance.now();
  const ms = () => Math.round(performance.now() - t0);
  try {
    const result = await retryOnConflict(async (attempt): Promise<RefreshResult> => {
      let current: TerraformClusterIdentity | undefined = identity;
      if (attempt > 1) {
        current = await getIdentity(deps, name);
        if (!current) return { identity: name, outcome: 'gone', durationMs: 0 };
      }
      const use = withoutOwnSource(current, attempt === 1 && usage ? usage : await usageOfOne(deps, name));
      const source = await sourceState(deps, current);
      const decision = decideStatus(current, source, use, deps.now?.() ?? new Date());
      if (decision.changed.length > 0) {
        try {
          await identities(deps.clients).applyStatus(statusApplyBody(current, decision));
        } catch (err) {
          // Deleted since it was read: nothing to report on.
          if (isNotFound(err)) return { identity: name, outcome: 'gone', durationMs: 0 };
          throw err;
        }
      }
      return {
        identity: name,
        outcome: 'refreshed',
        ready: decision.ready.status,
        reason: decision.ready.reason,
        namespaces: decision.namespaces,
        changed: decision.changed,
        durationMs: 0,
      };
    });
    result.durationMs = ms();
    if (result.outcome === 'gone') deps.logger.info('identity gone', { identity: name, durationMs: result.durationMs });
    else deps.logger.info('identity refreshed', { ...result });
    return result;
  } catch (err) {
    const result: RefreshResult = { identity: name, outcome: 'failed', error: describeError(err), durationMs: ms() };
    deps.logger.warn('identity refresh failed', { ...result });
    return result;
  }
}

/**
 * Refreshes one identity by name (an identity event). Not found or outside the selector →
 * `outcome: 'gone'`; its usage comes from field-selector lookups for that identity only.
 * Never throws.
 */
export async function refreshNamed(deps: RefreshDeps, name: string): Promise<RefreshResult> {
  const t0 = performance.now();
  let identity: TerraformClusterIdentity | undefined;
  try {
    identity = await getIdentity(deps, name);
  } catch (err) {
    const result: RefreshResult = {
      identity: name,
      outcome: 'failed',
      error: describeError(err),
      durationMs: Math.round(performance.now() - t0),
    };
    deps.logger.warn('identity refresh failed', { ...result });
    return result;
  }
  if (!identity) {
    const result: RefreshResult = { identity: name, outcome: 'gone', durationMs: Math.round(performance.now() - t0) };
    deps.logger.info('identity gone', { identity: name, durationMs: result.durationMs });
    return result;
  }
  return refreshIdentity(deps, identity);
}

/**
 * Refreshes every identity in scope (a ping): lists identities (paginated) first, then every
 * consumer and every mirror once, then refreshes identities with at most `deps.concurrency`
 * at a time. Listing identities before usage means each write's resourceVersion
 * precondition predates the usage it reports.
 * @returns one result per identity (failed ones included).
 * @throws the API error when a list fails (nothing was refreshed; retry the ping).
 */
export async function refreshAll(deps: RefreshDeps): Promise<RefreshResult[]> {
  const identities = await listIdentities(deps);
  const { consumers, mirrors } = await usageOfAll(deps);
  const limit = pLimit(deps.concurrency);
  return limit.map(identities, (identity) => {
    const name = identity.metadata.name ?? '';
    return refreshIdentity(deps, identity, {
      consumerNamespaces: consumers.get(name) ?? [],
      mirrorNamespaces: mirrors.get(name) ?? [],
    });
  });
}
