/**
 * SPEC §13, telemetry: what the functions count and trace, exported with OpenTelemetry's SDK as
 * OTLP over HTTP (push: a pod that scales to zero may be gone before any scrape) when the
 * environment names an endpoint, and flushed within the SIGTERM drain. With no endpoint set
 * nothing of OpenTelemetry is loaded: the SDK (./telemetry-sdk.ts, ./tracing-sdk.ts) is imported
 * on start only when asked for, and the process records into a no-op, so a cold start does not
 * pay for it.
 *
 * Every metric attribute is from a bounded set (a route template, a method, a status code, an
 * outcome, an API verb and resource): never a Secret, a token or a user. The one name recorded
 * is an identity's, on identity-status's per-identity gauges: identities are cluster-scoped
 * objects an operator creates, few, and "which one is not ready" is the question those gauges
 * answer. Spans may name objects (a namespace, an identity, an API path's resource), never
 * Secret data, a token or the requesting user; every value is cut short (./tracing-sdk.ts).
 * docs/observability.md lists every metric and span.
 */
import { randomUUID } from 'node:crypto';

/** What a CloudEvent asked of mirror-sync (bounded: lib/cloudevents.ts's targets, a key, a ping). */
export type EventKind = 'ping' | 'key' | 'consumer' | 'identity' | 'namespace' | 'secret' | 'unusable';
/** How one event ended: its work done, nothing to do (an echo, an unlabelled Secret), retried, or refused. */
export type EventResult = 'done' | 'skipped' | 'retry' | 'bad';
/** How one key's reconcile ended: done, retried (5xx), or refused for good (`MirrorFailed`). */
export type ReconcileResult = 'done' | 'retry' | 'refused';
/** One mirror request: an owner reference added or removed by merge, a delete for a revocation or for want of users. */
export type MirrorWriteKind = 'create' | 'update' | 'merge' | 'delete' | 'revoke';
/** How a mirror request ended (mirror-sync/errors.ts's classes, or `ok`). */
export type WriteResult = 'ok' | 'conflict' | 'retry' | 'permanent';
/** The checks the functions ask of the API server. */
export type AccessCheck = 'SubjectAccessReview' | 'TokenReview';

/** What a span's attributes may hold: object names and outcomes, never Secret data or a token. */
export type SpanAttributes = Record<string, string | number | boolean>;

/** The span a {@link Tracing.span} callback runs in. Each call is cheap and never throws. */
export interface SpanHandle {
  /** Adds attributes. */
  set(attributes: SpanAttributes): void;
  /** Renames it (a server span learns its route once matched). */
  rename(name: string): void;
  /** Marks it failed, with a safe description. */
  fail(description: string): void;
  /** Writes its trace context into an outgoing request's headers (`traceparent`): the callee continues it. */
  inject(setHeader: (name: string, value: string) => void): void;
}

/** How a span starts. */
export interface SpanOptions {
  /** `server` for an answered request, `client` for a request sent; default `internal`. */
  kind?: 'server' | 'client' | 'internal';
  attributes?: SpanAttributes;
  /** An incoming request's headers: the span continues their W3C trace context (`traceparent`). */
  parent?: Record<string, string | string[] | undefined>;
  /**
   * Nothing of this process is traced under it (an API request): it is not made the current
   * span, which spares carrying a context across its awaits.
   */
  leaf?: boolean;
}

/** Traces (./tracing-sdk.ts). */
export interface Tracing {
  /**
   * Runs `fn` in a new span, a child of the current one (or of `opts.parent`'s context), ended
   * when `fn` settles; a rejection marks it failed and is passed on.
   */
  span<T>(name: string, opts: SpanOptions, fn: (span: SpanHandle) => Promise<T>): Promise<T>;
  /** The current span's ids, for a log line; undefined outside a span or when off. */
  logIds(): { trace_id: string; span_id: string } | undefined;
}

/** What the functions count. Each call is cheap and never throws. */
export interface Meters {
  /**
   * One HTTP answer, as OpenTelemetry's `http.server.request.duration` (seconds) with
   * `http.route` (the matched route's template, `unmatched` otherwise), `http.request.method`
   * and `http.response.status_code`.
   */
  httpAnswer(route: string, method: string, status: number, seconds: number): void;
  /**
   * One API request (`captf.api.request.duration`, seconds) by verb, resource (with its
   * subresource) and status code; `status` undefined when no answer came (`error.type`).
   */
  apiRequest(verb: string, resource: string, status: number | undefined, seconds: number): void;
  /** One admission review decided (`captf.admission.reviews`), by operation and decision. */
  admissionReview(operation: string, allowed: boolean): void;
  /** One SubjectAccessReview or TokenReview answered (`captf.access.checks`), by verdict. */
  accessCheck(check: AccessCheck, allowed: boolean): void;
  /** One event handled by mirror-sync (`captf.events`). */
  event(kind: EventKind, result: EventResult): void;
  /**
   * One key reconciled (`captf.reconciles`), with its duration when it ran on its own
   * (`captf.reconcile.duration`, seconds; a pass's keys share the pass's time).
   */
  reconcile(result: ReconcileResult, seconds?: number): void;
  /** One mirror request sent (`captf.mirror.writes`). */
  mirrorWrite(kind: MirrorWriteKind, result: WriteResult): void;
  /** A consumer's conditions written (`captf.consumer.status.writes`), by the outcome written (decide.ts). */
  consumerStatus(outcome: string): void;
  /** A request folded into a name's follow-up run (`captf.queue.coalesced`). */
  coalesced(): void;
  /**
   * identity-status's view after a refresh, which its gauges report until the next one:
   * `captf.identity.ready` (1 when `Ready=True`) and `captf.identity.namespaces` per identity,
   * and after a full refresh `captf.identities` per `Ready` reason.
   */
  identities(view: IdentityView): void;
  /** The process started and is listening (`captf.process.startup.duration`, seconds). */
  started(seconds: number): void;
  /**
   * One dead letter taken (`captf.dead_letters`), by the function it was for, its event type and
   * Knative's last HTTP status; each label from a bounded set (dead-letters/describe.ts).
   */
  deadLetter(labels: { target: string; type: string; code: string }): void;
}

/** What one refresh of identity-status saw. */
export interface IdentityView {
  /** The identities refreshed: name, whether `Ready=True`, how many namespaces they are used in. */
  refreshed: readonly { name: string; ready: boolean; namespaces: number }[];
  /** The identities found gone: their series end. */
  gone: readonly string[];
  /** A full refresh: any identity not in `refreshed` is gone too; identities per reason (0 for none). */
  full?: { byReason: ReadonlyMap<string, number> };
}

/** The admission operations recorded as such. */
const OPERATIONS = new Set(['CREATE', 'UPDATE', 'DELETE', 'CONNECT']);
/** An AdmissionReview's operation as recorded (a metric label, a span name): a known one, or `other`. */
export const admissionOperation = (operation: string): string => (OPERATIONS.has(operation) ? operation : 'other');

/** What the functions record: counts and spans. */
export type Recorder = Meters & Tracing;

const NO_SPAN: SpanHandle = {
  set: () => undefined,
  rename: () => undefined,
  fail: () => undefined,
  inject: () => undefined,
};
/** Traces when off: `fn` runs as it would without them. */
export const NO_TRACES: Tracing = {
  span: (_name, _opts, fn) => fn(NO_SPAN),
  logIds: () => undefined,
};

/** Metrics when off. */
export const NO_METERS: Meters = {
  httpAnswer: () => undefined,
  apiRequest: () => undefined,
  admissionReview: () => undefined,
  accessCheck: () => undefined,
  event: () => undefined,
  reconcile: () => undefined,
  mirrorWrite: () => undefined,
  consumerStatus: () => undefined,
  coalesced: () => undefined,
  identities: () => undefined,
  started: () => undefined,
  deadLetter: () => undefined,
};
const NOOP: Recorder = { ...NO_METERS, ...NO_TRACES };
let recorder: Recorder = NOOP;

/** The process's recorder: a no-op until {@link startTelemetry} found an endpoint. */
export const telemetry = (): Recorder => recorder;
/** Whether anything is recorded (a caller may skip preparing what a no-op would drop). */
export const recording = (): boolean => recorder !== NOOP;

// What `captf.queue.depth` reads at each collection (registered whether or not telemetry is on).
let queueDepth: (() => number) | undefined;

/**
 * Registers what `captf.queue.depth` reads at each collection: the names being worked on now
 * (mirror-sync's one queue). A later registration replaces an earlier one.
 */
export function watchQueueDepth(read: () => number): void {
  queueDepth = read;
}

/** Telemetry as the environment asks for it: metrics, traces, or both. */
export interface TelemetryConfig {
  /** `service.name` of the resource: `OTEL_SERVICE_NAME`, or `captf-<function>`. */
  service: string;
  /** Metrics, pushed every `intervalMs` (`OTEL_METRIC_EXPORT_INTERVAL`, default 60 000). */
  metrics?: { intervalMs: number };
  /** Traces, sampled as `OTEL_TRACES_SAMPLER` and `…_ARG` say (default `parentbased_always_on`). */
  traces?: { sampler: Sampler; ratio: number };
}

/** The samplers of `OTEL_TRACES_SAMPLER` (OpenTelemetry's names). */
export const SAMPLERS = [
  'always_on',
  'always_off',
  'traceidratio',
  'parentbased_always_on',
  'parentbased_always_off',
  'parentbased_traceidratio',
] as const;
/** One of {@link SAMPLERS}. */
export type Sampler = (typeof SAMPLERS)[number];

/** Default of `OTEL_METRIC_EXPORT_INTERVAL`, in ms (OpenTelemetry's own default). */
const DEFAULT_INTERVAL_MS = 60_000;

/**
 * Reads OpenTelemetry's standard variables (the exporters themselves read the endpoints,
 * headers and timeouts from them). Metrics are on when `OTEL_EXPORTER_OTLP_ENDPOINT` or
 * `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set and `OTEL_METRICS_EXPORTER` is not `none`;
 * traces likewise with `…_TRACES_ENDPOINT` and `OTEL_TRACES_EXPORTER`; neither with
 * `OTEL_SDK_DISABLED=true` (any case). What the functions cannot do is refused rather than
 * ignored: another exporter than `otlp`, another protocol than `http/json`. Pure.
 * @returns undefined when both are off.
 * @throws Error naming the variable when an endpoint is not an http(s) URL, an exporter or a
 *   protocol is not supported, `OTEL_METRIC_EXPORT_INTERVAL` is not a whole number of ms from
 *   100 to a day, `OTEL_TRACES_SAMPLER` is not one of {@link SAMPLERS}, or a ratio sampler's
 *   `OTEL_TRACES_SAMPLER_ARG` is not a number from 0 to 1.
 */
export function telemetryFromEnv(env: NodeJS.ProcessEnv, fn: string): TelemetryConfig | undefined {
  const v = (name: string): string => env[name]?.trim() ?? '';
  if (v('OTEL_SDK_DISABLED').toLowerCase() === 'true') return undefined;
  const on = (signal: 'METRICS' | 'TRACES'): boolean => {
    const exporter = v(`OTEL_${signal}_EXPORTER`) || 'otlp';
    if (exporter === 'none') return false;
    const endpoint = endpointFrom(env, signal);
    if (exporter !== 'otlp')
      throw new Error(`OTEL_${signal}_EXPORTER=${exporter.slice(0, 40)}: only otlp (or none) is supported`);
    for (const name of [`OTEL_EXPORTER_OTLP_${signal}_PROTOCOL`, 'OTEL_EXPORTER_OTLP_PROTOCOL']) {
      const protocol = v(name);
      if (protocol && protocol !== 'http/json')
        throw new Error(
          `${name}=${protocol.slice(0, 40)}: only http/json is supported (no gRPC or protobuf is loaded)`,
        );
    }
    return endpoint !== undefined;
  };
  const metrics = on('METRICS') ? { intervalMs: intervalFrom(v('OTEL_METRIC_EXPORT_INTERVAL')) } : undefined;
  const traces = on('TRACES') ? samplerFrom(v('OTEL_TRACES_SAMPLER'), v('OTEL_TRACES_SAMPLER_ARG')) : undefined;
  if (!metrics && !traces) return undefined;
  return {
    service: v('OTEL_SERVICE_NAME') || `captf-${fn}`,
    ...(metrics ? { metrics } : {}),
    ...(traces ? { traces } : {}),
  };
}

/**
 * The endpoint a signal is pushed to, its own variable first; undefined when neither is set.
 * @throws Error naming the variable when it is not an http or https URL.
 */
function endpointFrom(env: NodeJS.ProcessEnv, signal: 'METRICS' | 'TRACES'): URL | undefined {
  for (const name of [`OTEL_EXPORTER_OTLP_${signal}_ENDPOINT`, 'OTEL_EXPORTER_OTLP_ENDPOINT']) {
    const raw = env[name]?.trim();
    if (!raw) continue;
    const url = URL.parse(raw);
    if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:'))
      throw new Error(`${name} must be an http or https URL`);
    return url;
  }
  return undefined;
}

/** The longest `OTEL_METRIC_EXPORT_INTERVAL`, in ms: a day (a timer cannot wait past 2³¹ ms anyway). */
const MAX_INTERVAL_MS = 86_400_000;

/** `OTEL_METRIC_EXPORT_INTERVAL` in ms. @throws Error naming it (see {@link telemetryFromEnv}). */
function intervalFrom(raw: string): number {
  const ms = Number(raw || DEFAULT_INTERVAL_MS);
  if (!Number.isInteger(ms) || ms < 100 || ms > MAX_INTERVAL_MS)
    throw new Error(
      `OTEL_METRIC_EXPORT_INTERVAL=${raw.slice(0, 20)} must be a whole number of ms from 100 to ${MAX_INTERVAL_MS}`,
    );
  return ms;
}

/** `OTEL_TRACES_SAMPLER` and its argument. @throws Error naming them (see {@link telemetryFromEnv}). */
function samplerFrom(name: string, arg: string): NonNullable<TelemetryConfig['traces']> {
  const sampler = (name || 'parentbased_always_on') as Sampler;
  if (!SAMPLERS.includes(sampler))
    throw new Error(`OTEL_TRACES_SAMPLER=${name.slice(0, 40)} must be one of ${SAMPLERS.join(', ')}`);
  const ratio = Number(arg || 1);
  if (sampler.endsWith('traceidratio') && !(ratio >= 0 && ratio <= 1))
    throw new Error(`OTEL_TRACES_SAMPLER_ARG=${arg.slice(0, 20)} must be a number from 0 to 1`);
  return { sampler, ratio };
}

/** A running export. */
export interface Telemetry {
  /** Pushes what was recorded and stops; bounded by `timeoutMs`. Never throws. */
  shutdown(timeoutMs: number): Promise<void>;
}

/**
 * Starts pushing what `cfg` turns on and makes {@link telemetry} record into it. Loads the SDK
 * (./telemetry-sdk.ts for metrics, ./tracing-sdk.ts for traces) here, not at import.
 * @throws what the SDK throws for a malformed exporter setting.
 */
export async function startTelemetry(cfg: TelemetryConfig): Promise<Telemetry> {
  const who = { service: cfg.service, instance: randomUUID() };
  const { metrics: m, traces: t } = cfg;
  const [metrics, traces] = await Promise.all([
    m && import('./telemetry-sdk.ts').then((sdk) => sdk.startMetrics({ ...who, ...m }, () => queueDepth?.())),
    t && import('./tracing-sdk.ts').then((sdk) => sdk.startTraces({ ...who, ...t })),
  ]);
  recorder = { ...(metrics?.recorder ?? NO_METERS), ...(traces?.tracing ?? NO_TRACES) };
  return {
    shutdown: async (timeoutMs) => {
      recorder = NOOP;
      await Promise.all([metrics?.shutdown(timeoutMs), traces?.shutdown(timeoutMs)]);
    },
  };
}
