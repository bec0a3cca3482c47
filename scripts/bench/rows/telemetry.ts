/**
 * Row "telemetry": what exporting metrics and traces costs (SPEC §13, docs/observability.md),
 * beside the same work with telemetry off, in the same run and interleaved, with both pushed
 * to a real Prometheus and Jaeger (tool set `observability`) at the shipped component's
 * interval:
 * - cold start, export on: each function's bundle spawned with OTLP endpoints set → its first
 *   real answer; baseline: the same spawn with none set (OpenTelemetry never loaded);
 * - mirror-sync CPU time per consumer over a fan-in burst on an instance that exports;
 *   baseline: the same burst on the system's instance (export off). Both instances first take a
 *   small burst (not counted: the fresh instance would otherwise pay its warm-up alone), then the
 *   bursts go off, on, on, off, … so that a drift over the row falls on both alike.
 */
import { join } from 'node:path';
import { startJaeger } from '../../observability/jaeger.ts';
import { startPrometheus } from '../../observability/prometheus.ts';
import type { Figure } from '../report.ts';
import { coldStart, coldStartFixture } from './cold-start.ts';
import { burst, type RowContext } from './context.ts';
import { BURST_IDENTITY } from './fan-in.ts';

/** Consumers of the burst each instance takes before the measured ones. */
const WARM_UP_CONSUMERS = 20;

/** The metrics interval of components/observability, in ms. */
const SHIPPED_INTERVAL_MS = '15000';

/**
 * @param sizes cold starts per function and setting; consumers per burst; burst pairs.
 * @throws Error when a spawn or a burst fails, or nothing reached Prometheus.
 */
export async function telemetryRow(
  ctx: RowContext,
  sizes: { coldStartRuns: number; burst: number; rounds: number },
): Promise<Figure[]> {
  const dir = join(ctx.sys.dir, 'telemetry');
  const prometheus = await startPrometheus({ dir: join(dir, 'prometheus'), log: ctx.log });
  try {
    const jaeger = await startJaeger({ dir: join(dir, 'jaeger'), log: ctx.log });
    try {
      const otel = {
        OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: prometheus.otlpMetricsEndpoint,
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: jaeger.otlpTracesEndpoint,
        OTEL_METRIC_EXPORT_INTERVAL: SHIPPED_INTERVAL_MS,
      };
      const figures = [...(await coldStarts(ctx, sizes.coldStartRuns, otel)), await burstCpu(ctx, sizes, otel)];
      // An export that failed would cost nothing: the figures count only if it arrived.
      if (!(await prometheus.query('sum(captf_events_total)')).length)
        throw new Error('no mirror-sync metrics reached Prometheus');
      return figures;
    } finally {
      await jaeger.stop();
    }
  } finally {
    await prometheus.stop();
  }
}

/** Each function's cold starts with export on and off, alternating. */
async function coldStarts(ctx: RowContext, runs: number, otel: NodeJS.ProcessEnv): Promise<Figure[]> {
  const first = await coldStartFixture(ctx);
  const figures: Figure[] = [];
  for (const name of ['admission', 'mirror-sync', 'identity-status'] as const) {
    const on: number[] = [];
    const off: number[] = [];
    for (let i = 0; i < runs; i++) {
      off.push(await coldStart(ctx, first, { name, label: `off-${i}` }));
      on.push(await coldStart(ctx, first, { name, label: `on-${i}`, env: otel }));
    }
    figures.push({
      row: 'telemetry',
      what: `${name}: spawn → first real answer, export on`,
      unit: 'ms',
      samples: on,
      baseline: { what: 'export off', samples: off },
    });
  }
  return figures;
}

/** mirror-sync's CPU per consumer over fan-in bursts, on an exporting instance and on the system's. */
async function burstCpu(
  ctx: RowContext,
  sizes: { burst: number; rounds: number },
  otel: NodeJS.ProcessEnv,
): Promise<Figure> {
  const quiet = ctx.sys.functions['mirror-sync'];
  const exporting = await ctx.sys.startFunction('mirror-sync', otel);
  try {
    const cpuPerConsumer = async (target: typeof quiet, n: number) => {
      const r = await burst(ctx, {
        identity: BURST_IDENTITY,
        namespaces: [ctx.next('tm')],
        perNamespace: n,
        targets: [target],
        pids: { 'mirror-sync': target.pid },
      });
      return r.cpuMs['mirror-sync']! / r.consumers;
    };
    for (const target of [quiet, exporting]) await cpuPerConsumer(target, WARM_UP_CONSUMERS);
    const on: number[] = [];
    const off: number[] = [];
    for (let i = 0; i < sizes.rounds; i++) {
      const pair = [
        ['off', quiet, off],
        ['on', exporting, on],
      ] as const;
      for (const [label, target, into] of i % 2 ? [...pair].reverse() : pair) {
        ctx.log(`telemetry: ${sizes.burst} consumers on the instance with export ${label}`);
        into.push(await cpuPerConsumer(target, sizes.burst));
      }
    }
    return {
      row: 'telemetry',
      what: `mirror-sync CPU time per consumer, fan-in N=${sizes.burst}, export on`,
      unit: 'ms',
      samples: on,
      baseline: { what: 'export off', samples: off },
    };
  } finally {
    // Its drain pushes what it counted last.
    await exporting.stop();
  }
}
