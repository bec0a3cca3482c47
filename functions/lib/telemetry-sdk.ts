/**
 * The OpenTelemetry side of ./telemetry.ts, loaded only when an endpoint is set: one meter
 * provider pushing OTLP/HTTP (JSON) on an interval and on shutdown, and the instruments behind
 * each {@link Meters} call. Names follow OpenTelemetry's semantic conventions where one exists
 * (`http.server.request.duration`), the `captf.` namespace otherwise; Prometheus's OTLP receiver
 * turns them into `captf_…_total`, `…_seconds_bucket` and so on (docs/observability.md).
 */
import type { Attributes, Meter, ObservableResult } from '@opentelemetry/api';
import {
  AggregationTemporality,
  InstrumentType,
  MeterProvider,
  PeriodicExportingMetricReader,
  type PushMetricExporter,
} from '@opentelemetry/sdk-metrics';
import { OTLPMetricExporter } from '@opentelemetry/exporter-metrics-otlp-http';
import { resourceOf, shutdownWithin, type Pusher } from './otel-shared.ts';
import { admissionOperation, type Meters } from './telemetry.ts';

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
    exporter: currentGauges(new OTLPMetricExporter()),
    exportIntervalMillis: cfg.intervalMs,
    exportTimeoutMillis: Math.min(cfg.intervalMs, 30_000),
  });
  const provider = new MeterProvider({
    resource: resourceOf(cfg),
    readers: [reader],
  });
  const identities: IdentityGauges = { byName: new Map(), byReason: new Map() };
  const meter = provider.getMeter('captf-credentials');
  const recorder = recorderOf(instruments(meter, { queueDepth, identities }), identities);
  return {
    recorder,
    shutdown: async (timeoutMs) => {
      await shutdownWithin(() => provider.shutdown(), timeoutMs);
    },
  };
}

/**
 * `exporter`, with every gauge exported as what is observed at that collection only (delta):
 * an identity deleted since the last refresh leaves no series behind, where cumulative gauges
 * would report every attribute set ever observed. Counters and histograms stay cumulative, as
 * Prometheus's OTLP receiver needs them.
 */
function currentGauges(exporter: PushMetricExporter): PushMetricExporter {
  return {
    export: (metrics, done) => exporter.export(metrics, done),
    forceFlush: () => exporter.forceFlush(),
    shutdown: () => exporter.shutdown(),
    selectAggregationTemporality: (type) =>
      type === InstrumentType.OBSERVABLE_GAUGE || type === InstrumentType.GAUGE
        ? AggregationTemporality.DELTA
        : AggregationTemporality.CUMULATIVE,
  };
}

/** What identity-status's gauges read at each collection: its last view of each identity, and of the reasons. */
interface IdentityGauges {
  readonly byName: Map<string, { ready: boolean; namespaces: number }>;
  readonly byReason: Map<string, number>;
}

/** Every instrument the recorder writes to. */
type Instruments = ReturnType<typeof instruments>;

/** Creates the instruments; the gauges are observed at each collection from `observed`. */
function instruments(meter: Meter, observed: { queueDepth: () => number | undefined; identities: IdentityGauges }) {
  const seconds = (name: string, description: string, buckets = DURATION_BUCKETS) =>
    meter.createHistogram(name, { unit: 's', description, advice: { explicitBucketBoundaries: buckets } });
  const count = (name: string, unit: string, description: string) => meter.createCounter(name, { unit, description });
  const gauge = (name: string, unit: string, description: string, read: (r: ObservableResult) => void) =>
    meter.createObservableGauge(name, { unit, description }).addCallback(read);
  const { byName, byReason } = observed.identities;
  gauge('captf.queue.depth', '{name}', 'Names being worked on now.', (r) => {
    const depth = observed.queueDepth();
    if (depth !== undefined) r.observe(depth);
  });
  gauge('captf.identity.ready', '', '1 when the identity is Ready=True, else 0.', (r) => {
    for (const [name, v] of byName) r.observe(v.ready ? 1 : 0, { 'captf.identity': name });
  });
  gauge('captf.identity.namespaces', '{namespace}', 'Namespaces in status.namespaces of the identity.', (r) => {
    for (const [name, v] of byName) r.observe(v.namespaces, { 'captf.identity': name });
  });
  gauge('captf.identities', '{identity}', 'Identities by the reason of their Ready condition.', (r) => {
    for (const [reason, n] of byReason) r.observe(n, { 'captf.reason': reason });
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
    deadLetters: count(
      'captf.dead_letters',
      '{event}',
      'Events the Broker gave up on, by the function they were for, type and last HTTP status.',
    ),
  };
}

/** The recorder writing to `i` and `identities`, each attribute from a bounded set (telemetry.ts). */
function recorderOf(i: Instruments, identities: IdentityGauges): Meters {
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
        'captf.operation': admissionOperation(operation),
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
    identities: (view) => {
      if (view.full) identities.byName.clear();
      for (const name of view.gone) identities.byName.delete(name);
      for (const { name, ready, namespaces } of view.refreshed) identities.byName.set(name, { ready, namespaces });
      if (!view.full) return;
      identities.byReason.clear();
      for (const [reason, n] of view.full.byReason) identities.byReason.set(reason, n);
    },
    started: (s) => i.startup.record(s),
    deadLetter: ({ target, type, code }) =>
      i.deadLetters.add(1, { 'captf.function': target, 'captf.event_type': type, 'captf.code': code }),
  };
}

const verdict = (allowed: boolean): string => (allowed ? 'allowed' : 'denied');

/** An API request's attributes: its code, or `error.type` when no answer came. */
function apiAttributes(verb: string, resource: string, status: number | undefined): Attributes {
  const answered = status === undefined ? { 'error.type': 'no_answer' } : { 'http.response.status_code': status };
  return { 'captf.verb': verb, 'captf.resource': resource, ...answered };
}
