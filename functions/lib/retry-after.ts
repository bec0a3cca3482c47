/**
 * `Retry-After`: how long a throttled API server asked us to wait, and how long mirror-sync asks
 * its own sender (Knative's dispatcher, the provider's manager) to wait before a retry.
 *
 * The value comes from an answer of the API server or of anything on the way to it, so it is
 * untrusted (SPEC §15): only a number of seconds or a date is read from it, nothing of it is
 * ever repeated, and the wait asked of our senders is bounded by {@link MAX_RETRY_AFTER_SECONDS}.
 * Pure functions only; api-errors.ts reads the header of an API error with them.
 */

/**
 * The longest wait, in seconds, mirror-sync asks of a sender with `Retry-After`, whatever the
 * API server asked for. Knative's dispatcher honours a `Retry-After` only up to the Trigger's
 * `delivery.retryAfterMax` (knative.dev/eventing pkg/kncloudevents/retries.go), which the
 * manifests' `components/retry-after` sets to the same 30 s; a longer wait would hold the
 * sender (the ApiServerSource adapter waits for the fan-out) without helping the API server more.
 */
export const MAX_RETRY_AFTER_SECONDS = 30;

/** `delay-seconds` (RFC 9110 §10.2.3): digits only; more than 10 are not a plausible wait. */
const DELAY_SECONDS = /^[0-9]{1,10}$/;

/** `IMF-fixdate` (RFC 9110 §5.6.7), the HTTP-date form every sender must generate. */
const IMF_FIXDATE =
  /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), ([0-9]{2}) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([0-9]{4}) ([0-9]{2}):([0-9]{2}):([0-9]{2}) GMT$/;

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];

/**
 * The wait a `Retry-After` header value asks for, in seconds (RFC 9110 §10.2.3): either
 * `delay-seconds` (e.g. `7`) or an `IMF-fixdate` (e.g. `Wed, 21 Oct 2015 07:28:00 GMT`) taken
 * relative to `now`, a date already past meaning 0. Surrounding whitespace is ignored.
 * Anything else (a negative or fractional number, the obsolete RFC 850 and asctime date
 * forms, an impossible date, several values joined by a comma, a non-string) is no wait at all.
 * @param now milliseconds since the epoch (default: the current time).
 * @returns seconds ≥ 0, possibly fractional for a date; undefined when the value asks nothing.
 */
export function parseRetryAfter(value: unknown, now: number = Date.now()): number | undefined {
  if (typeof value !== 'string' || value.length > 64) return undefined;
  const text = value.trim();
  if (DELAY_SECONDS.test(text)) return Number(text);
  const date = imfFixdate(text);
  return date === undefined ? undefined : Math.max(0, (date - now) / 1000);
}

/** The instant (ms since the epoch) of an `IMF-fixdate`, or undefined when it is not one or names no real day. */
function imfFixdate(text: string): number | undefined {
  const m = IMF_FIXDATE.exec(text);
  if (!m) return undefined;
  const [day, month, year, hour, minute, second] = [m[1], MONTHS.indexOf(m[2]!), m[3], m[4], m[5], m[6]].map(Number);
  const t = Date.UTC(year!, month!, day!, hour!, minute!, second!);
  const d = new Date(t);
  // Date.UTC rolls 31 Feb over into March and 25:00 into the next day: such a date is refused.
  const exact = d.getUTCDate() === day && d.getUTCMonth() === month && d.getUTCHours() === hour;
  return exact && minute! < 60 && second! < 61 ? t : undefined;
}

/**
 * The wait to ask for after several pieces of work: the largest of theirs, capped at
 * {@link MAX_RETRY_AFTER_SECONDS} (the work is retried as a whole, so it must wait for the
 * slowest). Undefined entries (work that was not throttled) are skipped.
 * @returns seconds, or undefined when no piece asked for a wait.
 */
export function largestRetryAfter(waits: Iterable<number | undefined>): number | undefined {
  let largest: number | undefined;
  for (const w of waits) if (w !== undefined && Number.isFinite(w) && w >= 0) largest = Math.max(largest ?? 0, w);
  return largest === undefined ? undefined : Math.min(largest, MAX_RETRY_AFTER_SECONDS);
}

/**
 * The `Retry-After` value mirror-sync answers for a wait of `seconds`: whole seconds, rounded
 * up (never sooner than asked), at least 1 and at most {@link MAX_RETRY_AFTER_SECONDS}.
 */
export function retryAfterHeader(seconds: number): string {
  const s = Number.isFinite(seconds) ? Math.ceil(seconds) : MAX_RETRY_AFTER_SECONDS;
  return String(Math.min(MAX_RETRY_AFTER_SECONDS, Math.max(1, s)));
}
