/**
 * The one wait-until of the scripts and the tests: poll a condition until it holds or time
 * runs out (the demo's steps, CRD installation, test helpers and assertions all use it).
 */

/** First line of an error's message (or of `String(err)` for anything else). */
export function firstLine(err: unknown): string {
  return (err instanceof Error ? err.message : String(err)).split('\n')[0]!;
}

/**
 * Awaits two steps that run side by side until both have settled, so that whatever either
 * started is already in its caller's cleanups before the first failure is thrown.
 * @throws the first step's error, else the second's.
 */
export async function bothSettled<A, B>(a: Promise<A>, b: Promise<B>): Promise<[A, B]> {
  const [ra, rb] = await Promise.allSettled([a, b]);
  if (ra.status === 'rejected') throw ra.reason;
  if (rb.status === 'rejected') throw rb.reason;
  return [ra.value, rb.value];
}

/** Resolves after `ms` milliseconds. */
export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * Calls `fn` until it returns a truthy value (tried at least once, then every `intervalMs`),
 * and resolves with that value. A throw counts as "not yet"; the last one is named when time
 * runs out. `timeoutMs` is a generous bound, not a timing assertion.
 * @throws Error `timed out after <s>s waiting for <what> (last error: …)` when time runs out.
 */
export async function eventually<T>(
  what: string,
  fn: () => Promise<T | undefined | null | false>,
  timeoutMs = 60_000,
  intervalMs = 200,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastError = '';
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (err) {
      lastError = firstLine(err);
    }
    if (Date.now() > deadline)
      throw new Error(
        `timed out after ${Math.round(timeoutMs / 100) / 10}s waiting for ${what}${lastError ? ` (last error: ${lastError})` : ''}`,
      );
    await sleep(intervalMs);
  }
}
