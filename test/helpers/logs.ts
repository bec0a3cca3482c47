/**
 * Captures a function's JSON log lines in memory so tests can assert on them and scan them
 * for planted Secret values.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { PassThrough } from 'node:stream';
import { EVENT_ANSWER_ID_HEADER, EVENT_ANSWER_LOG } from '../../functions/lib/http.ts';
import { createLogger, type Logger } from '../../functions/lib/log.ts';
import { onLines } from '../../scripts/lib/process.ts';
import { scanLater } from './leaks.ts';

/** A logger whose lines a test reads: `lines` (raw JSON text) and `entries` (parsed). */
export interface CapturedLog {
  logger: Logger;
  lines: string[];
  entries: () => Record<string, unknown>[];
}

/** A logger whose lines are kept in `lines` (raw JSON text) and `entries` (parsed). */
export function captureLogger(component: string): CapturedLog {
  const stream = new PassThrough();
  const lines: string[] = [];
  onLines(stream, (l) => l && lines.push(l));
  const logger = createLogger(component, { stream, level: 'debug' });
  scanLater(`${component} log`, () => lines.join('\n'));
  return { logger, lines, entries: () => lines.map((l) => JSON.parse(l) as Record<string, unknown>) };
}

/** A unique sentinel value to plant in a Secret, e.g. `SENTINEL-3f9a…`. */
export const sentinel = (): string => `SENTINEL-${randomBytes(8).toString('hex')}`;

/**
 * Asserts that none of `values` (and none of their base64 forms) appears in `text`.
 * @param where names the output scanned, for the failure message.
 */
export function assertNoSecret(text: string, values: readonly string[], where: string): void {
  for (const v of values) {
    const forms = [v, Buffer.from(v).toString('base64')];
    for (const f of forms) assert.ok(!text.includes(f), `${where} contains a planted Secret value`);
  }
}

/**
 * The detail a function (its captured log, or a process's: process.ts) logged for one of its event answers (lib/http.ts `sendEventOutcome`:
 * the answer names nothing, its `x-request-id` names the log line), waiting briefly for the
 * line to be read from the log stream.
 * @throws AssertionError when the answer has no id or no line names it within 2 s.
 */
export async function loggedAnswer(log: Pick<CapturedLog, 'entries'>, headers: Headers): Promise<unknown> {
  const id = headers.get(EVENT_ANSWER_ID_HEADER);
  assert.ok(id, `the answer has no ${EVENT_ANSWER_ID_HEADER}`);
  for (let waited = 0; waited < 2_000; waited += 10) {
    const line = log.entries().find((e) => e.message === EVENT_ANSWER_LOG && e.requestId === id);
    if (line) return line.detail;
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.fail(`no "${EVENT_ANSWER_LOG}" line for request ${id}`);
}
