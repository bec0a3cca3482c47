/**
 * A real Prometheus for the functions' metrics (SPEC §13): Prometheus 3 built from its Go module
 * (tool set `observability`), on loopback, taking OTLP pushes on its receiver
 * (`--web.enable-otlp-receiver`, `POST /api/v1/otlp/v1/metrics`) and answering PromQL. It
 * scrapes nothing: everything it holds was pushed. A counter's first push counts from zero
 * (`created-timestamp-zero-ingestion`: the OTLP start time becomes a 0 sample), so `increase()`
 * sees a pod that pushed once. Given rule groups, it evaluates them every second and says which
 * alerts fire.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ensureTool } from '../tools/build.ts';
import { ON_THIS_MACHINE, startReceiver, type ReceiverPlace } from './receiver.ts';

/** One sample of an instant query: the series' labels and its value. */
export interface Sample {
  metric: Record<string, string>;
  value: number;
}

/** One alert Prometheus holds (`GET /api/v1/alerts`). */
export interface Alert {
  labels: Record<string, string>;
  state: 'pending' | 'firing' | 'inactive';
}

/** A running Prometheus. */
export interface Prometheus {
  /** `http://127.0.0.1:<port>` */
  url: string;
  /** Where a function pushes (from where it runs): set as `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`. */
  otlpMetricsEndpoint: string;
  /** An instant PromQL query's vector. @throws Error with Prometheus's error text. */
  query(promql: string): Promise<Sample[]>;
  /** The alerts of its rules that are pending or firing now. */
  alerts(): Promise<Alert[]>;
  stop(): Promise<void>;
}

/**
 * Writes the configuration under `dir`: nothing to scrape, rules evaluated every second,
 * out-of-order pushes accepted (as from several pods of one function).
 * @returns its path.
 */
function writeConfig(dir: string, ruleGroups: readonly unknown[]): string {
  mkdirSync(dir, { recursive: true });
  const config = join(dir, 'prometheus.yml');
  const rules = join(dir, 'rules.yml');
  // JSON is YAML: the rule file is the groups as given.
  writeFileSync(rules, JSON.stringify({ groups: ruleGroups }));
  writeFileSync(
    config,
    JSON.stringify({
      global: { evaluation_interval: '1s' },
      rule_files: [rules],
      storage: { tsdb: { out_of_order_time_window: '30m' } },
    }),
  );
  return config;
}

/**
 * Starts Prometheus with its data, configuration and log under `dir` (built when missing).
 * @throws Error naming its log when it is not ready in time (it is stopped first).
 */
export async function startPrometheus(o: {
  dir: string;
  /** Rule groups (a PrometheusRule's `spec.groups`), evaluated every second. */
  ruleGroups?: readonly unknown[];
  log?: (line: string) => void;
  /** Where it runs (default: this machine's loopback). */
  place?: ReceiverPlace;
}): Promise<Prometheus> {
  const bin = await ensureTool('observability', 'prometheus', o.log);
  const config = writeConfig(o.dir, o.ruleGroups ?? []);
  const place = o.place ?? ON_THIS_MACHINE;
  const port = await place.port();
  const url = `http://127.0.0.1:${port}`;
  const stop = await startReceiver({
    name: 'prometheus',
    bin,
    dir: o.dir,
    ready: `${url}/-/ready`,
    place,
    args: [
      `--config.file=${config}`,
      `--storage.tsdb.path=${join(o.dir, 'data')}`,
      `--web.listen-address=${place.bind}:${port}`,
      '--web.enable-otlp-receiver',
      '--enable-feature=created-timestamp-zero-ingestion',
    ],
  });
  /** The `data` of one API answer. @throws Error with Prometheus's error text. */
  const api = async <T>(path: string): Promise<T> => {
    const r = await fetch(`${url}${path}`);
    const body = (await r.json()) as { status: string; error?: string; data?: T };
    if (body.status !== 'success' || body.data === undefined) throw new Error(`${path}: ${body.error ?? r.status}`);
    return body.data;
  };
  return {
    url,
    otlpMetricsEndpoint: `http://${place.senders}:${port}/api/v1/otlp/v1/metrics`,
    query: async (promql) => {
      type Vector = { result: { metric: Record<string, string>; value: [number, string] }[] };
      const data = await api<Vector>(`/api/v1/query?query=${encodeURIComponent(promql)}`);
      return data.result.map((s) => ({ metric: s.metric, value: Number(s.value[1]) }));
    },
    alerts: async () => (await api<{ alerts: Alert[] }>('/api/v1/alerts')).alerts,
    stop,
  };
}
