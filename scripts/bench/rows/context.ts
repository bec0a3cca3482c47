/**
 * What every row gets, and the measured burst that the event-path rows share: create
 * consumers, see on watches when every one is mirrored, then count what mirror-sync did and
 * how its events were delivered (on the delivery path in use, scripts/bench/paths.ts).
 */
import type { ControlPlane } from '../../controlplane/controlplane.ts';
import type { FunctionProcess } from '../../lib/process.ts';
import type { FunctionName, RunningSystem } from '../../system/system.ts';
import { USERS } from '../../system/users.ts';
import type { BenchClient } from '../client.ts';
import { WatchedCollection } from '../collection.ts';
import {
  consumersPath,
  createConsumers,
  createNamespaces,
  hasTrue,
  mirrorOf,
  spreadOver,
  type Consumer,
  type Mirror,
} from '../fixtures.ts';
import { measureCpu, responseBytes, samplePeaks, type AuditLog, type Peaks, type RequestCounts } from '../measure.ts';
import type { FrontCounts } from '../front.ts';
import type { EventPaths } from '../paths.ts';
import type { Figure } from '../report.ts';

/** The running system as the rows see it (scripts/bench.ts), with the bench's own client and audit-log reader. */
export interface BenchSystem extends RunningSystem {
  cp: ControlPlane;
  events: EventPaths;
  /** The bench's admin client (setup, baselines, metrics). */
  admin: BenchClient;
  audit: AuditLog;
  /** Memory limit of each function's container in the rendered manifests, in bytes. */
  memoryLimits: Record<FunctionName, number>;
}

/** Shared state of one bench run. */
export interface RowContext {
  sys: BenchSystem;
  /** Every mirror of the cluster, kept by a watch for the whole run. */
  mirrors: WatchedCollection<Mirror>;
  quick: boolean;
  /** Bound on any one wait for convergence, in ms. */
  timeoutMs: number;
  /** Unique names: `next('fi')` → `fi-7`. */
  next(prefix: string): string;
  log(line: string): void;
  /** Figures of earlier rows. */
  figures: Figure[];
  /** How long no event may arrive before deliveries count as settled, in ms. */
  quietMs: number;
}

/** What one burst measured. */
export interface BurstResult {
  /** From the first create to the watch event after which every consumer was mirrored. */
  ms: number;
  /** mirror-sync's API requests, until deliveries settled after the burst. */
  counts: RequestCounts;
  /** Bytes the API server sent for GET and LIST during the burst (all readers). */
  bytes: number;
  peaks: Peaks;
  /** What reached mirror-sync's front: requests, distinct events, retries. */
  deliveries: FrontCounts;
  /** Events the Broker gave up on (its dead-letter sink's requests). */
  deadLetters: number;
  /** CPU time used over the burst by mirror-sync (every instance) and by the Broker's ingress, dispatcher and filter. */
  cpuMs: Record<string, number>;
  consumers: number;
}

/**
 * A predicate over the mirrors: each of `burst.namespaces` has the mirror of `burst.identity`
 * with exactly the owner references (by UID) of the consumers in that namespace.
 */
function ownersExact(
  consumers: WatchedCollection<Consumer>,
  burst: { identity: string; namespaces: string[] },
): (mirrors: ReadonlyMap<string, Mirror>) => boolean {
  const mirrorKey = (ns: string) => `${ns}/${mirrorOf(burst.identity)}`;
  return (mirrors) => {
    const uidsByNs = new Map<string, Set<string>>();
    for (const c of consumers.objects.values()) {
      const ns = c.metadata.namespace!;
      if (!uidsByNs.has(ns)) uidsByNs.set(ns, new Set());
      uidsByNs.get(ns)!.add(c.metadata.uid!);
    }
    return burst.namespaces.every((ns) => {
      const refs = mirrors.get(mirrorKey(ns))?.metadata.ownerReferences ?? [];
      const want = uidsByNs.get(ns) ?? new Set();
      return refs.length === want.size && refs.every((r) => want.has(r.uid));
    });
  };
}

/**
 * `wait`, unless one of `procs` exits first (a function that ran out of heap, say): then a
 * rejection naming it and its last fatal line, so a row fails at once instead of waiting for
 * its timeout.
 */
export function whileAlive<T>(wait: Promise<T>, procs: readonly FunctionProcess[]): Promise<T> {
  let onExit!: (p: FunctionProcess, code: number | null) => void;
  const died = new Promise<never>((_, reject) => {
    onExit = (p, code) => {
      const tail = p.tail();
      const why = tail.find((l) => l.includes('FATAL')) ?? tail.at(-1) ?? '';
      reject(new Error(`${p.name} (pid ${p.pid}) exited (${code ?? 'signal'}): ${why.trim()}`));
    };
  });
  died.catch(() => undefined);
  for (const p of procs) void p.exited.then((code) => onExit(p, code));
  return Promise.race([wait, died]);
}

/**
 * Creates the burst's namespaces, points mirror-sync's front at `targets` (default: the first
 * instance), waits until earlier deliveries settled, and watches the burst's consumers.
 */
async function prepareBurst(
  ctx: RowContext,
  opts: { namespaces: string[]; targets?: FunctionProcess[]; label: string },
): Promise<WatchedCollection<Consumer>> {
  const { sys } = ctx;
  await createNamespaces(sys.admin, opts.namespaces);
  const targets = opts.targets ?? [sys.functions['mirror-sync']];
  sys.events.fronts['mirror-sync'].mode = { kind: 'deliver', targets: targets.map((t) => t.url) };
  await sys.events.settled(Math.min(500, ctx.quietMs), ctx.timeoutMs);
  return new WatchedCollection<Consumer>(
    sys.admin,
    consumersPath('terraformmachines'),
    `labelSelector=${encodeURIComponent(`captf-bench/burst=${opts.label}`)}`,
  ).start();
}

/**
 * When every one of `total` consumers has `CredentialsMirrored=True` and each namespace's
 * mirror holds exactly their owner references, as `performance.now()` of the watch event.
 * @throws Error on timeout, or when a mirror-sync instance exits meanwhile.
 */
async function converged(
  ctx: RowContext,
  consumers: WatchedCollection<Consumer>,
  opts: { identity: string; namespaces: string[]; targets?: FunctionProcess[]; total: number },
): Promise<number> {
  const targets = opts.targets ?? [ctx.sys.functions['mirror-sync']];
  const allMirrored = await whileAlive(
    consumers.until(
      `${opts.total} consumers mirrored`,
      (m) => m.size === opts.total && [...m.values()].every((c) => hasTrue(c, 'CredentialsMirrored')),
      ctx.timeoutMs,
    ),
    targets,
  );
  const exact = await whileAlive(
    ctx.mirrors.until(
      `owner references of ${opts.namespaces.length} mirror(s)`,
      ownersExact(consumers, opts),
      ctx.timeoutMs,
    ),
    targets,
  );
  return Math.max(allMirrored, exact);
}

/**
 * Creates `namespaces.length × perNamespace` TerraformMachines on `identity` in one burst and
 * waits until every one has `CredentialsMirrored=True` and each namespace's mirror carries
 * exactly the owner references of its consumers (by UID).
 * @param targets the mirror-sync instances its front spreads deliveries over (default: the first).
 * @param pids processes whose peak RSS and sockets are sampled.
 * @throws Error when convergence takes longer than `ctx.timeoutMs`.
 */
export async function burst(
  ctx: RowContext,
  opts: {
    identity: string;
    namespaces: string[];
    perNamespace: number;
    targets?: FunctionProcess[];
    pids: Record<string, number>;
  },
): Promise<BurstResult> {
  const { sys } = ctx;
  const { events } = sys;
  const label = ctx.next('burst');
  const consumers = await prepareBurst(ctx, { ...opts, label });
  const items = spreadOver(opts.namespaces, opts.perNamespace, 'm');
  const total = items.length;
  const mark = sys.audit.mark();
  const bytes0 = await responseBytes(sys.admin);
  events.resetCounts();
  const sampler = samplePeaks(opts.pids);
  const cpu = measureCpu({
    'mirror-sync': (opts.targets ?? [sys.functions['mirror-sync']]).map((t) => t.pid),
    broker: await events.brokerPids(),
  });
  try {
    const t0 = performance.now();
    await createConsumers(sys.admin, {
      plural: 'terraformmachines',
      items,
      identity: opts.identity,
      labels: { 'captf-bench/burst': label },
    });
    const ms = (await converged(ctx, consumers, { ...opts, total })) - t0;
    await events.settled(ctx.quietMs, ctx.timeoutMs);
    const counts = sys.audit.countFor(USERS['mirror-sync'], mark);
    return {
      ms,
      counts,
      bytes: (await responseBytes(sys.admin)) - bytes0,
      peaks: sampler.stop(),
      deliveries: { ...events.fronts['mirror-sync'].counts },
      deadLetters: events.deadLetters.counts.requests,
      cpuMs: cpu.stop(),
      consumers: total,
    };
  } finally {
    sampler.stop();
    consumers.stop();
  }
}
