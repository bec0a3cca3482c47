/**
 * A real Prometheus for the functions' metrics (SPEC §13): Prometheus 3 built from its Go module
 * (tool set `observability`), on loopback, taking OTLP pushes on its receiver
 * (`--web.enable-otlp-receiver`, `POST /api/v1/otlp/v1/metrics`) and answering PromQL. It
 * scrapes nothing: everything it holds was pushed.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, openSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from '../lib/ports.ts';
import { stopProcess } from '../lib/process.ts';
import { eventually, firstLine } from '../lib/wait.ts';
import { ensureTool } from '../tools/build.ts';

/** One sample of an instant query: the series' labels and its value. */
export interface Sample {
  metric: Record<string, string>;
  value: number;
}

/** A running Prometheus. */
export interface Prometheus {
  /** `http://127.0.0.1:<port>` */
  url: string;
  /** Where a function pushes: set as `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`. */
  otlpMetricsEndpoint: string;
  /** An instant PromQL query's vector. @throws Error with Prometheus's error text. */
  query(promql: string): Promise<Sample[]>;
  stop(): Promise<void>;
}

/** How long it may take to answer `/-/ready`, in ms. */
const READY_TIMEOUT_MS = 60_000;

/**
 * Starts Prometheus with its data, configuration and log under `dir` (built when missing).
 * @throws Error naming its log when it is not ready in time (it is stopped first).
 */
export async function startPrometheus(o: { dir: string; log?: (line: string) => void }): Promise<Prometheus> {
  const bin = await ensureTool('observability', 'prometheus', o.log);
  mkdirSync(o.dir, { recursive: true });
  const config = join(o.dir, 'prometheus.yml');
  // Nothing to scrape; out-of-order pushes accepted, as from several pods of one function.
  writeFileSync(config, 'global: {}\nstorage:\n  tsdb:\n    out_of_order_time_window: 30m\n');
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const logPath = join(o.dir, 'prometheus.log');
  const log = openSync(logPath, 'a');
  const child: ChildProcess = spawn(
    bin,
    [
      `--config.file=${config}`,
      `--storage.tsdb.path=${join(o.dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--web.enable-otlp-receiver',
    ],
    { stdio: ['ignore', log, log] },
  );
  const stop = () => stopProcess(child);
  await eventually(
    `Prometheus to be ready (its log: ${logPath})`,
    async () => {
      if (child.exitCode !== null) throw new Error(`Prometheus exited (${child.exitCode}); its log: ${logPath}`);
      const r = await fetch(`${url}/-/ready`).catch((e: unknown) => {
        throw new Error(firstLine(e));
      });
      return r.ok;
    },
    READY_TIMEOUT_MS,
    250,
  ).catch(async (err: unknown) => {
    await stop();
    throw err;
  });
  return {
    url,
    otlpMetricsEndpoint: `${url}/api/v1/otlp/v1/metrics`,
    query: async (promql) => {
      const r = await fetch(`${url}/api/v1/query?query=${encodeURIComponent(promql)}`);
      const body = (await r.json()) as {
        status: string;
        error?: string;
        data?: { result: { metric: Record<string, string>; value: [number, string] }[] };
      };
      if (body.status !== 'success') throw new Error(`PromQL ${promql}: ${body.error ?? r.status}`);
      return (body.data?.result ?? []).map((s) => ({ metric: s.metric, value: Number(s.value[1]) }));
    },
    stop,
  };
}
