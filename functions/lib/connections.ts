/**
 * The connections of a function's server: its timeouts, the idle limit, and the drain on SIGTERM (SPEC §13:
 * accept nothing new, also on kept-alive connections; finish what is in flight; stop within a
 * deadline). Node alone does not drain: after `server.close()` it goes on answering new
 * requests on kept-alive connections, keeps connections that have not sent a request yet, and
 * stops enforcing its header and request timeouts. So every server is tracked from the start
 * ({@link limitIdleConnections}, called before listening): its connections, and its answers
 * from the request until the handler ends them (`res.end`), whether or not the client is still
 * there, because a reconcile whose caller went away is still work in flight.
 */
import type { IncomingMessage, Server, ServerOptions, ServerResponse } from 'node:http';
import { Server as NetServer, type Socket } from 'node:net';
import { Server as TlsServer } from 'node:tls';

/**
 * Timeouts of every function's server (milliseconds), so a client that sends slowly, stops
 * sending, or never reads cannot hold a connection open (slow-loris):
 * - `headersMs`: the request line and headers must be in within this time (Node's
 *   `headersTimeout`); otherwise 408 and the connection is closed. admission's TLS handshake
 *   has the same bound (`handshakeTimeout`);
 * - `requestMs`: the whole request, body included, within this time (`requestTimeout`);
 *   otherwise 408. A 4 MiB AdmissionReview needs 210 KB/s, far below any in-cluster sender;
 * - `idleMs`: no byte in either direction for this long while a request is being received or
 *   its answer sent closes the connection; the time a handler works on a complete request does
 *   not count (a resync may take minutes: Knative's `timeoutSeconds` bounds that);
 * - `keepAliveMs`: an idle kept-alive connection is closed after this (Node's default, made explicit;
 *   Node waits 1 s more than it advertises);
 * - `checkEveryMs`: how often Node checks the first two (`connectionsCheckingInterval`), so a
 *   slow client is cut off at most this much after its deadline;
 * - `quietMs`: when a drain begins, how long a connection without an answer in flight stays
 *   open. A request its client sent before it could know (one already on the wire on a fresh or
 *   kept-alive connection) is answered 503 with `Connection: close` instead of being cut off.
 * Body size is limited separately (lib/http.ts `readBody`); headers by Node's 16 KiB (431).
 */
export const SERVER_TIMEOUTS = {
  headersMs: 10_000,
  requestMs: 20_000,
  idleMs: 10_000,
  keepAliveMs: 5_000,
  checkEveryMs: 1_000,
  quietMs: 1_000,
} as const;

/** The shape of {@link SERVER_TIMEOUTS} (tests pass shorter ones). */
export type ServerTimeouts = { readonly [K in keyof typeof SERVER_TIMEOUTS]: number };

/** Options for `http.createServer`/`https.createServer` that set {@link SERVER_TIMEOUTS}. */
export function serverOptions(t: ServerTimeouts = SERVER_TIMEOUTS): ServerOptions {
  return {
    headersTimeout: t.headersMs,
    requestTimeout: t.requestMs,
    keepAliveTimeout: t.keepAliveMs,
    connectionsCheckingInterval: t.checkEveryMs,
  };
}

/** What one server is doing. */
interface Serving {
  /** Answers not yet ended by their handler, with when their request came (ms since the epoch). */
  open: Map<ServerResponse, number>;
  /** Its connections (a TLS one once its handshake is done), each marked once it carried a request. */
  sockets: Map<Socket, { used: boolean }>;
  timeouts: ServerTimeouts;
  /** Set by {@link closeServer}: new requests are refused, and it hears of every answer that ends. */
  drain?: { onEnd: () => void };
}

const SERVING = new WeakMap<Server, Serving>();
/** Requests that came while their server drained: the app refuses them ({@link refusedWhileDraining}). */
const REFUSED = new WeakSet<IncomingMessage>();

/** The tracking of `server`, started on the first call. */
function servingOf(server: Server, t: ServerTimeouts = SERVER_TIMEOUTS): Serving {
  const known = SERVING.get(server);
  if (known) return known;
  const s: Serving = { open: new Map(), sockets: new Map(), timeouts: t };
  SERVING.set(server, s);
  server.on(server instanceof TlsServer ? 'secureConnection' : 'connection', (socket: Socket) => {
    // A TLS handshake that ends while draining: nothing new is accepted.
    if (s.drain) return void socket.destroy();
    s.sockets.set(socket, { used: false });
    socket.once('close', () => s.sockets.delete(socket));
  });
  // Before the app's listener, so that a refusal and the header are in place when it runs.
  server.prependListener('request', (req: IncomingMessage, res: ServerResponse) => {
    const mark = s.sockets.get(req.socket);
    if (mark) mark.used = true;
    s.open.set(res, Date.now());
    const ended = () => {
      if (s.open.delete(res)) s.drain?.onEnd();
    };
    // A handler ends its answer, or destroys it when it failed after the headers went out.
    const end = res.end.bind(res);
    res.end = ((...args: Parameters<typeof end>) => (ended(), end(...args))) as typeof res.end;
    const destroy = res.destroy.bind(res);
    res.destroy = ((err?: Error) => (ended(), destroy(err))) as typeof res.destroy;
    if (s.drain) {
      REFUSED.add(req);
      res.setHeader('connection', 'close');
    }
  });
  return s;
}

/**
 * Sets the socket idle timeout of {@link SERVER_TIMEOUTS} on a server created with
 * `serverOptions`: a connection with no traffic for `idleMs` is destroyed unless a complete
 * request on it is still being worked on (the handler's own time is not idleness). Node also
 * routes the keep-alive timeout through the same event, so an idle kept-alive connection is
 * destroyed as before. Also starts the tracking {@link closeServer} needs: call it before
 * listening.
 */
export function limitIdleConnections(server: Server, t: ServerTimeouts = SERVER_TIMEOUTS): void {
  const s = servingOf(server, t);
  server.setTimeout(t.idleMs, (socket: Socket) => {
    const working = [...s.open.keys()].some((res) => res.req.socket === socket && res.req.complete);
    if (!working) socket.destroy();
  });
}

/**
 * Whether `req` came while its server drained; the app answers it 503 without running a
 * handler (lib/http.ts `createApp`).
 */
export const refusedWhileDraining = (req: IncomingMessage): boolean => REFUSED.has(req);

/** How many answers `server` is working on now. */
export const answersInFlight = (server: Server): number => servingOf(server).open.size;

/**
 * Drains a server (SPEC §13). It stops listening and closes every connection that carries no
 * answer: idle kept-alive ones and those that never sent a request after `quietMs` (a request
 * already on its way gets a 503, not a cut), one still receiving headers after `headersMs`.
 * The newest answer in flight on each connection goes out with `Connection: close`, so a
 * kept-alive client sends nothing more on it; a request whose body is still arriving keeps
 * its `requestMs` bound. A request that arrives anyway is answered 503 without being handled.
 * @param deadlineMs how long to wait (default: as long as it takes).
 * @returns true once every connection has closed and every handler has ended its answer; false
 *   if that had not happened by the deadline (what is left is left: the caller decides).
 */
export function closeServer(server: Server, deadlineMs = Infinity): Promise<boolean> {
  const s = servingOf(server);
  return new Promise((resolve) => {
    let closed = false;
    const timers: NodeJS.Timeout[] = [];
    const settle = (drained: boolean) => {
      timers.forEach(clearTimeout);
      resolve(drained);
    };
    // A connection whose last answer ends closes by its `Connection: close`; none is closed here,
    // since Node counts a connection between two pipelined answers as idle.
    s.drain = { onEnd: () => setImmediate(() => closed && s.open.size === 0 && settle(true)) };
    if (Number.isFinite(deadlineMs)) timers.push(setTimeout(() => settle(false), deadlineMs));
    // net's close, not http's: http's also closes idle connections at once, cutting off a
    // request already on its way on one (closeQuiet gives them `quietMs`).
    NetServer.prototype.close.call(server, () => {
      closed = true;
      if (s.open.size === 0) settle(true);
    });
    timers.push(...closeQuiet(server, s), ...boundBodies(s));
    for (const res of newestPerConnection(s)) if (!res.headersSent) res.setHeader('connection', 'close');
  });
}

/**
 * Closes the connections that carry no answer: after `quietMs` those idle or that never sent a
 * request, unless a request came on them meanwhile (it is refused, and its `Connection: close`
 * ends the connection); one still receiving headers after `headersMs`. Returns the timers.
 */
function closeQuiet(server: Server, s: Serving): NodeJS.Timeout[] {
  const busy = () => new Set([...s.open.keys()].map((res) => res.req.socket));
  const atStart = busy();
  const quiet = [...s.sockets].filter(([socket]) => !atStart.has(socket));
  const afterQuiet = setTimeout(() => {
    // Node's own idea of idle: no request being received and none being answered.
    server.closeIdleConnections();
    const now = busy();
    for (const [socket, { used }] of quiet) if (!used && !now.has(socket)) socket.destroy();
  }, s.timeouts.quietMs);
  const receiving = quiet
    .filter(([, { used }]) => used)
    .map(([socket]) => setTimeout(() => busy().has(socket) || socket.destroy(), s.timeouts.headersMs));
  return [afterQuiet, ...receiving];
}

/** Gives each request whose body is still arriving the rest of its `requestMs`, then cuts it. */
function boundBodies(s: Serving): NodeJS.Timeout[] {
  return [...s.open]
    .filter(([res]) => !res.req.complete)
    .map(([res, since]) =>
      setTimeout(
        () => {
          if (!res.req.complete) res.req.socket.destroy();
        },
        Math.max(0, since + s.timeouts.requestMs - Date.now()),
      ),
    );
}

/** The newest open answer on each connection: Node sends a connection's answers in order. */
function newestPerConnection(s: Serving): ServerResponse[] {
  const newest = new Map<Socket, ServerResponse>();
  for (const res of s.open.keys()) newest.set(res.req.socket, res);
  return [...newest.values()];
}
