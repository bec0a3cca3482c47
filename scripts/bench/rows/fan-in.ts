/**
 * Rows "fan-in", "spread" and "concurrent fan-in": N new consumers of one identity created in
 * one burst, their events delivered by the real ApiServerSource adapter through the relay.
 * - fan-in: all in one namespace (one mirror, N owner references);
 * - spread: N/10 namespaces, 10 consumers each (N/10 mirrors);
 * - concurrent fan-in: the fan-in burst with 8 deliveries in flight, to one instance and
 *   split round-robin over two.
 * Baseline: N plain Secret creates in one namespace at the same client concurrency (and, for
 * the concurrent row, the serial burst of the same run).
 */
import { secretCreates } from '../baselines.ts';
import { createNamespaces } from '../fixtures.ts';
import type { Figure } from '../report.ts';
import { burst, type BurstResult, type RowContext } from './context.ts';

/** The identity every burst uses (allowed everywhere the bench labels as allowed). */
export const BURST_IDENTITY = 'bench-burst';

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
    { row, what: 'deliveries retried (5xx)', unit: 'count', samples: [r.relay.retried] },
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
 * Runs the fan-in row at each size, then the spread row, then the concurrent fan-in row at
 * `concurrentSize`.
 * @returns the figures. @throws Error when a burst does not converge within the timeout.
 */
export async function fanInRows(ctx: RowContext, sizes: readonly number[], concurrentSize: number): Promise<Figure[]> {
  const { sys } = ctx;
  const serial = { kind: 'deliver' as const, targets: [`${sys.functions['mirror-sync'].url}/`], concurrency: 1 };
  const pids = { 'mirror-sync': sys.functions['mirror-sync'].pid };
  const figures: Figure[] = [];
  let serialAtConcurrentSize: BurstResult | undefined;
  for (const n of sizes) {
    ctx.log(`fan-in: ${n} consumers in one namespace`);
    const base = await createsBaseline(ctx, n);
    const r = await burst(ctx, {
      identity: BURST_IDENTITY,
      namespaces: [ctx.next('fi')],
      perNamespace: n,
      mode: serial,
      pids,
    });
    if (n === concurrentSize) serialAtConcurrentSize = r;
    figures.push(...burstFigures(`fan-in N=${n}`, r, base));
  }
  for (const n of sizes.filter((s) => s >= 20)) {
    ctx.log(`spread: ${n} consumers over ${n / 10} namespaces`);
    const base = await createsBaseline(ctx, n);
    const namespaces = Array.from({ length: n / 10 }, () => ctx.next('sp'));
    const r = await burst(ctx, { identity: BURST_IDENTITY, namespaces, perNamespace: 10, mode: serial, pids });
    figures.push(...burstFigures(`spread N=${n}`, r, base).slice(0, 6));
  }
  if (serialAtConcurrentSize) figures.push(...(await concurrentFanIn(ctx, concurrentSize, serialAtConcurrentSize)));
  return figures;
}

async function concurrentFanIn(ctx: RowContext, n: number, serial: BurstResult): Promise<Figure[]> {
  const { sys } = ctx;
  const one = sys.functions['mirror-sync'];
  const figures: Figure[] = [];
  const row = (label: string, r: BurstResult): Figure[] => [
    {
      row: `concurrent fan-in N=${n}, ${label}`,
      what: 'time until all mirrored',
      unit: 'ms',
      samples: [r.ms],
      baseline: { what: 'serial burst', samples: [serial.ms] },
    },
    {
      row: `concurrent fan-in N=${n}, ${label}`,
      what: '409 conflicts',
      unit: 'count',
      samples: [r.counts.conflicts],
      baseline: { what: 'serial burst', samples: [serial.counts.conflicts] },
    },
    {
      row: `concurrent fan-in N=${n}, ${label}`,
      what: 'mirror writes',
      unit: 'count',
      samples: [r.counts.mirrorWrites],
      baseline: { what: 'serial burst', samples: [serial.counts.mirrorWrites] },
    },
    {
      row: `concurrent fan-in N=${n}, ${label}`,
      what: 'mirror-sync API requests per consumer',
      unit: 'count',
      samples: [r.counts.requests / n],
    },
  ];
  ctx.log(`concurrent fan-in: ${n} consumers, 8 in flight to one instance`);
  const a = await burst(ctx, {
    identity: BURST_IDENTITY,
    namespaces: [ctx.next('cf')],
    perNamespace: n,
    mode: { kind: 'deliver', targets: [`${one.url}/`], concurrency: 8 },
    pids: { 'mirror-sync': one.pid },
  });
  figures.push(...row('8 in flight, 1 instance', a));
  ctx.log(`concurrent fan-in: ${n} consumers, 8 in flight over two instances`);
  const two = await sys.startFunction('mirror-sync');
  try {
    const b = await burst(ctx, {
      identity: BURST_IDENTITY,
      namespaces: [ctx.next('cf')],
      perNamespace: n,
      mode: { kind: 'deliver', targets: [`${one.url}/`, `${two.url}/`], concurrency: 8 },
      pids: { 'mirror-sync': one.pid, 'mirror-sync-2': two.pid },
    });
    figures.push(...row('8 in flight, 2 instances', b));
  } finally {
    await two.stop();
  }
  return figures;
}
