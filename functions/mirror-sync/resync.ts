/**
 * SPEC §6, §12: the periodic resync on a PingSource tick, made of lists. It lists the
 * mirrors first (label selector), then every consumer kind, the identities and the
 * namespaces, reads each distinct source Secret once, decides every key with the same pure
 * function as an event (decide.ts), and writes only the differences (pass.ts) — including collecting
 * mirrors none of whose consumer owners exists any more (a lost delete event never leaves
 * credentials behind). The mirrors are listed before the consumers, so a consumer created during
 * the pass is never taken for a dead one: removals are by UID of a reference the mirror held before the consumers
 * were listed, and every other write carries the resourceVersion listed. A key whose write
 * conflicts, or whose conditions would change, is decided again from fresh reads through the
 * scheduler's queue (conditions are never written from aged lists). With `K_SINK` set, one event per key is sent there
 * instead, so the keys spread over many instances.
 */
import { randomUUID } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { CloudEvent, HTTP } from 'cloudevents';
import pLimit from 'p-limit';
import type { Consumer } from '../lib/api.ts';
import { KEY_EVENT_TYPE } from '../lib/cloudevents.ts';
import { pageSize, slimConsumer } from '../lib/consumers.ts';
import { describeError, listAllPages } from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import { bearerToken } from '../lib/token-review.ts';
import { consumerObjects, identities } from '../lib/objects.ts';
import { LABEL_MIRRORED } from '../lib/mirror.ts';
import { keyString, type MirrorKey, type KeyPlan } from './decide.ts';
import { listNamespaces } from './observe.ts';
import { contextOf, type KeyOutcome, type ReconcileContext, type ReconcileDeps } from './act.ts';
import { keysOf, reconcilePass, settleKeyless, type Lists, type Pass } from './pass.ts';

/** CloudEvent source of the events a resync sends to `K_SINK`. */
const RESYNC_SOURCE = 'captf-credentials/mirror-sync/resync';

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

/** Lists everything a resync decides from: mirrors first (SPEC §12), then the rest. */
async function listEverything({ clients, kinds }: ReconcileContext): Promise<Lists> {
  const limit = pageSize();
  const mirrors = (
    await listAllPages(
      (cont) =>
        clients.core.listSecretForAllNamespaces({ labelSelector: `${LABEL_MIRRORED}=true`, limit, _continue: cont }),
      clients.logger,
      // Field managers are not kept: an update without them leaves the stored ones as they are.
      (m) => ({ ...m, metadata: { ...m.metadata, managedFields: undefined } }),
    )
  ).items;
  const consumers: Consumer[] = [];
  for (const k of kinds) {
    const kindObjects = consumerObjects(clients, k);
    const listed = await listAllPages(
      (cont) => kindObjects.list({ limit, _continue: cont }),
      clients.logger,
      slimConsumer,
    );
    consumers.push(...listed.items);
  }
  const identityObjects = identities(clients);
  const identityList = (await listAllPages((cont) => identityObjects.list({ limit, _continue: cont }), clients.logger))
    .items;
  return {
    mirrors,
    consumers,
    identities: new Map(identityList.map((i) => [i.metadata.name!, i])),
    namespaces: await listNamespaces(clients),
  };
}

/**
 * Where Knative's SinkBinding mounts the token for its sink's audience when Eventing's
 * `authentication-oidc` is on (knative/eventing v0.49.2 `pkg/apis/sources/v1/
 * sinkbinding_lifecycle.go`: the `<binding>-oidc-token` Secret, key `token`, at `/oidc`). A
 * Broker with the feature on refuses an unsigned event 401.
 */
export const SINK_TOKEN_FILE = '/oidc/token';

/**
 * Runs one resync.
 * @param opts.sink `K_SINK` URL: send one event per key instead of reconciling here.
 * @param opts.sinkTokenFile sign those events with this file's token when it exists
 *   (read once per resync: the SinkBinding renews the Secret, the kubelet the file).
 * @param opts.concurrency keys acted on (or sent) at once.
 * @param opts.again decides a key again from fresh reads (the scheduler's queue): for a key whose
 *   write conflicted, or whose conditions the aged lists would change.
 * @throws API errors of the lists, including a 410 that survived the restarts (the ping is then answered 5xx).
 */
export async function resync(
  deps: ReconcileDeps,
  opts: { sink?: string | undefined; sinkTokenFile?: string | undefined; concurrency: number; again: Pass['again'] },
): Promise<ResyncSummary> {
  const started = performance.now();
  deps.logger.info('resync started');
  const ctx = contextOf(deps, { calls: 0 });
  const lists = await listEverything(ctx);
  const keys = keysOf(lists);
  const pass: Pass = { ctx, limit: pLimit(Math.max(1, opts.concurrency)), again: opts.again, fresh: false };
  const summary = emptySummary(lists, keys.length);
  summary.needRetry += (await settleKeyless(pass, lists.consumers)).filter((r) => r.retry).length;
  if (opts.sink) {
    const sink = { url: opts.sink, authorization: await sinkAuthorization(opts.sinkTokenFile, deps.logger) };
    await sendKeys(pass, summary, sink, keys);
  } else {
    const results = await reconcilePass(pass, lists);
    summary.changed = results.length;
    for (const { plan, result } of results) count(summary, result, plan);
  }
  summary.durationMs = Math.round(performance.now() - started);
  summary.apiCalls = ctx.clients.counter.calls;
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

/**
 * The `Authorization` header for the sink: `Bearer <token>` from `file`, or none when there is
 * no file (Eventing without sender identity). A file that cannot be read, or whose content is
 * no b64token, is logged (by its path and error code, never its content) and the events go
 * unsigned: the sink then says what it accepts.
 */
async function sinkAuthorization(file: string | undefined, logger: Logger): Promise<string | undefined> {
  if (!file) return undefined;
  try {
    const token = (await readFile(file, 'utf8')).trim();
    if (!token) return undefined;
    // A header the HTTP client would refuse would put the token in its error, and so in a log.
    if (bearerToken(`Bearer ${token}`) === token) return `Bearer ${token}`;
    logger.warn('sink token malformed: events go unsigned', { file });
    return undefined;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== 'ENOENT') logger.warn('sink token unreadable: events go unsigned', { file, code });
    return undefined;
  }
}

/** Where fan-out sends keys: `K_SINK`, and the `Authorization` header that signs them, if any. */
interface Sink {
  url: string;
  authorization: string | undefined;
}

/** Fan-out mode: one event per key to the sink, so the keys spread over many instances. */
async function sendKeys(pass: Pass, summary: ResyncSummary, sink: Sink, keys: readonly MirrorKey[]): Promise<void> {
  await Promise.all(
    keys.map((key) =>
      pass.limit(async () => {
        if (await sendKey(sink, key, pass.ctx.logger)) summary.sent++;
        else summary.failed++;
      }),
    ),
  );
}

/** Adds one key's result to the summary. */
function count(summary: ResyncSummary, r: KeyOutcome, plan: KeyPlan | undefined): void {
  if (r.retry) summary.needRetry++;
  if (r.mirrorAction !== 'deleted' || plan?.mirror.action !== 'delete') return;
  if (plan.mirror.why === 'unused') summary.orphanedMirrorsDeleted++;
  else summary.revoked++;
}

/** Sends one key to the sink as a `KEY_EVENT_TYPE` CloudEvent (binary mode); true when accepted. */
async function sendKey(sink: Sink, key: MirrorKey, logger: Logger): Promise<boolean> {
  const { url, authorization } = sink;
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
    const res = await fetch(url, {
      method: 'POST',
      headers: { ...(msg.headers as Record<string, string>), ...(authorization ? { authorization } : {}) },
      body: msg.body as string,
    });
    await res.arrayBuffer();
    if (res.ok) return true;
    logger.warn('sink refused resync event', { sink: url, key: keyString(key), status: res.status });
  } catch (err) {
    logger.warn('sink unreachable', { sink: url, key: keyString(key), error: describeError(err) });
  }
  return false;
}
