/**
 * SPEC §6, §12: the periodic resync on a PingSource tick. Lists every consumer of every
 * configured kind (paginated) and reconciles each with bounded concurrency — or, when
 * `K_SINK` is set, sends one CloudEvent per consumer to the sink so the reconciles spread
 * over many function instances — then garbage-collects orphaned mirrors: mirrors whose
 * consumer owner references all point at objects that no longer exist (a lost delete event
 * must never leave credentials behind).
 */
import { randomUUID } from 'node:crypto';
import { CloudEvent, HTTP } from 'cloudevents';
import pLimit from 'p-limit';
import type { OwnerReference } from '../lib/api.ts';
import { REF_EVENT_PREFIX } from '../lib/cloudevents.ts';
import { listConsumers, PAGE_SIZE } from '../lib/consumers.ts';
import { describeError, isNotFound, makeClients, type Clients } from '../lib/kube.ts';
import { ANNOTATION_IDENTITY, LABEL_MIRRORED, groupOf, isOurs } from '../lib/mirror.ts';
import { releaseMirror } from './cleanup.ts';
import { reconcileConsumer, type ConsumerRequest, type ReconcileDeps } from './reconcile.ts';
import { consumerRefMatcher } from './plan.ts';

/** CloudEvent source of the events a resync sends to `K_SINK`. */
export const RESYNC_SOURCE = 'captf-credentials/mirror-sync/resync';

/** Summary of one resync (logged, and returned as the ping's JSON answer). */
export interface ResyncSummary {
  consumers: number;
  reconciled: number;
  sent: number;
  failed: number;
  needRetry: number;
  orphanedMirrorsDeleted: number;
  danglingReferencesRemoved: number;
  durationMs: number;
}

/**
 * Runs one resync.
 * @param opts.sink `K_SINK` URL: fan out instead of reconciling in-process.
 * @param opts.concurrency reconciles (or sends) in flight at once.
 * @throws API errors of the list calls (the ping is then answered 5xx).
 */
export async function resync(deps: ReconcileDeps, opts: { sink?: string | undefined; concurrency: number }): Promise<ResyncSummary> {
  const started = performance.now();
  const clients = makeClients(deps.kc);
  const limit = pLimit(Math.max(1, opts.concurrency));
  const summary: ResyncSummary = { consumers: 0, reconciled: 0, sent: 0, failed: 0, needRetry: 0, orphanedMirrorsDeleted: 0, danglingReferencesRemoved: 0, durationMs: 0 };
  const tasks: Promise<void>[] = [];
  for (const kind of deps.kinds) {
    for await (const c of listConsumers(clients, kind)) {
      summary.consumers++;
      const req: ConsumerRequest = { kind, namespace: c.metadata.namespace!, name: c.metadata.name!, uid: c.metadata.uid };
      tasks.push(limit(async () => {
        if (opts.sink) {
          const ok = await sendToSink(opts.sink, req, deps);
          if (ok) summary.sent++;
          else summary.failed++;
        } else {
          const r = await reconcileConsumer(deps, req);
          summary.reconciled++;
          if (r.retry) summary.needRetry++;
        }
      }));
    }
  }
  await Promise.all(tasks);
  const gc = await collectOrphans(clients, deps);
  summary.orphanedMirrorsDeleted = gc.deleted;
  summary.danglingReferencesRemoved = gc.released;
  summary.durationMs = Math.round(performance.now() - started);
  deps.logger.info('resync', { ...summary });
  return summary;
}

async function sendToSink(sink: string, req: ConsumerRequest, deps: ReconcileDeps): Promise<boolean> {
  const apiVersion = `${req.kind.group}/${req.kind.version}`;
  // Shaped like an ApiServerSource Reference-mode event so the same Trigger routes it.
  const event = new CloudEvent<unknown>({
    id: randomUUID(),
    type: `${REF_EVENT_PREFIX}update`,
    source: RESYNC_SOURCE,
    subject: `/apis/${apiVersion}/namespaces/${req.namespace}/${req.kind.plural}/${req.name}`,
    datacontenttype: 'application/json',
    data: { apiVersion, kind: req.kind.kind, name: req.name, namespace: req.namespace },
    kind: req.kind.kind,
    name: req.name,
    namespace: req.namespace,
  });
  const msg = HTTP.binary(event);
  try {
    const res = await fetch(sink, { method: 'POST', headers: msg.headers as Record<string, string>, body: msg.body as string });
    await res.arrayBuffer();
    if (res.ok) return true;
    deps.logger.warn('sink refused resync event', { sink, object: `${req.namespace}/${req.name}`, status: res.status });
  } catch (err) {
    deps.logger.warn('sink unreachable', { sink, object: `${req.namespace}/${req.name}`, error: describeError(err) });
  }
  return false;
}

/**
 * SPEC §6: deletes mirrors none of whose consumer owner references points at an existing
 * object (same UID), and removes dangling references from mirrors that still have users.
 * Mirrors with an owner reference of a kind not configured here are left alone.
 * Every write is resourceVersion-guarded via {@link releaseMirror}.
 */
async function collectOrphans(clients: Clients, deps: ReconcileDeps): Promise<{ deleted: number; released: number }> {
  const isConsumerRef = consumerRefMatcher(deps.kinds);
  let deleted = 0;
  let released = 0;
  let cont: string | undefined;
  do {
    const page = await clients.core.listSecretForAllNamespaces({ labelSelector: `${LABEL_MIRRORED}=true`, limit: PAGE_SIZE, _continue: cont });
    for (const m of page.items) {
      const identity = m.metadata?.annotations?.[ANNOTATION_IDENTITY];
      if (!identity || !isOurs(m, identity)) continue;
      const namespace = m.metadata!.namespace!;
      const refs = (m.metadata?.ownerReferences ?? []) as OwnerReference[];
      // An owner of a kind this instance does not know (another instance's configuration,
      // a rollout in progress) may be a live user: never collect such a mirror here.
      if (refs.some((r) => !isConsumerRef(r))) continue;
      const consumerRefs = refs.filter(isConsumerRef);
      const dangling: OwnerReference[] = [];
      for (const r of consumerRefs) if (!(await ownerExists(clients, deps, namespace, r))) dangling.push(r);
      if (consumerRefs.length > 0 && dangling.length === 0) continue;
      if (consumerRefs.length === 0) {
        // No user at all: release a non-existent owner, which deletes when no consumer ref remains.
        try {
          await clients.core.deleteNamespacedSecret({ name: m.metadata!.name!, namespace, body: { preconditions: { resourceVersion: m.metadata!.resourceVersion!, uid: m.metadata!.uid! } } });
          deleted++;
        } catch (err) {
          if (!isNotFound(err) && (err as { code?: number }).code !== 409) throw err;
        }
        continue;
      }
      for (const r of dangling) {
        const action = await releaseMirror(clients, namespace, m.metadata!.name!, r, isConsumerRef);
        if (action === 'deleted') deleted++;
        if (action === 'released') released++;
      }
    }
    cont = page.metadata?._continue || undefined;
  } while (cont);
  return { deleted, released };
}

async function ownerExists(clients: Clients, deps: ReconcileDeps, namespace: string, ref: OwnerReference): Promise<boolean> {
  const kind = deps.kinds.find((k) => k.group === groupOf(ref.apiVersion) && k.kind === ref.kind)!;
  try {
    const obj = (await clients.custom.getNamespacedCustomObject({ group: kind.group, version: kind.version, plural: kind.plural, namespace, name: ref.name })) as { metadata?: { uid?: string } };
    return obj.metadata?.uid === ref.uid;
  } catch (err) {
    if (isNotFound(err)) return false;
    throw err;
  }
}
