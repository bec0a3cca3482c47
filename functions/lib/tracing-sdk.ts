/**
 * The tracing side of ./telemetry.ts, loaded only when a traces endpoint is set: one tracer
 * provider exporting OTLP/HTTP (JSON) in batches and on shutdown, the active span carried across
 * `await` by Node's AsyncLocalStorage, and W3C trace context read from an incoming request (the
 * Broker's dispatcher sends `traceparent`, Knative's `config-observability` decides whether its
 * own spans are sampled) and written into the API requests made under it.
 */
import {
  context,
  defaultTextMapGetter,
  isSpanContextValid,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  type Span,
} from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BatchSpanProcessor,
  ParentBasedSampler,
  TraceIdRatioBasedSampler,
  TracerProvider,
  type Sampler as SdkSampler,
} from '@opentelemetry/sdk-trace';
import { resourceOf, shutdownWithin, type Pusher } from './otel-shared.ts';
import {
  NO_TRACES,
  type Sampler,
  type SpanAttributes,
  type SpanHandle,
  type SpanOptions,
  type Tracing,
} from './telemetry.ts';

/** A running trace export and what records into it. */
export interface Traces {
  tracing: Tracing;
  /** Exports what was recorded and stops, within `timeoutMs`. Never throws. */
  shutdown(timeoutMs: number): Promise<void>;
}

/** The longest attribute value or status message a span keeps, in characters. */
const ATTRIBUTE_LENGTH = 256;

const KINDS = { server: SpanKind.SERVER, client: SpanKind.CLIENT, internal: SpanKind.INTERNAL } as const;

/**
 * Starts the export (the exporter reads `OTEL_EXPORTER_OTLP_*` itself) and makes the process's
 * context follow async work.
 * @throws what the SDK throws for a malformed exporter setting.
 */
export async function startTraces(cfg: Pusher & { sampler: Sampler; ratio: number }): Promise<Traces> {
  const contextManager = new AsyncLocalStorageContextManager().enable();
  context.setGlobalContextManager(contextManager);
  const provider = new TracerProvider({
    resource: resourceOf(cfg),
    // A caller chooses some values (an event's id, an object's name): each is cut short, so the
    // spans waiting for export cannot hold what the body budget keeps out of memory.
    spanLimits: {
      attributeValueLengthLimit: ATTRIBUTE_LENGTH,
      attributeCountLimit: 32,
      eventCountLimit: 0,
      linkCountLimit: 0,
    },
    sampler: samplerOf(cfg.sampler, cfg.ratio),
    spanProcessors: [new BatchSpanProcessor({ exporter: new OTLPTraceExporter() })],
  });
  const tracer = provider.getTracer('captf-credentials');
  const propagator = new W3CTraceContextPropagator();
  const tracing: Tracing = {
    span: (name, opts: SpanOptions, fn) => {
      // Under a span the sampler dropped, every sampler drops the children too (the same trace
      // id, or the parent's choice): none is made, and no context is switched for it.
      if (!opts.parent && droppedHere()) return NO_TRACES.span(name, opts, fn);
      const parent = opts.parent
        ? propagator.extract(ROOT_CONTEXT, opts.parent, defaultTextMapGetter)
        : context.active();
      const start = {
        kind: KINDS[opts.kind ?? 'internal'],
        ...(opts.attributes ? { attributes: bounded(opts.attributes) } : {}),
      };
      const run = (span: Span) => settle(span, () => fn(handleOf(span, propagator)));
      return opts.leaf ? run(tracer.startSpan(name, start, parent)) : tracer.startActiveSpan(name, start, parent, run);
    },
    logIds: () => {
      const c = trace.getSpan(context.active())?.spanContext();
      return c && isSpanContextValid(c) ? { trace_id: c.traceId, span_id: c.spanId } : undefined;
    },
  };
  return {
    tracing,
    shutdown: async (timeoutMs) => {
      await shutdownWithin(() => provider.shutdown(), timeoutMs);
      contextManager.disable();
    },
  };
}

/**
 * `text` cut at {@link ATTRIBUTE_LENGTH}, as a string of its own: V8 makes a long slice a view
 * of the whole string it came from, so a span holding `id.slice(0, 256)` would keep a caller's
 * 3 MB id alive in the export queue anyway.
 */
function cut(text: string): string {
  return text.length <= ATTRIBUTE_LENGTH ? text : Buffer.from(text.slice(0, ATTRIBUTE_LENGTH)).toString();
}

/** `attributes` with every string value {@link cut}. */
function bounded(attributes: SpanAttributes): SpanAttributes {
  const out: SpanAttributes = {};
  for (const [k, v] of Object.entries(attributes)) out[k] = typeof v === 'string' ? cut(v) : v;
  return out;
}

/** Whether the active span is one the sampler dropped (a valid trace, not recorded). */
function droppedHere(): boolean {
  const current = trace.getSpan(context.active());
  return current !== undefined && !current.isRecording() && isSpanContextValid(current.spanContext());
}

/** Runs `work` and ends `span` once it settles; a failure marks the span failed and is passed on. */
async function settle<T>(span: Span, work: () => Promise<T>): Promise<T> {
  try {
    return await work();
  } catch (err) {
    // Only the error's class: its message may quote an API server's answer (untrusted).
    span.setStatus({ code: SpanStatusCode.ERROR, message: err instanceof Error ? err.name : 'error' });
    throw err;
  } finally {
    span.end();
  }
}

/** The span a callback sees. */
const handleOf = (span: Span, propagator: W3CTraceContextPropagator): SpanHandle => ({
  set: (attributes) => span.setAttributes(bounded(attributes)),
  rename: (name) => span.updateName(cut(name)),
  fail: (description) => span.setStatus({ code: SpanStatusCode.ERROR, message: cut(description) }),
  inject: (setHeader) =>
    propagator.inject(trace.setSpan(ROOT_CONTEXT, span), undefined, {
      set: (_carrier, key, value) => setHeader(key, value),
    }),
});

/** The sampler `OTEL_TRACES_SAMPLER` names, as OpenTelemetry's SDKs build it. */
function samplerOf(name: Sampler, ratio: number): SdkSampler {
  const root = name.endsWith('always_off')
    ? new AlwaysOffSampler()
    : name.endsWith('traceidratio')
      ? new TraceIdRatioBasedSampler(ratio)
      : new AlwaysOnSampler();
  return name.startsWith('parentbased_') ? new ParentBasedSampler({ root }) : root;
}
