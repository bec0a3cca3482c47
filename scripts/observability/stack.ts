/**
 * What `npm start -- --observability` runs beside the system: Prometheus with the shipped
 * alert rules (manifests/components/observability) and Jaeger under one folder, on this
 * machine's loopback or inside the Serving node, and the settings that point the functions and
 * Knative's own components at them.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadYaml, type KubernetesObject } from '@kubernetes/client-node';
import type { TestNode } from '../node/node.ts';
import { REPO_ROOT } from '../tools/build.ts';
import { startJaeger, type Jaeger } from './jaeger.ts';
import { startPrometheus, type Prometheus } from './prometheus.ts';
import { inNode, ON_THIS_MACHINE } from './receiver.ts';

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

/**
 * `objects` with `data` merged into every ConfigMap `config-observability` (Knative reads it
 * as its components start: apply it before them). Pure.
 */
export function withObservabilityConfig<T extends KubernetesObject>(
  objects: readonly T[],
  data: Readonly<Record<string, string>> | undefined,
): T[] {
  if (!data) return [...objects];
  return objects.map((o) =>
    o.kind === 'ConfigMap' && o.metadata?.name === 'config-observability'
      ? { ...o, data: { ...(o as { data?: Record<string, string> }).data, ...data } }
      : o,
  );
}

/** A running pair of receivers. */
export interface Observability {
  prometheus: Prometheus;
  jaeger: Jaeger;
  /** Each function's environment: both signals pushed here, with the shipped component's interval and sampler. */
  functionEnv: Record<string, string>;
  /** Knative's `config-observability` for its own components: traces and metrics, every span sampled. */
  knative: Record<string, string>;
  stop(): Promise<void>;
}

/**
 * Starts Prometheus (with the shipped rules) and Jaeger under `dir` (built when missing): on
 * this machine's loopback, or with `node` inside it, where its pods push to them (this machine
 * still reaches both on 127.0.0.1).
 * @throws Error naming a receiver's log when it does not start (the other is stopped).
 */
export async function startObservability(o: {
  dir: string;
  log?: (line: string) => void;
  node?: TestNode;
}): Promise<Observability> {
  const place = o.node ? inNode(o.node) : ON_THIS_MACHINE;
  const prometheus = await startPrometheus({
    dir: join(o.dir, 'prometheus'),
    ruleGroups: shippedRuleGroups(),
    log: o.log,
    place,
  });
  let jaeger: Jaeger;
  try {
    jaeger = await startJaeger({ dir: join(o.dir, 'jaeger'), log: o.log, place });
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
