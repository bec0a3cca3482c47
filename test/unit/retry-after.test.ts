/**
 * The wait a throttled API server asks for, and the wait mirror-sync asks of its sender
 * (functions/lib/retry-after.ts, api-errors.ts `retryAfterOf`): what a `Retry-After` value
 * may say (RFC 9110 §10.2.3) and what is ignored, which answers it is read from (429 and 5xx,
 * as client-go), the largest wait over several pieces of work, and the 30 s cap.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { redactApiError, RedactedApiError, retryAfterOf } from '../../functions/lib/api-errors.ts';
import {
  MAX_RETRY_AFTER_SECONDS,
  largestRetryAfter,
  parseRetryAfter,
  retryAfterHeader,
} from '../../functions/lib/retry-after.ts';
import { statusBody } from '../helpers/fault-proxy.ts';

/** 2015-10-21 07:28:00 UTC, the "now" of every date below. */
const NOW = Date.UTC(2015, 9, 21, 7, 28, 0);

/** An API error as client-node throws it: code, Status body, the answer's headers (lower case). */
const apiError = (code: number, headers: Record<string, string>) => ({
  code,
  body: JSON.stringify(statusBody({ status: code, reason: 'TooManyRequests', message: 'slow down' })),
  headers,
});

describe('parseRetryAfter (RFC 9110 §10.2.3)', () => {
  const cases: [unknown, number | undefined][] = [
    ['7', 7],
    ['0', 0],
    [' 12 ', 12],
    ['120', 120],
    ['9999999999', 9999999999],
    ['Wed, 21 Oct 2015 07:28:07 GMT', 7],
    ['Wed, 21 Oct 2015 07:29:00 GMT', 60],
    // A date already past asks for no wait beyond "now".
    ['Wed, 21 Oct 2015 07:00:00 GMT', 0],
    // Garbage, and forms a sender must not generate: no wait at all.
    ['', undefined],
    ['-5', undefined],
    ['1.5', undefined],
    ['+3', undefined],
    ['3, 5', undefined],
    ['7s', undefined],
    ['99999999999', undefined],
    ['soon', undefined],
    ['Wednesday, 21-Oct-15 07:28:07 GMT', undefined],
    ['Wed Oct 21 07:28:07 2015', undefined],
    ['Wed, 31 Feb 2015 07:28:07 GMT', undefined],
    ['Wed, 21 Oct 2015 25:28:07 GMT', undefined],
    ['Wed, 21 Oct 2015 07:28:07 UTC', undefined],
    ['2015-10-21T07:28:07Z', undefined],
    [`${'1'.repeat(70)}`, undefined],
    [7, undefined],
    [['7'], undefined],
    [undefined, undefined],
    [null, undefined],
  ];
  for (const [value, want] of cases)
    it(`${JSON.stringify(value)} → ${want}`, () => {
      assert.equal(parseRetryAfter(value, NOW), want);
    });

  it('never throws, and any wait it reads is a finite number ≥ 0', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 80 }), fc.integer({ min: 0, max: 4_102_444_800_000 }), (s, now) => {
        const w = parseRetryAfter(s, now);
        return w === undefined || (Number.isFinite(w) && w >= 0);
      }),
      { numRuns: 2000 },
    );
  });
});

describe('the wait mirror-sync asks for', () => {
  it(`is capped at ${MAX_RETRY_AFTER_SECONDS} s: a longer wait asks for the cap, a shorter one for itself`, () => {
    assert.equal(largestRetryAfter([MAX_RETRY_AFTER_SECONDS + 1]), MAX_RETRY_AFTER_SECONDS);
    assert.equal(largestRetryAfter([MAX_RETRY_AFTER_SECONDS - 1]), MAX_RETRY_AFTER_SECONDS - 1);
  });

  it('over several pieces of work: the largest wait, capped; none when nothing was throttled', () => {
    assert.equal(largestRetryAfter([3, undefined, 7, 1]), 7);
    assert.equal(largestRetryAfter([undefined, 0]), 0);
    assert.equal(largestRetryAfter([5, 120]), 30);
    assert.equal(largestRetryAfter([]), undefined);
    assert.equal(largestRetryAfter([undefined, undefined]), undefined);
    assert.equal(largestRetryAfter([Number.NaN, -1, Number.POSITIVE_INFINITY]), undefined);
  });

  it('as a header: whole seconds rounded up, from 1 to 30', () => {
    const cases: [number, string][] = [
      [7, '7'],
      [6.2, '7'],
      [0, '1'],
      [0.3, '1'],
      [-4, '1'],
      [30, '30'],
      [31, '30'],
      [1e9, '30'],
      [Number.NaN, '30'],
    ];
    for (const [seconds, header] of cases) assert.equal(retryAfterHeader(seconds), header, String(seconds));
    fc.assert(
      fc.property(fc.double(), (s) => {
        const h = Number(retryAfterHeader(s));
        return Number.isInteger(h) && h >= 1 && h <= MAX_RETRY_AFTER_SECONDS;
      }),
    );
  });
});

describe('retryAfterOf: the wait an API error asks for', () => {
  it('is read from a 429 and any 5xx answer, as client-go does', () => {
    assert.equal(retryAfterOf(apiError(429, { 'retry-after': '7' })), 7);
    assert.equal(retryAfterOf(apiError(503, { 'retry-after': '2' })), 2);
    assert.equal(retryAfterOf(apiError(500, { 'retry-after': '1' })), 1);
    assert.equal(retryAfterOf(apiError(504, { 'Retry-After': '45' })), 45, 'not capped here; any header case');
    assert.equal(retryAfterOf(apiError(429, { 'retry-after': 'Wed, 21 Oct 2015 07:28:09 GMT' }), NOW), 9);
  });

  it('is none for other answers, a missing or unreadable header, and errors without an answer', () => {
    assert.equal(retryAfterOf(apiError(429, {})), undefined);
    assert.equal(retryAfterOf(apiError(429, { 'retry-after': 'later, token=SENTINEL' })), undefined);
    assert.equal(retryAfterOf(apiError(409, { 'retry-after': '7' })), undefined);
    assert.equal(retryAfterOf(apiError(403, { 'retry-after': '7' })), undefined);
    assert.equal(retryAfterOf({ code: 429 }), undefined);
    assert.equal(
      retryAfterOf(Object.assign(new TypeError('fetch failed'), { headers: { 'retry-after': '7' } })),
      undefined,
    );
    assert.equal(retryAfterOf(undefined), undefined);
    assert.equal(retryAfterOf('429'), undefined);
  });

  it('survives redaction: a RedactedApiError keeps the number and nothing else of the header', () => {
    const redacted = redactApiError(apiError(429, { 'retry-after': '7' }));
    assert.ok(redacted instanceof RedactedApiError);
    assert.equal(redacted.retryAfterSeconds, 7);
    assert.equal(retryAfterOf(redacted), 7);
    assert.doesNotMatch(redacted.message, /slow down|retry/i);
    assert.equal(retryAfterOf(redactApiError(apiError(429, {}))), undefined);
  });
});
