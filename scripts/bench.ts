/**
 * `npm run bench`: measures the functions as production runs them (bundles, the real
 * ApiServerSource adapter and Broker data plane, each function as its own least-privilege user)
 * on a local control plane of its own, and prints every figure beside a baseline measured in
 * the same run (bench/README.md explains the rows and what dominates each figure). The event
 * rows (event → mirror, fan-in, spread, concurrent fan-in, revocation, identity grant and revoke) run once
 * per delivery path (scripts/bench/paths.ts), path after path.
 *
 * Flags:
 *   --quick          every row at tiny sizes (well under two minutes; `npm test` runs it)
 *   --size N         also run the resync row at N consumers (e.g. 10000)
 *   --rows a,b       only these rows: cold-start, resync, event-to-mirror, fan-in, revocation, identity-grant,
 *                    admission, prepare, telemetry (export on against off: cold start, CPU per consumer),
 *                    pods (the functions as pods on a real node of its own: cold start, container
 *                    memory, the node's footprint; needs root), serving (the manifests on Knative Serving
 *                    on a real node of its own: cold start from zero through the activator, fan-in with
 *                    real autoscaling; needs root; not part of --quick unless named)
 *   --paths a,b      the delivery paths of the event rows (default all): direct, broker, broker-async
 *   --out DIR        where the result JSON goes (default bench/results; .local/bench-results with --quick)
 *   --timeout S      bound on any one wait for convergence (default 900; 120 with --quick)
 *   --serving-fan-in N,M  the Serving row's burst sizes (default 200; 0: the cold starts only)
 *   --keep-logs      keep .local/bench-<pid>/ (function, adapter and audit logs) after a good run
 * Exit code: 0 when every row produced its figures, 1 otherwise.
 */
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { BASELINE_VERSION, bareNodeServer } from './bench/baselines.ts';
import { ALLOWED_LABEL, createIdentity, putSourceSecret, watchMirrors } from './bench/fixtures.ts';
import { AuditLog, memoryLimits, rssBytes, samplePeaks } from './bench/measure.ts';
import { BenchClient, CLIENT_CONCURRENCY } from './bench/client.ts';
import { DELIVERY_PATHS, type DeliveryPath } from './bench/paths.ts';
import {
  EVENT_ROWS,
  ROWS,
  currentRevision,
  formatTable,
  groupByRow,
  writeResults,
  type BenchResults,
  type EventRow,
  type Figure,
} from './bench/report.ts';
import { REPO_ROOT } from './tools/build.ts';
import { stopOnSignal } from './lib/process.ts';
import { startSystem, type FunctionName, type RunningSystem } from './system/system.ts';
import { admissionRow } from './bench/rows/admission.ts';
import { podRows } from './bench/rows/pods.ts';
import { servingRows } from './bench/rows/serving.ts';
import { prepareRow } from './bench/rows/prepare.ts';
import { coldStartRow } from './bench/rows/cold-start.ts';
import type { BenchSystem, RowContext } from './bench/rows/context.ts';
import { eventToMirrorRow } from './bench/rows/event-to-mirror.ts';
import { BURST_IDENTITY, fanInRows } from './bench/rows/fan-in.ts';
import { resyncRows } from './bench/rows/resync.ts';
import { revocationRow } from './bench/rows/revocation.ts';
import { grantRows } from './bench/rows/grant.ts';
import { telemetryRow } from './bench/rows/telemetry.ts';

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    size: { type: 'string' },
    rows: { type: 'string' },
    paths: { type: 'string' },
    out: { type: 'string' },
    timeout: { type: 'string' },
    'keep-logs': { type: 'boolean', default: false },
    'serving-fan-in': { type: 'string' },
  },
});
const quick = values.quick!;
// Serving starts a node and Knative (a minute, more with a cold build): only when named under --quick.
const rows = values.rows ? values.rows.split(',') : ROWS.filter((r) => !(quick && r === 'serving'));
for (const r of rows)
  if (!(ROWS as readonly string[]).includes(r)) throw new Error(`unknown row ${r}; rows: ${ROWS.join(', ')}`);
const paths = (values.paths ? values.paths.split(',') : [...DELIVERY_PATHS]) as DeliveryPath[];
for (const p of paths)
  if (!DELIVERY_PATHS.includes(p)) throw new Error(`unknown path ${p}; paths: ${DELIVERY_PATHS.join(', ')}`);
const extraSize = values.size ? Number(values.size) : undefined;
if (extraSize !== undefined && (!Number.isInteger(extraSize) || extraSize < 10 || extraSize % 10))
  throw new Error('--size must be a multiple of 10');
const sizes = {
  fanIn: quick ? [10, 20] : [10, 100, 200, 1000],
  concurrent: quick ? 20 : 200,
  eventToMirror: quick ? 3 : 50,
  resync: [
    ...(quick ? [20, 40] : [1000, 2000, 4000]).filter((s) => !extraSize || s < extraSize),
    ...(extraSize ? [extraSize] : []),
  ],
  revocationPerNamespace: quick ? 1 : 10,
  grant: quick ? [50] : [50, 200, 500],
  admission: quick ? 20 : 300,
  prepare: quick ? 10 : 100,
  coldStartRuns: quick ? 3 : 10,
  telemetry: { coldStartRuns: quick ? 2 : 10, burst: quick ? 10 : 200, rounds: quick ? 2 : 6 },
  podRuns: quick ? 1 : 5,
  servingRuns: quick ? 1 : 5,
  servingFanIn: values['serving-fan-in'] ? servingFanIn(values['serving-fan-in']) : quick ? [20] : [200],
};
/** `--serving-fan-in 200,500` or `0` (no burst: the cold starts only). */
function servingFanIn(text: string): number[] {
  const sizes = text.split(',').map(Number);
  if (!sizes.every((n) => Number.isInteger(n) && n >= 0))
    throw new Error('--serving-fan-in takes sizes ≥ 0, e.g. 200,500');
  return sizes.filter((n) => n > 0);
}
const timeoutMs = Number(values.timeout ?? (quick ? 120 : 900)) * 1000;
const outDir = values.out ?? join(REPO_ROOT, quick ? '.local/bench-results' : 'bench/results');
const log = (l: string) => process.stderr.write(`[bench] ${l}\n`);

// Each adapter restart (a delivery-path switch) leaves one more 'exit' listener on the process
// (scripts/eventing/adapter.ts startApiServerSourceAdapter), beside the functions' and the data plane's.
process.setMaxListeners(50);
const startedAt = new Date();
const revision = currentRevision();
const dir = join(REPO_ROOT, '.local', `bench-${process.pid}`);
// The system as production runs it: bundles (no compile cache, as the image) and the Knative
// Services' environment, each function and the event source as its ServiceAccount's user (the
// audit log names who sent what), an audit log that does not rotate during a run.
let running: RunningSystem | undefined;
const signal = stopOnSignal(() => running?.stop());
running = await startSystem({
  dir,
  progress: log,
  auditLogMaxSizeMB: 100_000,
  functions: 'bundles',
  users: 'service-accounts',
  events: 'fronts',
  signal,
}).catch((err: unknown) => {
  if (signal.aborted) process.exit(130);
  throw err;
});
const started = running;
const sys: BenchSystem = await Promise.resolve()
  .then(() => ({
    ...started,
    cp: started.controlPlane!,
    events: started.eventPaths!,
    admin: new BenchClient(started.kubeconfigPath, CLIENT_CONCURRENCY),
    audit: new AuditLog(join(dir, 'logs', 'audit.log')),
    memoryLimits: memoryLimits(started.rendered),
  }))
  .catch(async (err: unknown) => {
    await started.stop();
    throw err;
  });
const functions = Object.keys(sys.functions) as FunctionName[];

const results: BenchResults = { figures: [], failures: [] };
try {
  // The Broker's namespace: the data plane created it already.
  await sys.admin.raw('POST', '/api/v1/namespaces', { metadata: { name: 'captf-system' } });
  await putSourceSecret(sys.admin, 'bench-creds', { token: 'bench' });
  await createIdentity(sys.admin, {
    name: BURST_IDENTITY,
    secret: 'bench-creds',
    allowedNamespaces: { selector: { matchLabels: { [ALLOWED_LABEL]: 'true' } } },
  });
  let n = 0;
  const ctx: RowContext = {
    sys,
    mirrors: await watchMirrors(sys.admin),
    quick,
    timeoutMs,
    next: (p) => `${p}-${n++}`,
    log,
    figures: results.figures,
    quietMs: quick ? 200 : 1000,
  };

  // Idle memory first, beside a bare Node server's.
  await new Promise((r) => setTimeout(r, 2000));
  const idle = Object.fromEntries(functions.map((f) => [f, rssBytes(sys.functions[f].pid)]));
  const bare = await bareNodeServer(2000);
  const whole = samplePeaks(Object.fromEntries(functions.map((f) => [f, sys.functions[f].pid])), 100);

  const other: Record<Exclude<(typeof ROWS)[number], EventRow>, () => Promise<Figure[]>> = {
    'cold-start': () => coldStartRow(ctx, sizes.coldStartRuns),
    resync: () => resyncRows(ctx, sizes.resync, results.figures).then(() => []),
    admission: () => admissionRow(ctx, sizes.admission),
    prepare: () => prepareRow(ctx, sizes.prepare),
    telemetry: () => telemetryRow(ctx, sizes.telemetry),
    pods: () => podRows({ runs: sizes.podRuns, log }),
    serving: () => servingRows({ runs: sizes.servingRuns, fanIn: sizes.servingFanIn, timeoutMs, log }),
  };
  const eventRun: Record<EventRow, (path: DeliveryPath) => Promise<Figure[]>> = {
    'event-to-mirror': (path) => eventToMirrorRow(ctx, sizes.eventToMirror, path),
    'fan-in': (path) => fanInRows(ctx, { fanIn: sizes.fanIn, concurrent: sizes.concurrent }, path),
    revocation: (path) => revocationRow(ctx, sizes.revocationPerNamespace, path),
    'identity-grant': (path) => grantRows(ctx, sizes.grant, path),
  };
  const eventRows = EVENT_ROWS.filter((r) => rows.includes(r));
  for (const row of ROWS) {
    if (!rows.includes(row)) continue;
    if (row === eventRows[0]) await runOnPaths(ctx, eventRows, eventRun);
    if ((EVENT_ROWS as readonly string[]).includes(row)) continue;
    await runRow(row, () => other[row as keyof typeof other]());
  }

  const peaks = whole.stop();
  for (const f of functions) {
    results.figures.push(
      {
        row: 'memory',
        what: `${f} RSS, idle`,
        unit: 'bytes',
        samples: [idle[f]!],
        baseline: { what: 'bare Node HTTP server', samples: [bare.rss] },
      },
      {
        row: 'memory',
        what: `${f} peak RSS over the run`,
        unit: 'bytes',
        samples: [peaks.rss[f] ?? 0],
        baseline: { what: 'manifest memory limit', samples: [sys.memoryLimits[f]] },
      },
    );
  }
  ctx.mirrors.stop();
} catch (err) {
  results.failures.push({ row: 'set-up', error: (err as Error).stack ?? String(err) });
} finally {
  sys.admin.close();
  await sys.stop();
  // Keep the logs of a failed run (functions, adapter, audit log) for a look.
  if (results.failures.length || values['keep-logs']) log(`logs kept in ${dir}`);
  else rmSync(dir, { recursive: true, force: true });
}

const durationMs = performance.now();
process.stdout.write(`\n${formatTable(results)}\n\n`);
const path = writeResults(outDir, results, {
  quick,
  startedAt,
  durationMs,
  options: { rows, sizes, timeoutMs },
  baselineVersion: BASELINE_VERSION,
  revision,
});
log(
  `results written to ${path}; ${results.figures.length} figures, ${results.failures.length} failed rows, ${(durationMs / 1000).toFixed(0)} s`,
);
process.exit(results.failures.length ? 1 : 0);

/** Runs one row (or one row on one path), logging its time; a failure is recorded and the bench goes on. */
async function runRow(row: string, run: () => Promise<Figure[]>): Promise<void> {
  log(`row ${row}`);
  const t0 = performance.now();
  try {
    results.figures.push(...(await run()));
  } catch (err) {
    results.failures.push({ row, error: (err as Error).message });
    log(`row ${row} failed: ${(err as Error).message}`);
  }
  log(`row ${row} took ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}

/**
 * Runs the event rows on each delivery path in turn (one switch per path, scripts/bench/paths.ts),
 * goes back to the direct path for the rows after them (nothing they do should flow through
 * the Broker), and groups the figures by row with the paths side by side.
 */
async function runOnPaths(
  ctx: RowContext,
  eventRows: readonly EventRow[],
  run: Record<EventRow, (path: DeliveryPath) => Promise<Figure[]>>,
): Promise<void> {
  const first = results.figures.length;
  for (const path of paths) {
    if (!(await switchTo(ctx, path))) continue;
    for (const row of eventRows) await runRow(`${row} [${path}]`, () => run[row](path));
  }
  await switchTo(ctx, 'direct');
  results.figures.push(...groupByRow(results.figures.splice(first)));
}

/** Switches the delivery path; a failure is recorded. @returns whether it switched. */
async function switchTo(ctx: RowContext, path: DeliveryPath): Promise<boolean> {
  try {
    await ctx.sys.events.use(path);
    return true;
  } catch (err) {
    results.failures.push({ row: `delivery path ${path}`, error: (err as Error).message });
    log(`delivery path ${path} failed: ${(err as Error).message}`);
    return false;
  }
}
