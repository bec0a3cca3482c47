/**
 * A real Jaeger for the functions' traces (SPEC §13): Jaeger v2 built from its Go module (tool
 * set `observability`), on loopback, its memory store fed by an OTLP/HTTP receiver, answering
 * its query API (`/api/v3/traces`). Nothing else of the all-in-one configuration runs (no
 * other receivers, no remote sampling, no own metrics), so every port is one it was given.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ensureTool } from '../tools/build.ts';
import { ON_THIS_MACHINE, startReceiver, type ReceiverPlace } from './receiver.ts';

/** One span as Jaeger's query API answers it (OTLP JSON), with its service. */
export interface StoredSpan {
  service: string;
  traceId: string;
  spanId: string;
  /** '' for a root span. */
  parentSpanId: string;
  name: string;
  /** OTLP's SpanKind number: 1 internal, 2 server, 3 client. */
  kind: number;
  attributes: Record<string, string | number | boolean>;
  /** OTLP's status code: 0 unset, 1 ok, 2 error. */
  status: number;
}

/** A running Jaeger. */
export interface Jaeger {
  /** Where a function pushes (from where it runs): set as `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`. */
  otlpTracesEndpoint: string;
  /** The query API and UI: `http://127.0.0.1:<port>`. */
  url: string;
  /** Every span of one trace (hex id); [] when Jaeger has none. @throws Error on another failure. */
  trace(traceId: string): Promise<StoredSpan[]>;
  stop(): Promise<void>;
}

/**
 * Starts Jaeger with its configuration and log under `dir` (built when missing).
 * @throws Error naming its log when it is not ready in time (it is stopped first).
 */
export async function startJaeger(o: {
  dir: string;
  log?: (line: string) => void;
  /** Where it runs (default: this machine's loopback). */
  place?: ReceiverPlace;
}): Promise<Jaeger> {
  const bin = await ensureTool('observability', 'jaeger', o.log);
  mkdirSync(o.dir, { recursive: true });
  const place = o.place ?? ON_THIS_MACHINE;
  const [otlp, query, grpc, health] = [await place.port(), await place.port(), await place.port(), await place.port()];
  const at = (port: number) => `${place.bind}:${port}`;
  const config = join(o.dir, 'jaeger.yaml');
  // JSON is YAML; the collector-style configuration of cmd/jaeger/config.yaml, trimmed.
  writeFileSync(
    config,
    JSON.stringify({
      service: {
        extensions: ['jaeger_storage', 'jaeger_query', 'healthcheckv2'],
        pipelines: { traces: { receivers: ['otlp'], processors: ['batch'], exporters: ['jaeger_storage_exporter'] } },
        telemetry: { metrics: { level: 'none' }, logs: { level: 'warn' } },
      },
      extensions: {
        jaeger_query: {
          storage: { traces: 'memory' },
          http: { endpoint: at(query) },
          grpc: { endpoint: at(grpc) },
        },
        jaeger_storage: { backends: { memory: { memory: { max_traces: 100_000 } } } },
        healthcheckv2: { use_v2: true, http: { endpoint: at(health) } },
      },
      receivers: { otlp: { protocols: { http: { endpoint: at(otlp) } } } },
      processors: { batch: {} },
      exporters: { jaeger_storage_exporter: { trace_storage: 'memory' } },
    }),
  );
  const url = `http://127.0.0.1:${query}`;
  const stop = await startReceiver({
    name: 'jaeger',
    bin,
    dir: o.dir,
    args: ['--config', config],
    place,
    ready: `http://127.0.0.1:${health}/status`,
  });
  return {
    otlpTracesEndpoint: `http://${place.senders}:${otlp}/v1/traces`,
    url,
    trace: async (traceId) => {
      const r = await fetch(`${url}/api/v3/traces/${traceId}`);
      if (r.status === 404) return [];
      if (!r.ok) throw new Error(`Jaeger ${r.status}: ${(await r.text()).slice(0, 200)}`);
      return spansOf((await r.json()) as QueryAnswer);
    },
    stop,
  };
}

interface OtlpValue {
  stringValue?: string;
  intValue?: string | number;
  boolValue?: boolean;
  doubleValue?: number;
}
interface QueryAnswer {
  result?: {
    resourceSpans?: {
      resource?: { attributes?: { key: string; value: OtlpValue }[] };
      scopeSpans?: {
        spans?: {
          traceId: string;
          spanId: string;
          parentSpanId?: string;
          name: string;
          kind?: number;
          attributes?: { key: string; value: OtlpValue }[];
          status?: { code?: number };
        }[];
      }[];
    }[];
  };
}

const valueOf = (v: OtlpValue): string | number | boolean =>
  v.stringValue ?? v.boolValue ?? v.doubleValue ?? (v.intValue !== undefined ? Number(v.intValue) : '');

const attributesOf = (list: { key: string; value: OtlpValue }[] = []) =>
  Object.fromEntries(list.map((a) => [a.key, valueOf(a.value)]));

/** The spans of a query answer, flattened, each with its resource's `service.name`. */
function spansOf(answer: QueryAnswer): StoredSpan[] {
  return (answer.result?.resourceSpans ?? []).flatMap((rs) => {
    const service = String(attributesOf(rs.resource?.attributes)['service.name'] ?? '');
    return (rs.scopeSpans ?? []).flatMap((ss) =>
      (ss.spans ?? []).map((s) => ({
        service,
        traceId: s.traceId,
        spanId: s.spanId,
        parentSpanId: s.parentSpanId ?? '',
        name: s.name,
        kind: s.kind ?? 0,
        attributes: attributesOf(s.attributes),
        status: s.status?.code ?? 0,
      })),
    );
  });
}
