/**
 * The bench's front of a function: it stands where the function's Kubernetes Service (and
 * Knative Serving's routing) stands in a cluster, and passes each request and answer through
 * with no delivery rules of its own (no queue, no retry), so Knative's or the adapter's rules
 * are the ones measured. bench/README.md ("What runs", "Deliveries") says what it does in
 * Serving's place: admit `containerConcurrency` requests per instance and hold the rest (as
 * the activator does), spread them round-robin over instances with a free slot, drop events
 * while a row sets up state, and count deliveries by CloudEvent id (see {@link Front.pending}).
 * Not modelled: the autoscaler adding pods, and queue-proxy's 503 once its own queue
 * (10 × containerConcurrency) is full when the activator is not in the path.
 *
 * A request whose `ce-id` starts with {@link CHECK_ID_PREFIX} is a probe of the delivery path
 * (scripts/bench/paths.ts): it is answered 200 after `checkHoldMs`, never forwarded or counted.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Agent, request } from 'undici';

/** Event ids of delivery-path probes: held, answered 200, never forwarded or counted. */
export const CHECK_ID_PREFIX = 'captf-bench-check-';

// Deliveries wait as long as the function takes. Idle connections follow the function's
// `Keep-Alive: timeout=` hint (undici's default), so a request never goes out on a socket
// the function is closing: the front must not make errors of its own.
const patient = new Agent({ headersTimeout: 0, bodyTimeout: 0 });

/** Headers that belong to one connection, not to the request (RFC 9110 §7.6.1), and the ones undici sets. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
  'host',
  'content-length',
]);

/** How the front treats requests. */
export type FrontMode = { kind: 'drop' } | { kind: 'deliver'; targets: string[] };

/** What reached the function since the last {@link Front.resetCounts}. */
export interface FrontCounts {
  /** Requests received (drops included, probes not). */
  requests: number;
  /** Distinct CloudEvent ids among them. */
  events: number;
  /** Requests beyond the first of their id: the sender's retries. */
  retried: number;
  /** Requests answered 2xx by the function. */
  ok: number;
  /** Requests answered otherwise (or not at all: connection errors). */
  failed: number;
  dropped: number;
  /** Most requests held at once waiting for a free slot (containerConcurrency). */
  peakHeld: number;
}

/**
 * The answers Knative's dispatcher retries (pkg/kncloudevents/retries.go SelectiveRetry: 5xx,
 * 404, 408, 409, 429) and 0, a connection error.
 */
export const knativeRetries = (status: number): boolean =>
  status === 0 || status >= 500 || [404, 408, 409, 429].includes(status);

/** The front server. */
export class Front {
  /** How requests that arrive from now on are treated. */
  mode: FrontMode = { kind: 'drop' };
  private rr = 0;
  /** Requests being forwarded now. */
  inFlight = 0;
  /** Requests being forwarded, per instance URL. */
  private readonly busy = new Map<string, number>();
  /** Requests waiting for a free slot, oldest first. */
  private readonly held: (() => void)[] = [];
  /** Requests each instance takes at once (the Knative Service's `containerConcurrency`; 0 = no limit). */
  containerConcurrency = 0;
  /** Last answer per event id since the last reset. */
  private readonly lastStatus = new Map<string, number>();
  counts: FrontCounts = Front.zero();
  /** `performance.now()` of the last request received or answered. */
  lastActivity = performance.now();
  /** How long a probe of the delivery path is held before its answer. */
  checkHoldMs = 0;
  /**
   * The `Authorization` header a forwarded delivery that came without one gets, as the
   * Broker's filter would have signed it (the adapter sends unsigned on the direct path).
   */
  sign: (() => Promise<string>) | undefined;
  private server: Server | undefined;
  /** `http://127.0.0.1:<port>` once started. */
  url = '';

  private static zero(): FrontCounts {
    return { requests: 0, events: 0, retried: 0, ok: 0, failed: 0, dropped: 0, peakHeld: 0 };
  }

  /** Listens on a free loopback port. */
  async start(): Promise<this> {
    this.server = createServer((req, res) => void this.handle(req, res));
    this.server.keepAliveTimeout = 60_000;
    await new Promise<void>((r) => this.server!.listen(0, '127.0.0.1', () => r()));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  /** Zeroes the counters and forgets the ids seen (at the start of a measured window). */
  resetCounts(): void {
    this.counts = Front.zero();
    this.lastStatus.clear();
  }

  /**
   * Ids whose last answer the sender would retry (`retries(status)`) and that are not in
   * `settled` (e.g. the ids a dead-letter sink received): deliveries still to come.
   */
  pending(retries: (status: number) => boolean, settled: ReadonlySet<string> = new Set()): string[] {
    return [...this.lastStatus].filter(([id, s]) => retries(s) && !settled.has(id)).map(([id]) => id);
  }

  /** Every event id seen since the last reset. */
  ids(): ReadonlySet<string> {
    return new Set(this.lastStatus.keys());
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await readBody(req).catch(() => undefined);
    const id = String(req.headers['ce-id'] ?? '');
    if (body === undefined) return void res.writeHead(400).end();
    if (id.startsWith(CHECK_ID_PREFIX)) {
      setTimeout(() => res.writeHead(200).end(), this.checkHoldMs);
      return;
    }
    this.counts.requests++;
    if (this.lastStatus.has(id)) this.counts.retried++;
    else this.counts.events++;
    this.lastActivity = performance.now();
    const mode = this.mode;
    if (mode.kind === 'drop') {
      this.counts.dropped++;
      this.lastStatus.set(id, 200);
      return void res.writeHead(200).end();
    }
    this.inFlight++;
    const target = await this.slot(mode.targets);
    try {
      const status = await forward(`${target}${req.url ?? '/'}`, await this.headersFor(req), body, res);
      this.lastStatus.set(id, status);
      if (status >= 200 && status < 300) this.counts.ok++;
      else this.counts.failed++;
    } finally {
      this.busy.set(target, this.busy.get(target)! - 1);
      this.inFlight--;
      this.lastActivity = performance.now();
      this.held.shift()?.();
    }
  }

  /** What a forwarded request carries: its headers but hop-by-hop ones, signed when it came unsigned. */
  private async headersFor(req: IncomingMessage): Promise<Record<string, string>> {
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(req.headers)) if (typeof v === 'string' && !HOP_BY_HOP.has(k)) headers[k] = v;
    if (!headers.authorization && this.sign) headers.authorization = await this.sign();
    return headers;
  }

  /** Waits for an instance with a free slot (round-robin among them) and takes the slot. */
  private async slot(targets: readonly string[]): Promise<string> {
    for (;;) {
      const limit = this.containerConcurrency || Infinity;
      for (let i = 0; i < targets.length; i++) {
        const t = targets[this.rr++ % targets.length]!;
        const n = this.busy.get(t) ?? 0;
        if (n >= limit) continue;
        this.busy.set(t, n + 1);
        return t;
      }
      await new Promise<void>((r) => {
        this.held.push(r);
        this.counts.peakHeld = Math.max(this.counts.peakHeld, this.held.length);
      });
    }
  }

  /** Stops listening and closes every connection. */
  async stop(): Promise<void> {
    this.mode = { kind: 'drop' };
    await new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
    this.server?.closeAllConnections();
  }
}

/**
 * Forwards one request to `url` with `headers` and writes the answer back to `res`.
 * @returns the function's status, or 0 when it could not be reached (the sender gets 502).
 */
async function forward(
  url: string,
  headers: Record<string, string>,
  body: Buffer,
  res: ServerResponse,
): Promise<number> {
  try {
    const answer = await request(url, { method: 'POST', headers, body, dispatcher: patient });
    const out = Buffer.from(await answer.body.arrayBuffer());
    const back: Record<string, string> = {};
    for (const [k, v] of Object.entries(answer.headers)) if (typeof v === 'string' && !HOP_BY_HOP.has(k)) back[k] = v;
    res.writeHead(answer.statusCode, back).end(out);
    return answer.statusCode;
  } catch {
    res.writeHead(502).end();
    return 0;
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
