/**
 * SPEC §4: work is coalesced per name within an instance, as client-go's `util/workqueue` does:
 * an item is never processed twice at once; while it is being processed, further requests for it
 * are folded into one follow-up that starts after the running one ends ("dirty"), and all of them
 * are answered with its result — never with a result of work that started before they arrived.
 * Concurrent requests for one name thus cost about two runs, not one each. One queue serves every
 * kind of name (a mirror key, an identity's or a namespace's pass, the resync), with one worker
 * function (scheduler.ts).
 */
import { telemetry } from '../lib/telemetry.ts';
import type { ConsumerName, Snapshot } from './decide.ts';

/** What a request asks to look at: the consumers it named, or `all`. */
export type Scope = Snapshot['scope'];

/** One run of an item: what to process, the union of the scopes of the requests it answers, and a seed. */
export interface Run<T, S> {
  target: T;
  scope: Scope;
  /** The first request's seed (reads it made after it arrived); only a run that starts at once gets one. */
  seed?: S | undefined;
}

interface Pending<T, S, R> {
  run: Run<T, S>;
  names: Map<string, ConsumerName>;
  promise: Promise<R>;
  start: () => void;
}

interface Slot<T, S, R> {
  running: Promise<R>;
  next?: Pending<T, S, R>;
}

const nameId = (n: ConsumerName): string => `${n.apiVersion}/${n.kind}/${n.name}`;

/** One queue of names: per name, one run at a time and one follow-up. One instance per process. */
export class WorkQueue<T, S, R> {
  private readonly slots = new Map<string, Slot<T, S, R>>();
  private readonly process: (run: Run<T, S>) => Promise<R>;

  /** @param process the one worker function: processes one run of an item (its rejection reaches every caller of that run). */
  constructor(process: (run: Run<T, S>) => Promise<R>) {
    this.process = process;
  }

  /**
   * Processes `target` (known as `name`) for a request that arrived now.
   * @param scope the consumers the request is about (by name), or `all`.
   * @param seed used only when the name is idle (a follow-up reads everything again).
   * @returns the result of a run that started after this call.
   */
  add(name: string, target: T, scope: Scope = 'all', seed?: S): Promise<R> {
    const slot = this.slots.get(name);
    if (!slot) return this.start(name, this.process({ target, scope, seed }));
    // Joining a follow-up that already waits: one run will answer both (lib/telemetry.ts).
    if (slot.next) telemetry().coalesced();
    slot.next ??= this.followUp(target);
    const next = slot.next;
    // The follow-up looks at what its requests named, not the whole key: another instance may be
    // writing the other consumers' conditions, and writing them here too would race it.
    if (scope === 'all' || next.run.scope === 'all') next.run.scope = 'all';
    else for (const n of scope) next.names.set(nameId(n), n);
    if (next.run.scope !== 'all') next.run.scope = [...next.names.values()];
    return next.promise;
  }

  /** A follow-up run, held until the running one ends. */
  private followUp(target: T): Pending<T, S, R> {
    let start!: () => void;
    const gate = new Promise<void>((r) => (start = r));
    const pending: Pending<T, S, R> = {
      run: { target, scope: [] },
      names: new Map(),
      promise: undefined as unknown as Promise<R>,
      start,
    };
    pending.promise = gate.then(() => this.process(pending.run));
    return pending;
  }

  private start(name: string, running: Promise<R>): Promise<R> {
    const slot: Slot<T, S, R> = { running };
    this.slots.set(name, slot);
    this.chain(name, slot);
    return running;
  }

  /** When the running run ends, its follow-up (if any) starts and becomes the running one. */
  private chain(name: string, slot: Slot<T, S, R>): void {
    const after = () => {
      const next = slot.next;
      if (!next) {
        this.slots.delete(name);
        return;
      }
      delete slot.next;
      slot.running = next.promise;
      next.start();
      this.chain(name, slot);
    };
    // Its callers see a rejection; here it only means "ended" (never an unhandled rejection).
    slot.running.then(after, after);
  }

  /** Names being processed now (for tests and logs). */
  get size(): number {
    return this.slots.size;
  }
}
