/**
 * Structured JSON logs (winston), one object per line, for every function. A redaction
 * format drops Secret-shaped fields (`data`, `stringData`, `binaryData`) wherever they
 * appear, as a second line of defence: callers never pass Secret data in the first place
 * (SPEC §15). Under a span (traces on) each line carries its `trace_id` and `span_id`.
 */
import winston from 'winston';
import { telemetry } from './telemetry.ts';

/** Field names whose values are never written to a log line. */
export const REDACTED_KEYS: ReadonlySet<string> = new Set(['data', 'stringData', 'binaryData']);

function redactValue(value: unknown, depth: number): unknown {
  if (depth > 6 || typeof value !== 'object' || value === null) return value;
  if (Array.isArray(value)) return value.map((v) => redactValue(v, depth + 1));
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) out[k] = REDACTED_KEYS.has(k) ? '[redacted]' : redactValue(v, depth + 1);
  return out;
}

const redact = winston.format((info) => {
  for (const key of Object.keys(info)) {
    if (REDACTED_KEYS.has(key)) info[key] = '[redacted]';
    else info[key] = redactValue(info[key], 0);
  }
  return info;
});

/** The current span's `trace_id` and `span_id` on every line written under one (./telemetry.ts). */
const traceIds = winston.format((info) => {
  const ids = telemetry().logIds();
  if (ids) Object.assign(info, ids);
  return info;
});

/** The logger type every function receives (a winston Logger). */
export type Logger = winston.Logger;

/**
 * Creates the JSON logger of one function.
 * @param component function name, written as `component` on every line.
 * @param opts.level winston level (default `$LOG_LEVEL` or `info`); opts.stream overrides
 *   stdout (tests capture lines this way).
 * @returns a winston Logger writing `{"level","message","component","timestamp",…}` lines.
 */
export function createLogger(component: string, opts: { level?: string; stream?: NodeJS.WritableStream } = {}): Logger {
  return winston.createLogger({
    level: opts.level ?? process.env.LOG_LEVEL ?? 'info',
    defaultMeta: { component },
    format: winston.format.combine(redact(), traceIds(), winston.format.timestamp(), winston.format.json()),
    transports: [
      opts.stream ? new winston.transports.Stream({ stream: opts.stream }) : new winston.transports.Console(),
    ],
  });
}
