/**
 * Row "telemetry": what exporting metrics and traces costs (SPEC §13, docs/observability.md),
 * beside the same work with telemetry off, in the same run and interleaved, with both pushed
 * to a real Prometheus and Jaeger (tool set `observability`) with the shipped component's
 * interval and sampler:
 * - cold start, export on: each function's bundle spawned with OTLP endpoints set → its first
 *   real answer; baseline: the same spawn with none set (OpenTelemetry never loaded);
 * - mirror-sync CPU time per consumer over a fan-in burst on an instance that exports as
 *   shipped, and on one that samples every trace (what a caller that samples all asks for);
 *   baseline: the same burst on the system's instance (export off). Each instance first takes a
 *   small burst (not counted: a fresh instance would otherwise pay its warm-up alone), then the
 *   bursts go round the instances, the order turned each round, so that a drift over the row
 *   falls on all alike.
 */
import { join } from 'node:path';
import { startJaeger } from '../../observability/jaeger.ts';
import { startPrometheus } from '../../observability/prometheus.ts';
import { shippedTelemetryEnv } from '../../observability/stack.ts';
import type { Figure } from '../report.ts';
import { coldStart, coldStartFixture } from './cold-start.ts';
import { burst, type RowContext } from './context.ts';
import { BURST_IDENTITY } from './fan-in.ts';

/** Consumers of the burst each instance takes before the measured ones. */
const WARM_UP_CONSUMERS = 20;

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
        ...shippedTelemetryEnv(),
      };
      const figures = [...(await coldStarts(ctx, sizes.coldStartRuns, otel)), ...(await burstCpu(ctx, sizes, otel))];
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

/** mirror-sync's CPU per consumer over fan-in bursts: exporting as shipped, every trace sampled, and the system's (off). */
async function burstCpu(
  ctx: RowContext,
  sizes: { burst: number; rounds: number },
  otel: NodeJS.ProcessEnv,
): Promise<Figure[]> {
  const quiet = ctx.sys.functions['mirror-sync'];
  const shipped = await ctx.sys.startFunction('mirror-sync', otel);
  const sampled = await ctx.sys.startFunction('mirror-sync', { ...otel, OTEL_TRACES_SAMPLER: 'parentbased_always_on' });
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
    const instances = [
      { label: 'export off', target: quiet, samples: [] as number[] },
      { label: 'export on, shipped sampler', target: shipped, samples: [] as number[] },
      { label: 'export on, every trace sampled', target: sampled, samples: [] as number[] },
    ];
    for (const { target } of instances) await cpuPerConsumer(target, WARM_UP_CONSUMERS);
    for (let i = 0; i < sizes.rounds; i++) {
      const turn = i % instances.length;
      for (const x of [...instances.slice(turn), ...instances.slice(0, turn)]) {
        ctx.log(`telemetry: ${sizes.burst} consumers on the instance with ${x.label}`);
        x.samples.push(await cpuPerConsumer(x.target, sizes.burst));
      }
    }
    const [off, ...on] = instances;
    return on.map((x) => ({
      row: 'telemetry',
      what: `mirror-sync CPU time per consumer, fan-in N=${sizes.burst}, ${x.label}`,
      unit: 'ms',
      samples: x.samples,
      baseline: { what: off!.label, samples: off!.samples },
    }));
  } finally {
    // Their drains push what they counted last.
    await Promise.all([shipped.stop(), sampled.stop()]);
  }
}
