/**
 * SPEC §13, telemetry: what the functions count, exported with OpenTelemetry's SDK as OTLP over
 * HTTP (push: a pod that scales to zero may be gone before any scrape) when the environment
 * names an endpoint, and flushed within the SIGTERM drain. With no endpoint set nothing of
 * OpenTelemetry is loaded: the SDK (./telemetry-sdk.ts) is imported on start only when asked
 * for, and the process records into a no-op, so a cold start does not pay for it.
 *
 * Every attribute is from a bounded set (a route template, a method, a status code, an outcome,
 * an API verb and resource): never a Secret, a token or a user. The one name recorded is an
 * identity's, on identity-status's per-identity gauges: identities are cluster-scoped objects
 * an operator creates, few, and "which one is not ready" is the question those gauges answer.
 * docs/observability.md lists every metric.
 */

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

/** What the functions record. Each call is cheap and never throws. */
export interface Recorder {
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
   * identity-status's view of one identity after a refresh (`captf.identity.ready`: 1 when
   * `Ready=True`; `captf.identity.namespaces`: its `status.namespaces` count).
   */
  identity(name: string, ready: boolean, namespaces: number): void;
  /** A full refresh's count of identities per `Ready` reason (`captf.identities`); absent reasons count 0. */
  identitiesByReason(counts: ReadonlyMap<string, number>): void;
  /** The process started and is listening (`captf.process.startup.duration`, seconds). */
  started(seconds: number): void;
}

const NOOP: Recorder = {
  httpAnswer: () => undefined,
  apiRequest: () => undefined,
  admissionReview: () => undefined,
  accessCheck: () => undefined,
  event: () => undefined,
  reconcile: () => undefined,
  mirrorWrite: () => undefined,
  consumerStatus: () => undefined,
  coalesced: () => undefined,
  identity: () => undefined,
  identitiesByReason: () => undefined,
  started: () => undefined,
};
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

/**
 * Starts pushing metrics (OTLP/HTTP, JSON) and makes {@link telemetry} record into them.
 * Loads the SDK (./telemetry-sdk.ts) here, not at import.
 * @throws what the SDK throws for a malformed exporter setting.
 */
export async function startTelemetry(cfg: TelemetryConfig): Promise<Telemetry> {
  const { startMetrics } = await import('./telemetry-sdk.ts');
  const started = await startMetrics(cfg, () => queueDepth?.());
  recorder = started.recorder;
  return {
    shutdown: async (timeoutMs) => {
      recorder = NOOP;
      await started.shutdown(timeoutMs);
    },
  };
}
