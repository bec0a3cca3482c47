/**
 * The OpenTelemetry side of ./telemetry.ts, loaded only when an endpoint is set: one meter
 * provider pushing OTLP/HTTP (JSON) on an interval and on shutdown, and the instruments behind
 * each {@link Meters} call. Names follow OpenTelemetry's semantic conventions where one exists
 * (`http.server.request.duration`), the `captf.` namespace otherwise; Prometheus's OTLP receiver
 * turns them into `captf_…_total`, `…_seconds_bucket` and so on (docs/observability.md).
 */
import type { Attributes, Meter } from '@opentelemetry/api';
import { MeterProvider, PeriodicExportingMetricReader } from '@opentelemetry/sdk-metrics';
import { OTLPMetricExporter } from '@opentelemetry/exporter-metrics-otlp-http';
import { resourceOf, shutdownWithin, type Pusher } from './otel-shared.ts';
import type { Meters } from './telemetry.ts';

/** The admission operations recorded as such; anything else is `other`. */
const OPERATIONS = new Set(['CREATE', 'UPDATE', 'DELETE', 'CONNECT']);
/** The methods recorded as such (OpenTelemetry's rule: others are `_OTHER`). */
const METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']);
/** Buckets of every duration histogram, in seconds (OpenTelemetry's advice for HTTP durations). */
const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10];
/** Buckets of the start-up histogram, in seconds. */
const STARTUP_BUCKETS = [0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10];

/** A running metrics export and what records into it. */
export interface Metrics {
  recorder: Meters;
  /** Pushes what was recorded and stops, within `timeoutMs`. Never throws. */
  shutdown(timeoutMs: number): Promise<void>;
}

/**
 * Starts the export (the exporter reads `OTEL_EXPORTER_OTLP_*` itself: endpoint, headers,
 * timeout) and builds the instruments.
 * @param queueDepth what `captf.queue.depth` reads at each collection (undefined: no queue in this function).
 * @throws what the SDK throws for a malformed exporter setting.
 */
export async function startMetrics(
  cfg: Pusher & { intervalMs: number },
  queueDepth: () => number | undefined,
): Promise<Metrics> {
  const reader = new PeriodicExportingMetricReader({
    exporter: new OTLPMetricExporter(),
    exportIntervalMillis: cfg.intervalMs,
    exportTimeoutMillis: Math.min(cfg.intervalMs, 30_000),
  });
  const provider = new MeterProvider({
    resource: resourceOf(cfg),
    readers: [reader],
  });
  const recorder = recorderOf(instruments(provider.getMeter('captf-credentials'), queueDepth));
  return {
    recorder,
    shutdown: async (timeoutMs) => {
      await shutdownWithin(() => provider.shutdown(), timeoutMs);
    },
  };
}

/** Every instrument the recorder writes to. */
type Instruments = ReturnType<typeof instruments>;

/** Creates the instruments; the queue's depth is observed at each collection. */
function instruments(meter: Meter, queueDepth: () => number | undefined) {
  const seconds = (name: string, description: string, buckets = DURATION_BUCKETS) =>
    meter.createHistogram(name, { unit: 's', description, advice: { explicitBucketBoundaries: buckets } });
  const count = (name: string, unit: string, description: string) => meter.createCounter(name, { unit, description });
  const gauge = (name: string, unit: string, description: string) => meter.createGauge(name, { unit, description });
  meter
    .createObservableGauge('captf.queue.depth', { unit: '{name}', description: 'Names being worked on now.' })
    .addCallback((r) => {
      const depth = queueDepth();
      if (depth !== undefined) r.observe(depth);
    });
  return {
    answers: seconds('http.server.request.duration', 'Duration of HTTP server requests.'),
    api: seconds('captf.api.request.duration', 'Requests to the Kubernetes API server, by verb, resource and code.'),
    reconcileTime: seconds('captf.reconcile.duration', 'Mirror keys reconciled on their own, by result.'),
    startup: seconds('captf.process.startup.duration', 'Process start to listening.', STARTUP_BUCKETS),
    reviews: count('captf.admission.reviews', '{review}', 'Admission reviews decided, by operation and decision.'),
    checks: count('captf.access.checks', '{check}', 'SubjectAccessReviews and TokenReviews answered, by verdict.'),
    events: count(
      'captf.events',
      '{event}',
      'CloudEvents handled by mirror-sync, by what they asked and how it ended.',
    ),
    reconciles: count('captf.reconciles', '{key}', 'Mirror keys reconciled (on their own or in a pass), by result.'),
    writes: count('captf.mirror.writes', '{request}', 'Requests to mirror Secrets, by kind and result.'),
    statuses: count('captf.consumer.status.writes', '{write}', "Consumers' conditions written, by outcome."),
    coalesced: count('captf.queue.coalesced', '{request}', "Requests folded into a name's follow-up run."),
    ready: gauge('captf.identity.ready', '', '1 when the identity is Ready=True, else 0.'),
    namespaces: gauge('captf.identity.namespaces', '{namespace}', 'Namespaces in status.namespaces of the identity.'),
    byReason: gauge('captf.identities', '{identity}', 'Identities by the reason of their Ready condition.'),
  };
}

/** The recorder writing to `i`, each attribute from a bounded set (telemetry.ts). */
function recorderOf(i: Instruments): Meters {
  const reasonsSeen = new Set<string>();
  return {
    httpAnswer: (route, method, status, s) =>
      i.answers.record(s, {
        'http.route': route,
        'http.request.method': METHODS.has(method) ? method : '_OTHER',
        'http.response.status_code': status,
      }),
    apiRequest: (verb, resource, status, s) => i.api.record(s, apiAttributes(verb, resource, status)),
    admissionReview: (operation, allowed) =>
      i.reviews.add(1, {
        'captf.operation': OPERATIONS.has(operation) ? operation : 'other',
        'captf.decision': verdict(allowed),
      }),
    accessCheck: (check, allowed) => i.checks.add(1, { 'captf.check': check, 'captf.decision': verdict(allowed) }),
    event: (kind, result) => i.events.add(1, { 'captf.event': kind, 'captf.result': result }),
    reconcile: (result, s) => {
      i.reconciles.add(1, { 'captf.result': result });
      if (s !== undefined) i.reconcileTime.record(s, { 'captf.result': result });
    },
    mirrorWrite: (kind, result) => i.writes.add(1, { 'captf.write': kind, 'captf.result': result }),
    consumerStatus: (outcome) => i.statuses.add(1, { 'captf.outcome': outcome }),
    coalesced: () => i.coalesced.add(1),
    identity: (name, isReady, n) => {
      i.ready.record(isReady ? 1 : 0, { 'captf.identity': name });
      i.namespaces.record(n, { 'captf.identity': name });
    },
    identitiesByReason: (counts) => {
      for (const r of counts.keys()) reasonsSeen.add(r);
      for (const r of reasonsSeen) i.byReason.record(counts.get(r) ?? 0, { 'captf.reason': r });
    },
    started: (s) => i.startup.record(s),
  };
}

const verdict = (allowed: boolean): string => (allowed ? 'allowed' : 'denied');

/** An API request's attributes: its code, or `error.type` when no answer came. */
function apiAttributes(verb: string, resource: string, status: number | undefined): Attributes {
  const answered = status === undefined ? { 'error.type': 'no_answer' } : { 'http.response.status_code': status };
  return { 'captf.verb': verb, 'captf.resource': resource, ...answered };
}
