/**
 * Rows "fan-in", "spread" and "concurrent fan-in": N new consumers of one identity created in
 * one burst, their events sent by the real ApiServerSource adapter on one delivery path
 * (scripts/bench/paths.ts: straight to mirror-sync, or through Knative's Broker with the
 * default or the async-handler channel). Each row's name ends with its path: `[broker]`.
 * - fan-in: all in one namespace (one mirror, N owner references);
 * - spread: N/10 namespaces, 10 consumers each (N/10 mirrors);
 * - concurrent fan-in (async-handler path only): the fan-in burst spread round-robin over two
 *   mirror-sync instances, compared with the same burst on one instance.
 * Baselines: N plain Secret creates in one namespace at the same client concurrency; and, for
 * fan-in, the delivery path's own floor (the same events to a sink that answers 200 at once).
 */
import { secretCreates } from '../baselines.ts';
import { eventually } from '../../lib/wait.ts';
import { createConsumers, createNamespaces } from '../fixtures.ts';
import { onPath, type DeliveryPath } from '../paths.ts';
import type { Figure } from '../report.ts';
import { burst, type BurstResult, type RowContext } from './context.ts';

/** The identity every burst uses (allowed everywhere the bench labels as allowed). */
export const BURST_IDENTITY = 'bench-burst';

/**
 * How a burst's events were delivered: retries (requests beyond one per event id at
 * mirror-sync's front: Knative keeps the id when it retries), dead letters, events per
 * consumer (its own event and the echo of mirror-sync's status write), the most deliveries
 * the front held at once beyond containerConcurrency (scripts/bench/front.ts), and the CPU
 * time mirror-sync and the Broker's ingress, dispatcher and filter used (idle on `direct`).
 */
export function deliveryFigures(row: string, r: BurstResult): Figure[] {
  return [
    { row, what: 'deliveries retried', unit: 'count', samples: [r.deliveries.retried] },
    { row, what: 'dead letters', unit: 'count', samples: [r.deadLetters] },
    { row, what: 'events delivered per consumer', unit: 'count', samples: [r.deliveries.events / r.consumers] },
    { row, what: 'deliveries held for a free slot, peak', unit: 'count', samples: [r.deliveries.peakHeld] },
    { row, what: 'mirror-sync CPU time per consumer', unit: 'ms', samples: [r.cpuMs['mirror-sync']! / r.consumers] },
    { row, what: 'Broker CPU time per consumer', unit: 'ms', samples: [r.cpuMs.broker! / r.consumers] },
  ];
}

/** Figures of one burst, named for `row`; time is compared with `baselineMs`. */
function burstFigures(row: string, r: BurstResult, baseline: { ms: number; requestsPerObject: number }): Figure[] {
  const per = (v: number) => v / r.consumers;
  return [
    {
      row,
      what: 'time until all mirrored',
      unit: 'ms',
      samples: [r.ms],
      baseline: { what: `${r.consumers} Secret creates`, samples: [baseline.ms] },
    },
    {
      row,
      what: 'mirror-sync API requests per consumer',
      unit: 'count',
      samples: [per(r.counts.requests)],
      baseline: { what: 'requests per Secret create', samples: [baseline.requestsPerObject] },
    },
    { row, what: 'bytes read per consumer (GET+LIST)', unit: 'bytes', samples: [per(r.bytes)] },
    { row, what: '409 conflicts', unit: 'count', samples: [r.counts.conflicts] },
    { row, what: 'mirror writes', unit: 'count', samples: [r.counts.mirrorWrites] },
    ...deliveryFigures(row, r),
    { row, what: 'mirror-sync peak RSS', unit: 'bytes', samples: [r.peaks.rss['mirror-sync'] ?? 0] },
    { row, what: 'mirror-sync peak open sockets', unit: 'count', samples: [r.peaks.sockets['mirror-sync'] ?? 0] },
  ];
}

/** The floor for N objects: N Secret creates in a fresh namespace; ms and requests per object. */
async function createsBaseline(ctx: RowContext, n: number): Promise<{ ms: number; requestsPerObject: number }> {
  const ns = ctx.next('bl');
  await createNamespaces(ctx.sys.admin, [ns], {});
  const mark = ctx.sys.audit.mark();
  const ms = await secretCreates(ctx.sys.admin, ns, n, 's');
  return { ms, requestsPerObject: ctx.sys.audit.countFor('admin', mark).requests / n };
}

/**
 * The delivery path's own floor for a burst of `n` consumers: the same creates, their events
 * through the same path (adapter, Broker, Trigger) to mirror-sync's front answering 200 at once
 * without forwarding. @returns ms from the first create until the front received `n` events.
 */
async function pathFloor(ctx: RowContext, n: number): Promise<number> {
  const { sys } = ctx;
  const ns = ctx.next('pf');
  await createNamespaces(sys.admin, [ns], {});
  await sys.events.settled(Math.min(500, ctx.quietMs), ctx.timeoutMs);
  const front = sys.events.fronts['mirror-sync'];
  const mode = front.mode;
  front.mode = { kind: 'drop' };
  try {
    sys.events.resetCounts();
    const items = Array.from({ length: n }, (_, i) => ({ namespace: ns, name: `p-${i}` }));
    const t0 = performance.now();
    await createConsumers(sys.admin, { plural: 'terraformmachines', items, identity: BURST_IDENTITY });
    await eventually(`the front to receive ${n} events`, async () => front.counts.events >= n, ctx.timeoutMs, 5);
    const ms = performance.now() - t0;
    await sys.events.settled(ctx.quietMs, ctx.timeoutMs);
    return ms;
  } finally {
    front.mode = mode;
  }
}

/** A burst's time beside its delivery path's floor (the same events to a sink that answers 200 at once). */
const pathFloorFigure = (row: string, r: BurstResult, floorMs: number): Figure => ({
  row,
  what: 'time until all mirrored, beside the delivery path floor',
  unit: 'ms',
  samples: [r.ms],
  baseline: { what: `the same ${r.consumers} events to a sink that answers 200 at once`, samples: [floorMs] },
});

/**
 * Runs the fan-in row at each of `sizes.fanIn`, then the spread row at those ≥ 20, on the
 * delivery path in use (`path`); on `broker-async` also the concurrent fan-in row at `sizes.concurrent`.
 * @returns the figures. @throws Error when a burst does not converge within the timeout.
 */
export async function fanInRows(
  ctx: RowContext,
  sizes: { fanIn: readonly number[]; concurrent: number },
  path: DeliveryPath,
): Promise<Figure[]> {
  const { sys } = ctx;
  const pids = { 'mirror-sync': sys.functions['mirror-sync'].pid };
  const figures: Figure[] = [];
  let oneInstance: BurstResult | undefined;
  for (const n of sizes.fanIn) {
    ctx.log(`fan-in [${path}]: ${n} consumers in one namespace`);
    const base = await createsBaseline(ctx, n);
    const r = await burst(ctx, { identity: BURST_IDENTITY, namespaces: [ctx.next('fi')], perNamespace: n, pids });
    if (n === sizes.concurrent) oneInstance = r;
    const row = onPath(`fan-in N=${n}`, path);
    figures.push(...burstFigures(row, r, base), pathFloorFigure(row, r, await pathFloor(ctx, n)));
  }
  for (const n of sizes.fanIn.filter((s) => s >= 20)) {
    ctx.log(`spread [${path}]: ${n} consumers over ${n / 10} namespaces`);
    const base = await createsBaseline(ctx, n);
    const namespaces = Array.from({ length: n / 10 }, () => ctx.next('sp'));
    const r = await burst(ctx, { identity: BURST_IDENTITY, namespaces, perNamespace: 10, pids });
    figures.push(...burstFigures(onPath(`spread N=${n}`, path), r, base).slice(0, 11));
  }
  if (oneInstance && path === 'broker-async') figures.push(...(await twoInstances(ctx, sizes.concurrent, oneInstance)));
  return figures;
}

/**
 * The concurrent fan-in row: the burst of `n` consumers in one namespace, delivered by the
 * async-handler Broker and spread round-robin over two mirror-sync instances by the front
 * (the Service's stand-in); baseline: the same burst on one instance.
 */
async function twoInstances(ctx: RowContext, n: number, one: BurstResult): Promise<Figure[]> {
  const { sys } = ctx;
  const first = sys.functions['mirror-sync'];
  const row = onPath(`concurrent fan-in N=${n}, 2 instances`, 'broker-async');
  ctx.log(`concurrent fan-in [broker-async]: ${n} consumers over two instances`);
  const second = await sys.startFunction('mirror-sync');
  try {
    const r = await burst(ctx, {
      identity: BURST_IDENTITY,
      namespaces: [ctx.next('cf')],
      perNamespace: n,
      targets: [first, second],
      pids: { 'mirror-sync': first.pid, 'mirror-sync-2': second.pid },
    });
    const vsOne = (what: string, samples: number[], base: number[]): Figure => ({
      row,
      what,
      unit: what.startsWith('time') ? 'ms' : 'count',
      samples,
      baseline: { what: 'the same burst on 1 instance', samples: base },
    });
    return [
      vsOne('time until all mirrored', [r.ms], [one.ms]),
      vsOne('409 conflicts', [r.counts.conflicts], [one.counts.conflicts]),
      vsOne('mirror writes', [r.counts.mirrorWrites], [one.counts.mirrorWrites]),
      vsOne('mirror-sync API requests per consumer', [r.counts.requests / n], [one.counts.requests / n]),
      ...deliveryFigures(row, r),
    ];
  } finally {
    await second.stop();
  }
}
