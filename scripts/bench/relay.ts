/**
 * No bench row uses this any more: the bench's events go through Knative's real Broker data
 * plane or straight from the adapter to the function (scripts/bench/paths.ts, front.ts). It is
 * kept only because test/integration/mirror-sync-adapter.test.ts ("retry only what a retry can
 * fix") still stands it between the adapter and mirror-sync; delete it once that test sends
 * through scripts/eventing.ts instead.
 *
 * An event relay: the sink of the real ApiServerSource adapter, standing where the
 * Broker and Trigger stand in a cluster. It answers the adapter at once (as a Broker whose
 * channel has `messaging.knative.dev/async-handler: "true"` does) and delivers each event to
 * the function with the delivery the manifests' Triggers set: 5xx, 429 and connection errors
 * are retried up to 5 times with exponential back-off from 1 s; other answers end the event.
 * A row chooses how many deliveries are in flight (1 = serial, as the default Broker's
 * fan-out delivers one sender's events) and over which instances they are spread
 * (round-robin), or drops events while it sets up state.
 */
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
// undici's own fetch: Node's built-in fetch bundles another undici and rejects this Agent.
import { Agent, fetch } from 'undici';

// Deliveries wait as long as the function takes (fetch's default header timeout is 300 s).
const patient = new Agent({ headersTimeout: 0, bodyTimeout: 0 });

/** How the relay treats incoming events. */
export type RelayMode = { kind: 'drop' } | { kind: 'deliver'; targets: string[]; concurrency: number };

/** What the relay did since the last {@link Relay.resetCounts}. */
export interface RelayCounts {
  received: number;
  delivered: number;
  /** Deliveries answered with a status to retry (each retry counts). */
  retried: number;
  /** Events given up on (4xx, or retries exhausted). */
  failed: number;
  dropped: number;
}

interface Queued {
  headers: Record<string, string>;
  body: Buffer;
  attempt: number;
}

const RETRIES = 5;
const BACKOFF_MS = 1000;

/** The relay server. */
export class Relay {
  private mode: RelayMode = { kind: 'drop' };
  private readonly queue: Queued[] = [];
  private active = 0;
  private waitingRetry = 0;
  private rr = 0;
  private lastActivity = performance.now();
  counts: RelayCounts = { received: 0, delivered: 0, retried: 0, failed: 0, dropped: 0 };
  private server: Server | undefined;
  /** `http://127.0.0.1:<port>/` once started. */
  url = '';

  /** Listens on a free loopback port. */
  async start(): Promise<this> {
    this.server = createServer((req, res) => {
      void readBody(req).then((body) => {
        res.writeHead(202).end();
        this.accept(req, body);
      });
    });
    this.server.keepAliveTimeout = 60_000;
    await new Promise<void>((r) => this.server!.listen(0, '127.0.0.1', () => r()));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/`;
    return this;
  }

  /** Switches mode; events already queued are delivered under the new mode. */
  setMode(mode: RelayMode): void {
    this.mode = mode;
    this.pump();
  }

  /** Zeroes the counters (at the start of a row). */
  resetCounts(): void {
    this.counts = { received: 0, delivered: 0, retried: 0, failed: 0, dropped: 0 };
  }

  /**
   * Resolves once nothing is queued, in flight or waiting to be retried, and no event has
   * arrived for `quietMs` (the adapter sends the events our own writes cause a little later).
   */
  async quiet(quietMs = 1000, timeoutMs = 600_000): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const busy = this.queue.length + this.active + this.waitingRetry > 0;
      if (!busy && performance.now() - this.lastActivity >= quietMs) return;
      if (performance.now() > deadline)
        throw new Error(
          `relay not quiet after ${timeoutMs} ms (${this.queue.length} queued, ${this.active} in flight)`,
        );
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  private accept(req: IncomingMessage, body: Buffer): void {
    this.counts.received++;
    this.lastActivity = performance.now();
    if (this.mode.kind === 'drop') {
      this.counts.dropped++;
      return;
    }
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(req.headers)) {
      if (typeof v === 'string' && (k.startsWith('ce-') || k === 'content-type' || k === 'kn-namespace'))
        headers[k] = v;
    }
    this.queue.push({ headers, body, attempt: 0 });
    this.pump();
  }

  private pump(): void {
    const mode = this.mode;
    if (mode.kind === 'drop') {
      this.counts.dropped += this.queue.length;
      this.queue.length = 0;
      return;
    }
    while (this.active < mode.concurrency && this.queue.length > 0) {
      const q = this.queue.shift()!;
      const target = mode.targets[this.rr++ % mode.targets.length]!;
      this.active++;
      void this.deliver(target, q).finally(() => {
        this.active--;
        this.lastActivity = performance.now();
        this.pump();
      });
    }
  }

  private async deliver(target: string, q: Queued): Promise<void> {
    let status: number;
    try {
      const res = await fetch(target, {
        method: 'POST',
        headers: q.headers,
        body: q.body,
        signal: AbortSignal.timeout(600_000),
        dispatcher: patient,
      });
      status = res.status;
      await res.arrayBuffer();
    } catch {
      status = 0;
    }
    if (status >= 200 && status < 300) {
      this.counts.delivered++;
      return;
    }
    const retryable = status === 0 || status === 429 || status >= 500;
    if (!retryable || q.attempt >= RETRIES) {
      this.counts.failed++;
      return;
    }
    this.counts.retried++;
    this.waitingRetry++;
    setTimeout(
      () => {
        this.waitingRetry--;
        this.queue.push({ ...q, attempt: q.attempt + 1 });
        this.pump();
      },
      BACKOFF_MS * 2 ** q.attempt,
    ).unref();
  }

  /** Stops listening; queued events are dropped. */
  async stop(): Promise<void> {
    this.mode = { kind: 'drop' };
    this.queue.length = 0;
    await new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
    this.server?.closeAllConnections();
  }
}

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((res, rej) => {
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => res(Buffer.concat(chunks)));
    req.on('error', rej);
  });
}
