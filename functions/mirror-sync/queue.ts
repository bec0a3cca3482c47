/**
 * SPEC §4: work for one key is coalesced within an instance, as a controller's work queue
 * does. While a key is being reconciled, further requests for it wait for one more
 * reconcile that starts after the running one ends, and all of them are answered with its
 * result — never with a result of work that started before they arrived. Concurrent
 * requests for one mirror thus cost about two reconciles, not one each.
 */
import type { ConsumerName, MirrorKey, Snapshot } from './decide.ts';
import { keyString } from './decide.ts';
import type { Seed } from './observe.ts';
import { reconcileKey, type KeyResult, type ReconcileDeps } from './reconcile.ts';

interface Pending {
  /** Consumers the waiting requests named, or `all`. */
  scope: 'all' | Map<string, ConsumerName>;
  promise: Promise<KeyResult>;
  start: () => void;
}

interface Slot {
  running: Promise<KeyResult>;
  next?: Pending;
}

const nameId = (n: ConsumerName): string => `${n.apiVersion}/${n.kind}/${n.name}`;

/** Per-key single flight with one follow-up; one instance per process. */
export class KeyQueue {
  private readonly slots = new Map<string, Slot>();
  private readonly deps: ReconcileDeps;
  private readonly reconcile: typeof reconcileKey;

  /**
   * @param deps what each reconcile needs (API access, consumer kinds, logger).
   * @param reconcile the reconcile of one key: reconcile.ts {@link reconcileKey} (a unit test's stand-in otherwise).
   */
  constructor(deps: ReconcileDeps, reconcile: typeof reconcileKey = reconcileKey) {
    this.deps = deps;
    this.reconcile = reconcile;
  }

  /**
   * Reconciles `key` for a request that arrived now.
   * @param scope the consumers the request is about (by name), or `all`.
   * @param seed reads made after the request arrived; used only when the key is idle (a
   *   follow-up reads everything again).
   * @returns the result of a reconcile that started after this call.
   */
  run(key: MirrorKey, scope: Snapshot['scope'], seed?: Seed): Promise<KeyResult> {
    const id = keyString(key);
    const slot = this.slots.get(id);
    if (!slot) return this.start(id, this.reconcile(this.deps, key, scope, seed));
    if (!slot.next) {
      let start!: () => void;
      const gate = new Promise<void>((r) => (start = r));
      const pending: Pending = { scope: new Map(), promise: undefined as unknown as Promise<KeyResult>, start };
      // The follow-up looks at the consumers its requests named, not the whole key: another
      // instance may be writing the others' conditions, and writing them here too would race it.
      pending.promise = gate.then(() =>
        this.reconcile(this.deps, key, pending.scope === 'all' ? 'all' : [...pending.scope.values()]),
      );
      slot.next = pending;
    }
    const next = slot.next;
    if (scope === 'all') next.scope = 'all';
    else if (next.scope !== 'all') for (const n of scope) next.scope.set(nameId(n), n);
    return next.promise;
  }

  private start(id: string, running: Promise<KeyResult>): Promise<KeyResult> {
    const slot: Slot = { running };
    this.slots.set(id, slot);
    this.chain(id, slot);
    return running;
  }

  /** When the running reconcile ends, its follow-up (if any) starts and becomes the running one. */
  private chain(id: string, slot: Slot): void {
    const after = () => {
      const next = slot.next;
      if (!next) {
        this.slots.delete(id);
        return;
      }
      delete slot.next;
      slot.running = next.promise;
      next.start();
      this.chain(id, slot);
    };
    // Its callers see a rejection; here it only means "ended" (never an unhandled rejection).
    slot.running.then(after, after);
  }

  /** Keys being reconciled now (for tests and logs). */
  get size(): number {
    return this.slots.size;
  }
}

/**
 * Per-name single flight with one follow-up, for the passes of identities and namespaces
 * (pass.ts): the queue pattern at the scale of a pass. While a pass for a name runs, requests
 * for it wait for one more pass that starts after the running one ends, and all of them get
 * its result; so an identity's update and the echo of identity-status's write to it cost two
 * passes, one after the other — never two at once racing for the same mirrors.
 */
export class PassQueue<T> {
  private readonly running = new Map<string, { done: Promise<T>; next?: Promise<T> }>();

  /**
   * Runs `work` for `name` now, or after the pass running for it (shared with every request that arrives meanwhile).
   * @returns the result of a pass that started after this call.
   */
  run(name: string, work: () => Promise<T>): Promise<T> {
    const slot = this.running.get(name);
    if (!slot) return this.start(name, work());
    slot.next ??= slot.done.then(work, work);
    return slot.next;
  }

  private start(name: string, done: Promise<T>): Promise<T> {
    const slot: { done: Promise<T>; next?: Promise<T> } = { done };
    this.running.set(name, slot);
    const after = () => {
      if (!slot.next) {
        this.running.delete(name);
        return;
      }
      slot.done = slot.next;
      delete slot.next;
      slot.done.then(after, after);
    };
    done.then(after, after);
    return done;
  }
}
