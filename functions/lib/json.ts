/** JSON read from text nobody vouches for: a dead letter's payloads, a log line. */

/**
 * `text` parsed when it is a JSON object.
 * @returns the object, or undefined for anything else (plain text, invalid JSON, an array, a scalar).
 */
export function jsonObject(text: string): Record<string, unknown> | undefined {
  try {
    const v: unknown = JSON.parse(text);
    return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}
