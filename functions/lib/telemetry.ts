/**
 * SPEC §13, telemetry: what the functions count, exported with OpenTelemetry's SDK as OTLP over
 * HTTP (push: a pod that scales to zero may be gone before any scrape) when the environment
 * names an endpoint, and flushed within the SIGTERM drain. With no endpoint set nothing of
 * OpenTelemetry is loaded: the SDK is imported on start only when asked for, and the
 * process records into a no-op, so a cold start does not pay for it.
 *
 * Every attribute is from a bounded set (a route template, a method, a status code, an
 * admission operation and decision): never a name, a Secret, a token or a user.
 */

/** What the functions record. Each call is cheap and never throws. */
export interface Recorder {
  /**
   * One HTTP answer, as OpenTelemetry's `http.server.request.duration` (seconds) with
   * `http.route` (the matched route's template, `unmatched` otherwise), `http.request.method`
   * and `http.response.status_code`.
   */
  httpAnswer(route: string, method: string, status: number, seconds: number): void;
  /** One admission review decided (`captf.admission.reviews`), by operation and decision. */
  admissionReview(operation: string, allowed: boolean): void;
}

const NOOP: Recorder = { httpAnswer: () => undefined, admissionReview: () => undefined };
let recorder: Recorder = NOOP;

/** The process's recorder: a no-op until {@link startTelemetry} found an endpoint. */
export const telemetry = (): Recorder => recorder;
/** Whether anything is recorded (a caller may skip preparing what a no-op would drop). */
export const recording = (): boolean => recorder !== NOOP;

/** Telemetry as the environment asks for it. */
export interface TelemetryConfig {
  /** `service.name` of the resource: `OTEL_SERVICE_NAME`, or `captf-<function>`. */
  service: string;
  /** How often metrics are pushed, in ms (`OTEL_METRIC_EXPORT_INTERVAL`, default 60 000). */
  intervalMs: number;
}

/** Default of `OTEL_METRIC_EXPORT_INTERVAL`, in ms (OpenTelemetry's own default). */
const DEFAULT_INTERVAL_MS = 60_000;

/**
 * Reads OpenTelemetry's standard variables (the exporter itself reads the endpoint, headers
 * and timeout from them). Telemetry is on when `OTEL_EXPORTER_OTLP_ENDPOINT` or
 * `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set, unless `OTEL_SDK_DISABLED=true` or
 * `OTEL_METRICS_EXPORTER=none`. Pure.
 * @returns undefined when off.
 * @throws Error naming `OTEL_METRIC_EXPORT_INTERVAL` when it is not a whole number of ms ≥ 100.
 */
export function telemetryFromEnv(env: NodeJS.ProcessEnv, fn: string): TelemetryConfig | undefined {
  const v = (name: string): string => env[name]?.trim() ?? '';
  const endpoint = v('OTEL_EXPORTER_OTLP_METRICS_ENDPOINT') || v('OTEL_EXPORTER_OTLP_ENDPOINT');
  if (!endpoint || v('OTEL_SDK_DISABLED') === 'true' || v('OTEL_METRICS_EXPORTER') === 'none') return undefined;
  const raw = v('OTEL_METRIC_EXPORT_INTERVAL') || String(DEFAULT_INTERVAL_MS);
  const intervalMs = Number(raw);
  if (!Number.isInteger(intervalMs) || intervalMs < 100)
    throw new Error(`OTEL_METRIC_EXPORT_INTERVAL=${raw.slice(0, 20)} must be a whole number of ms, at least 100`);
  return { service: v('OTEL_SERVICE_NAME') || `captf-${fn}`, intervalMs };
}

/** A running export. */
export interface Telemetry {
  /** Pushes what was recorded and stops; bounded by `timeoutMs`. Never throws. */
  shutdown(timeoutMs: number): Promise<void>;
}

/** The admission operations recorded as such; anything else is `other`. */
const OPERATIONS = new Set(['CREATE', 'UPDATE', 'DELETE', 'CONNECT']);
/** The methods recorded as such (OpenTelemetry's rule: others are `_OTHER`). */
const METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']);
/** Buckets of `http.server.request.duration`, in seconds (OpenTelemetry's advice for it). */
const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10];

/**
 * Starts pushing metrics (OTLP/HTTP, JSON) and makes {@link telemetry} record into them.
 * Loads the SDK here, not at import.
 * @throws what the SDK throws for a malformed exporter setting.
 */
export async function startTelemetry(cfg: TelemetryConfig): Promise<Telemetry> {
  const [{ MeterProvider, PeriodicExportingMetricReader }, { OTLPMetricExporter }, { resourceFromAttributes }] =
    await Promise.all([
      import('@opentelemetry/sdk-metrics'),
      import('@opentelemetry/exporter-metrics-otlp-http'),
      import('@opentelemetry/resources'),
    ]);
  const reader = new PeriodicExportingMetricReader({
    exporter: new OTLPMetricExporter(),
    exportIntervalMillis: cfg.intervalMs,
    exportTimeoutMillis: Math.min(cfg.intervalMs, 30_000),
  });
  const provider = new MeterProvider({
    resource: resourceFromAttributes({ 'service.name': cfg.service }),
    readers: [reader],
  });
  const meter = provider.getMeter('captf-credentials');
  const duration = meter.createHistogram('http.server.request.duration', {
    unit: 's',
    description: 'Duration of HTTP server requests.',
    advice: { explicitBucketBoundaries: DURATION_BUCKETS },
  });
  const reviews = meter.createCounter('captf.admission.reviews', {
    unit: '{review}',
    description: 'Admission reviews decided, by operation and decision.',
  });
  recorder = {
    httpAnswer: (route, method, status, seconds) =>
      duration.record(seconds, {
        'http.route': route,
        'http.request.method': METHODS.has(method) ? method : '_OTHER',
        'http.response.status_code': status,
      }),
    admissionReview: (operation, allowed) =>
      reviews.add(1, {
        'captf.operation': OPERATIONS.has(operation) ? operation : 'other',
        'captf.decision': allowed ? 'allowed' : 'denied',
      }),
  };
  return {
    shutdown: async (timeoutMs) => {
      recorder = NOOP;
      await Promise.race([
        provider.shutdown().catch(() => undefined),
        new Promise((resolve) => setTimeout(resolve, timeoutMs).unref()),
      ]);
    },
  };
}
