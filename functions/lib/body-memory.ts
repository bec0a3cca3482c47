/**
 * What a request body may cost in heap, so that no sender can make a function run out of
 * memory (SPEC §15: bad input gets a 4xx and the process keeps serving).
 *
 * Two bounds, because the heap caps the manifests set (`--max-old-space-size` 48–80 MB) are
 * small beside what a body of the size limit can become once parsed:
 * - **JSON containers per body.** `JSON.parse` of 3 MiB of `[[],[],…]` holds a million arrays,
 *   about 32 MiB of heap; numbers, strings and `null` cost at most about 4× their text. So a
 *   body may hold at most {@link MAX_JSON_CONTAINERS} objects and arrays; a Kubernetes object
 *   holds hundreds (its managedFields included), a batch of 100 events a few tens of thousands.
 * - **Bodies in flight per process.** Each body being read and handled reserves its size from
 *   a {@link BodyBudget} of a tenth of the heap limit; one that does not fit waits for no one:
 *   it is answered 503 with `Retry-After` (Knative's delivery and the API server retry), unless
 *   nothing else is reserved, so a single body of any accepted size always gets through.
 */
import { getHeapStatistics } from 'node:v8';

/** Most JSON objects and arrays one request body may hold. */
export const MAX_JSON_CONTAINERS = 100_000;

/**
 * Counts the objects and arrays in JSON text (`{` and `[` outside strings), stopping once it
 * passes `max`. Text that is not JSON is counted the same way (its parser refuses it later).
 * @returns the count, at most `max + 1`.
 */
export function countJsonContainers(text: string, max: number = MAX_JSON_CONTAINERS): number {
  let n = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c /* \ */) i++;
      else if (c === 0x22 /* " */) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
      if (++n > max) return n;
    }
  }
  return n;
}

/**
 * The bytes of request bodies a process holds at once. `take` reserves a body's size and says
 * whether it fits; `give` returns it when the answer is over.
 */
export class BodyBudget {
  readonly bytes: number;
  private held = 0;

  /** @param bytes what may be reserved at once (bytes). */
  constructor(bytes: number) {
    this.bytes = bytes;
  }

  /** Bytes reserved now. */
  get reserved(): number {
    return this.held;
  }

  /**
   * Reserves `n` bytes when they fit, or when nothing is reserved (one body always proceeds).
   * @returns whether it was reserved (then {@link give} `n` exactly once).
   */
  take(n: number): boolean {
    if (this.held > 0 && this.held + n > this.bytes) return false;
    this.held += n;
    return true;
  }

  /** Returns `n` bytes taken before. */
  give(n: number): void {
    this.held = Math.max(0, this.held - n);
  }
}

/**
 * This process's budget: a tenth of V8's heap limit (which `--max-old-space-size` sets). A body
 * of numbers parses into about 4× its size, so at the shipped caps what the budget admits
 * parses into less than half the heap the function has beside its own 16 MiB.
 */
export const processBodyBudget = new BodyBudget(Math.floor(getHeapStatistics().heap_size_limit / 10));
