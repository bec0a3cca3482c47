/**
 * SPEC §6, §12: the periodic resync on a PingSource tick, made of lists. It lists the
 * mirrors first (label selector), then every consumer kind, the identities and the
 * namespaces, reads each distinct source Secret once, decides every key with the same pure
 * function as an event (decide.ts), and writes only the differences — including collecting
 * mirrors none of whose consumer owners exists any more (a lost delete event never leaves
 * credentials behind). Listing the mirrors before the consumers, and writing with the
 * resourceVersion the list returned, means a consumer created during the pass is never
 * taken for a dead one: its own reconcile changes the mirror, and our write then conflicts
 * and goes back through the key queue. With `K_SINK` set, one event per key is sent there
 * instead, so the keys spread over many instances.
 */
import { randomUUID } from 'node:crypto';
import { CloudEvent, HTTP } from 'cloudevents';
import type { V1Namespace, V1Secret } from '@kubernetes/client-node';
import pLimit, { type LimitFunction } from 'p-limit';
import { isDns1123Subdomain } from '../lib/allowed-namespaces.ts';
import type { Consumer, TerraformClusterIdentity } from '../lib/api.ts';
import { KEY_EVENT_TYPE } from '../lib/cloudevents.ts';
import { pageSize } from '../lib/consumers.ts';
import { describeError, ignoreNotFound, listAllPages, makeClients, METADATA, type Clients } from '../lib/kube.ts';
import { consumerObjects, identities } from '../lib/objects.ts';
import { ANNOTATION_IDENTITY, LABEL_MIRRORED, isOurs, mirrorName } from '../lib/mirror.ts';
import {
  decide,
  keyString,
  mayHoldMirror,
  type MirrorKey,
  type Plan,
  type Snapshot,
  type SourceState,
} from './decide.ts';
import { namespaceState, readSource } from './observe.ts';
import type { KeyQueue } from './queue.ts';
import { conditionPlan } from './status.ts';
import { act, failedKey, logKey, settleWithoutKey, type KeyResult, type ReconcileDeps } from './reconcile.ts';

/** CloudEvent source of the events a resync sends to `K_SINK`. */
export const RESYNC_SOURCE = 'captf-credentials/mirror-sync/resync';

/** Summary of one resync (logged, and returned as the ping's JSON answer). */
export interface ResyncSummary {
  /** Consumers listed (every configured kind). */
  consumers: number;
  /** Mirrors listed. */
  mirrors: number;
  /** Keys decided (namespace × identity with a consumer or a mirror). */
  keys: number;
  /** Keys that needed a write (mirror or conditions). */
  changed: number;
  /** Mirrors deleted because no consumer uses them any more. */
  orphanedMirrorsDeleted: number;
  /** Mirrors deleted because their namespace is no longer allowed or the identity is gone. */
  revoked: number;
  /** Keys sent to `K_SINK` (fan-out mode). */
  sent: number;
  /** Keys the sink refused. */
  failed: number;
  /** Keys (or consumers without a key) whose work should be retried; the next ping does. */
  needRetry: number;
  durationMs: number;
  apiCalls: number;
}

/** What the resync read, listed. */
interface Lists {
  mirrors: V1Secret[];
  consumers: Consumer[];
  identities: Map<string, TerraformClusterIdentity>;
  namespaces: Map<string, V1Namespace>;
}

/** Lists everything a resync decides from: mirrors first (SPEC §12), then the rest. */
async function listEverything(clients: Clients, deps: ReconcileDeps): Promise<Lists> {
  const limit = pageSize();
  const mirrors = (
    await listAllPages(
      (cont) =>
        clients.core.listSecretForAllNamespaces({ labelSelector: `${LABEL_MIRRORED}=true`, limit, _continue: cont }),
      clients.logger,
    )
  ).items;
  const consumers: Consumer[] = [];
  for (const k of deps.kinds) {
    const kindObjects = consumerObjects(clients, k);
    consumers.push(
      ...(await listAllPages((cont) => kindObjects.list({ limit, _continue: cont }), clients.logger)).items,
    );
  }
  const identityObjects = identities(clients);
  const identityList = (await listAllPages((cont) => identityObjects.list({ limit, _continue: cont }), clients.logger))
    .items;
  const namespaces = (
    await listAllPages((cont) => clients.core.listNamespace({ limit, _continue: cont }), clients.logger)
  ).items;
  return {
    mirrors,
    consumers,
    identities: new Map(identityList.map((i) => [i.metadata.name!, i])),
    namespaces: new Map(namespaces.map((n) => [n.metadata!.name!, n])),
  };
}

/** One key's listed consumers and mirror. */
interface Listed {
  key: MirrorKey;
  consumers: Consumer[];
  mirror: V1Secret | undefined;
}

/** Groups consumers and mirrors by key (consumers without a key are left out). */
function groupByKey(lists: Lists): Map<string, Listed> {
  const keys = new Map<string, Listed>();
  const entry = (key: MirrorKey) =>
    keys.get(keyString(key)) ??
    keys.set(keyString(key), { key, consumers: [], mirror: undefined }).get(keyString(key))!;
  for (const c of lists.consumers) {
    if (!isKeyless(c))
      entry({ namespace: c.metadata.namespace!, identity: c.spec!.identityRef!.name! }).consumers.push(c);
  }
  for (const m of lists.mirrors) {
    const key = mirrorKeyOf(m, lists.identities);
    if (key) entry(key).mirror = m;
  }
  return keys;
}

/** The key of a listed Secret that is an identity's mirror (SPEC §3: ours, at that identity's mirror name). */
function mirrorKeyOf(m: V1Secret, identities: Lists['identities']): MirrorKey | undefined {
  const id = m.metadata?.annotations?.[ANNOTATION_IDENTITY];
  if (!id || m.metadata?.name !== mirrorName(id)) return undefined;
  return isOurs(m, id, identities.get(id)?.spec?.secretRef)
    ? { namespace: m.metadata.namespace!, identity: id }
    : undefined;
}

/** A consumer with no key: cluster-scoped, or naming no usable identity (SPEC §4). */
const isKeyless = (c: Consumer): boolean => {
  const id = c.spec?.identityRef?.name;
  return !c.metadata.namespace || !id || !isDns1123Subdomain(id);
};

/** Whether acting on a plan would write anything (mirror or any consumer's conditions). */
function needsWork(plan: Plan, now: Date): boolean {
  if (plan.mirror.action !== 'none' && plan.mirror.action !== 'blocked') return true;
  return plan.consumers.some((p) => conditionPlan(p.consumer, p.conditions, now).changed);
}

/** What one pass works with. */
interface Pass {
  deps: ReconcileDeps;
  clients: Clients;
  limit: LimitFunction;
  summary: ResyncSummary;
  queue: KeyQueue;
}

/**
 * Runs one resync.
 * @param opts.sink `K_SINK` URL: send one event per key instead of reconciling here.
 * @param opts.concurrency keys acted on (or sent) at once.
 * @param opts.queue the process's key queue (a key whose write conflicts is reconciled again through it).
 * @throws API errors of the lists, including a 410 that survived the restarts (the ping is then answered 5xx).
 */
export async function resync(
  deps: ReconcileDeps,
  opts: { sink?: string | undefined; concurrency: number; queue: KeyQueue },
): Promise<ResyncSummary> {
  const started = performance.now();
  deps.logger.info('resync started');
  const clients = makeClients(deps.kc, { calls: 0 }, deps.logger);
  const lists = await listEverything(clients, deps);
  const keys = groupByKey(lists);
  const pass: Pass = {
    deps,
    clients,
    limit: pLimit(Math.max(1, opts.concurrency)),
    summary: emptySummary(lists, keys.size),
    queue: opts.queue,
  };
  await settleKeyless(pass, lists.consumers.filter(isKeyless));
  if (opts.sink) await sendKeys(pass, opts.sink, [...keys.values()]);
  else await reconcileListed(pass, lists, [...keys.values()]);
  const { summary } = pass;
  summary.durationMs = Math.round(performance.now() - started);
  summary.apiCalls = clients.counter.calls;
  deps.logger.info('resync', { ...summary });
  return summary;
}

function emptySummary(lists: Lists, keys: number): ResyncSummary {
  return {
    consumers: lists.consumers.length,
    mirrors: lists.mirrors.length,
    keys,
    changed: 0,
    orphanedMirrorsDeleted: 0,
    revoked: 0,
    sent: 0,
    failed: 0,
    needRetry: 0,
    durationMs: 0,
    apiCalls: 0,
  };
}

/** Settles the conditions of consumers without a key; one failed write is counted, it never aborts the pass. */
async function settleKeyless(pass: Pass, consumers: readonly Consumer[]): Promise<void> {
  await Promise.all(
    consumers.map((c) =>
      pass.limit(async () => {
        try {
          await settleWithoutKey(pass.clients, pass.deps, c);
        } catch (err) {
          pass.summary.needRetry++;
          pass.deps.logger.warn('could not settle a consumer without a key', {
            object: `${c.metadata.namespace ?? ''}/${c.metadata.name}`,
            error: describeError(err),
          });
        }
      }),
    ),
  );
}

/** Fan-out mode: one event per key to the sink, so the keys spread over many instances. */
async function sendKeys(pass: Pass, sink: string, keys: readonly Listed[]): Promise<void> {
  await Promise.all(
    keys.map(({ key }) =>
      pass.limit(async () => {
        if (await sendKey(sink, key, pass.deps)) pass.summary.sent++;
        else pass.summary.failed++;
      }),
    ),
  );
}

/** A key's snapshot from the lists (and its source, read once per pass). */
async function snapshotOf(
  lists: Lists,
  { key, consumers, mirror }: Listed,
  readOnce: (i: TerraformClusterIdentity) => Promise<SourceState>,
): Promise<Snapshot> {
  const identity = lists.identities.get(key.identity);
  const ns = lists.namespaces.get(key.namespace);
  const namespace = ns ? namespaceState(ns) : undefined;
  return {
    key,
    identity,
    namespace,
    source: mayHoldMirror(identity, key, namespace) ? await readOnce(identity) : undefined,
    mirror,
    consumers,
    scope: 'all',
  };
}

/** Decides every key from the lists and acts on those that need a write. */
async function reconcileListed(pass: Pass, lists: Lists, keys: readonly Listed[]): Promise<void> {
  // Each distinct source is read once, on first need.
  const sources = new Map<string, Promise<SourceState>>();
  const readOnce = (i: TerraformClusterIdentity) => {
    const id = `${i.spec.secretRef.namespace}/${i.spec.secretRef.name}`;
    if (!sources.has(id)) sources.set(id, readSource(pass.clients, i));
    return sources.get(id)!;
  };
  const now = pass.deps.now?.() ?? new Date();
  const plans: Plan[] = [];
  for (const listed of keys) {
    const snapshot = await snapshotOf(lists, listed, readOnce);
    const plan = decide(snapshot, pass.deps.kinds);
    if (needsWork(plan, now)) plans.push(plan);
  }
  // Revocations first (SPEC §7): credentials leave before anything else is written.
  const revokedFirst = [...plans].sort((a, b) => Number(isRevocation(b)) - Number(isRevocation(a)));
  pass.summary.changed = plans.length;
  const results = await Promise.all(revokedFirst.map((plan) => pass.limit(() => actListed(pass, plan))));
  for (const [i, r] of results.entries()) count(pass.summary, revokedFirst[i]!, r);
}

/** Acts on one listed key's plan; keys with only conditions to change, or whose write conflicts, go through the queue fresh. */
async function actListed(pass: Pass, plan: Plan): Promise<Omit<KeyResult, 'durationMs' | 'apiCalls'>> {
  const t0 = performance.now();
  try {
    // Only conditions to change: the lists may be minutes old and a status write carries
    // no precondition, so such a key is reconciled from fresh reads instead.
    if (plan.mirror.action === 'none' || plan.mirror.action === 'blocked') return await pass.queue.run(plan.key, 'all');
    // The mirror list sees only labelled Secrets: a create is first checked against whatever
    // stands at the mirror's name (metadata only), so a Secret in the way is never sent a create
    // that cannot succeed; the key is decided from fresh reads instead, as an event would.
    if (plan.mirror.action === 'create' && (await somethingAt(pass.clients, plan.key)))
      return await pass.queue.run(plan.key, 'all');
    const r = await act(pass.clients, pass.deps, plan);
    // The mirror changed since the list (a consumer arrived meanwhile): reconcile it again, fresh.
    if (r === 'conflict') return await pass.queue.run(plan.key, 'all');
    logKey(pass.deps.logger, { ...r, durationMs: Math.round(performance.now() - t0), apiCalls: 0 });
    return r;
  } catch (err) {
    return failedKey(plan.key, err);
  }
}

/** Whether any Secret stands at `key`'s mirror name (a metadata-only read: no data is fetched). */
async function somethingAt(clients: Clients, key: MirrorKey): Promise<boolean> {
  const name = mirrorName(key.identity);
  return (
    (await ignoreNotFound(clients.core.readNamespacedSecret({ namespace: key.namespace, name }, METADATA))) !==
    undefined
  );
}

/** Adds one key's result to the summary. */
function count(summary: ResyncSummary, plan: Plan, r: Omit<KeyResult, 'durationMs' | 'apiCalls'>): void {
  if (r.retry) summary.needRetry++;
  if (r.mirrorAction !== 'deleted' || plan.mirror.action !== 'delete') return;
  if (plan.mirror.why === 'unused') summary.orphanedMirrorsDeleted++;
  else summary.revoked++;
}

const isRevocation = (p: Plan): boolean => p.mirror.action === 'delete' && p.mirror.why !== 'unused';

/** Sends one key to the sink as a `KEY_EVENT_TYPE` CloudEvent (binary mode); true when accepted. */
async function sendKey(sink: string, key: MirrorKey, deps: ReconcileDeps): Promise<boolean> {
  const event = new CloudEvent<unknown>({
    id: randomUUID(),
    type: KEY_EVENT_TYPE,
    source: RESYNC_SOURCE,
    subject: keyString(key),
    datacontenttype: 'application/json',
    data: { namespace: key.namespace, identity: key.identity },
  });
  const msg = HTTP.binary(event);
  try {
    const res = await fetch(sink, {
      method: 'POST',
      headers: msg.headers as Record<string, string>,
      body: msg.body as string,
    });
    await res.arrayBuffer();
    if (res.ok) return true;
    deps.logger.warn('sink refused resync event', { sink, key: keyString(key), status: res.status });
  } catch (err) {
    deps.logger.warn('sink unreachable', { sink, key: keyString(key), error: describeError(err) });
  }
  return false;
}
