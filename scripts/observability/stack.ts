/**
 * What `npm start -- --observability` runs beside the system: Prometheus with the shipped
 * alert rules (manifests/components/observability) and Jaeger, on loopback under one folder,
 * and the settings that point the functions and Knative's data plane at them.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadYaml } from '@kubernetes/client-node';
import { REPO_ROOT } from '../tools/build.ts';
import { startJaeger, type Jaeger } from './jaeger.ts';
import { startPrometheus, type Prometheus } from './prometheus.ts';

/** The shipped component's folder: its rules, its dashboard. */
export const OBSERVABILITY_COMPONENT = join(REPO_ROOT, 'manifests', 'components', 'observability');

/** One alerting rule of the shipped PrometheusRule. */
export interface AlertRule {
  alert: string;
  expr: string;
}

/** The shipped PrometheusRule's `spec.groups`, as Prometheus loads a rule file. */
export function shippedRuleGroups(): { name: string; rules: AlertRule[] }[] {
  const rule = loadYaml(readFileSync(join(OBSERVABILITY_COMPONENT, 'prometheus-rules.yaml'), 'utf8')) as {
    spec: { groups: { name: string; rules: AlertRule[] }[] };
  };
  return rule.spec.groups;
}

/** The component's patch (the first one, on the Knative Services): JSON-patch operations adding env entries. */
interface ComponentPatch {
  patches: { patch: string }[];
}

/**
 * The telemetry settings the shipped component gives every function (its interval and
 * sampler), without its endpoint: what a run here adds its own receivers' addresses to.
 */
export function shippedTelemetryEnv(): Record<string, string> {
  const kustomization = loadYaml(readFileSync(join(OBSERVABILITY_COMPONENT, 'kustomization.yaml'), 'utf8'));
  const ops = loadYaml((kustomization as ComponentPatch).patches[0]!.patch) as {
    value: { name: string; value: string };
  }[];
  return Object.fromEntries(
    ops.map((o) => [o.value.name, o.value.value]).filter(([name]) => name !== 'OTEL_EXPORTER_OTLP_ENDPOINT'),
  );
}

/** A running pair of receivers. */
export interface Observability {
  prometheus: Prometheus;
  jaeger: Jaeger;
  /** Each function's environment: both signals pushed here, with the shipped component's interval and sampler. */
  functionEnv: Record<string, string>;
  /** Knative's `config-observability` for its own processes: traces and metrics, every span sampled. */
  knative: Record<string, string>;
  stop(): Promise<void>;
}

/**
 * Starts Prometheus (with the shipped rules) and Jaeger under `dir` (built when missing).
 * @throws Error naming a receiver's log when it does not start (the other is stopped).
 */
export async function startObservability(o: { dir: string; log?: (line: string) => void }): Promise<Observability> {
  const prometheus = await startPrometheus({
    dir: join(o.dir, 'prometheus'),
    ruleGroups: shippedRuleGroups(),
    log: o.log,
  });
  let jaeger: Jaeger;
  try {
    jaeger = await startJaeger({ dir: join(o.dir, 'jaeger'), log: o.log });
  } catch (err) {
    await prometheus.stop();
    throw err;
  }
  return {
    prometheus,
    jaeger,
    functionEnv: {
      OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: prometheus.otlpMetricsEndpoint,
      OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: jaeger.otlpTracesEndpoint,
      ...shippedTelemetryEnv(),
    },
    knative: {
      'tracing-protocol': 'http/protobuf',
      'tracing-endpoint': jaeger.otlpTracesEndpoint,
      'tracing-sampling-rate': '1',
      'metrics-protocol': 'http/protobuf',
      'metrics-endpoint': prometheus.otlpMetricsEndpoint,
    },
    stop: async () => {
      await jaeger.stop();
      await prometheus.stop();
    },
  };
}
