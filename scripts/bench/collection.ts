/**
 * A watched collection: the bench sees completion on a watch, never by polling. One LIST
 * (paginated) gives the starting state and resourceVersion, then a WATCH keeps a map of the
 * objects; `until(predicate)` resolves at the first event after which the predicate holds,
 * with the time that event arrived.
 */
import type { BenchClient, KubeObject, WatchEvent } from './client.ts';

/** Key of an object in a collection: `<namespace>/<name>`. */
export const keyOf = (o: KubeObject): string => `${o.metadata.namespace ?? ''}/${o.metadata.name}`;

interface Waiter<T> {
  pred: (objects: ReadonlyMap<string, T>, event?: WatchEvent<T>) => boolean;
  resolve: (atMs: number) => void;
  reject: (err: Error) => void;
  timer: NodeJS.Timeout;
}

/** The live state of one collection, kept by a watch. */
export class WatchedCollection<T extends KubeObject> {
  readonly objects = new Map<string, T>();
  private readonly client: BenchClient;
  private readonly path: string;
  private readonly query: string;
  private readonly waiters = new Set<Waiter<T>>();
  private stopWatch: (() => void) | undefined;
  private resourceVersion = '';
  private stopped = false;
  private readonly listeners: ((e: WatchEvent<T>) => void)[] = [];

  /**
   * @param path collection path, e.g. `/api/v1/secrets` or `/apis/<g>/<v>/namespaces/ns/<plural>`.
   * @param query extra query, e.g. `labelSelector=…`.
   */
  constructor(client: BenchClient, path: string, query = '') {
    this.client = client;
    this.path = path;
    this.query = query;
  }

  /** Lists, then watches; resolves when the watch is open. */
  async start(): Promise<this> {
    const list = await this.client.list<T>(this.path, 500, this.query);
    for (const o of list.items) this.objects.set(keyOf(o), o);
    this.resourceVersion = list.resourceVersion;
    this.open();
    return this;
  }

  private open(): void {
    this.stopWatch = this.client.watch<T>({
      path: this.path,
      resourceVersion: this.resourceVersion,
      query: this.query,
      onEvent: (e) => this.apply(e),
      onEnd: (err) => {
        if (this.stopped) return;
        // Watches end (timeout) or expire (410); re-list when the resourceVersion is too old.
        if (err?.message.includes('410')) void this.relist();
        else setTimeout(() => !this.stopped && this.open(), 100).unref();
      },
    });
  }

  private async relist(): Promise<void> {
    const list = await this.client.list<T>(this.path, 500, this.query);
    this.objects.clear();
    for (const o of list.items) this.objects.set(keyOf(o), o);
    this.resourceVersion = list.resourceVersion;
    this.check();
    this.open();
  }

  private apply(e: WatchEvent<T>): void {
    if (e.type === 'ERROR') {
      // A 410 inside the stream: start over from a fresh list.
      if ((e.object as unknown as { code?: number }).code === 410) {
        this.stopWatch?.();
        void this.relist();
      }
      return;
    }
    const rv = e.object.metadata?.resourceVersion;
    if (rv) this.resourceVersion = rv;
    if (e.type === 'BOOKMARK') return;
    if (e.type === 'DELETED') this.objects.delete(keyOf(e.object));
    else this.objects.set(keyOf(e.object), e.object);
    for (const l of this.listeners) l(e);
    this.check(e);
  }

  private check(e?: WatchEvent<T>): void {
    const now = performance.now();
    for (const w of [...this.waiters]) {
      if (!w.pred(this.objects, e)) continue;
      this.waiters.delete(w);
      clearTimeout(w.timer);
      w.resolve(now);
    }
  }

  /** Calls `fn` on every ADDED/MODIFIED/DELETED event from now on. */
  onEvent(fn: (e: WatchEvent<T>) => void): void {
    this.listeners.push(fn);
  }

  /**
   * Resolves with `performance.now()` of the first moment `pred` holds: at once when it holds
   * already, else at the watch event after which it does.
   * @throws Error naming `what` after `timeoutMs`.
   */
  until(
    what: string,
    pred: (objects: ReadonlyMap<string, T>, event?: WatchEvent<T>) => boolean,
    timeoutMs: number,
  ): Promise<number> {
    if (pred(this.objects)) return Promise.resolve(performance.now());
    return new Promise((resolve, reject) => {
      const w: Waiter<T> = {
        pred,
        resolve,
        reject,
        timer: setTimeout(() => {
          this.waiters.delete(w);
          reject(new Error(`timed out after ${Math.round(timeoutMs / 1000)} s waiting for ${what}`));
        }, timeoutMs),
      };
      this.waiters.add(w);
    });
  }

  /** Stops the watch; pending waiters are rejected. */
  stop(): void {
    this.stopped = true;
    this.stopWatch?.();
    for (const w of this.waiters) {
      clearTimeout(w.timer);
      w.reject(new Error('collection stopped'));
    }
    this.waiters.clear();
  }
}
