/**
 * The HTTP shell shared by every function (express 5): bodies of the accepted content types
 * read as text up to a size limit,
 * `GET /healthz`, JSON error answers that never echo request bodies, and the drain on SIGTERM
 * (Knative sends it before removing a pod): nothing new accepted, also on kept-alive
 * connections, answers in flight finished, exit within a deadline.
 */
import { randomUUID } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import express, {
  type ErrorRequestHandler,
  type Express,
  type Request,
  type RequestHandler,
  type Response,
} from 'express';
import { parse as parseContentType } from 'content-type';
import getRawBody from 'raw-body';
import type { KubeConfig } from '@kubernetes/client-node';
import { describeError } from './api-errors.ts';
import { PING_EVENT_TYPE } from './cloudevents.ts';
import { countJsonContainers, MAX_JSON_CONTAINERS, processBodyBudget, type BodyBudget } from './body-memory.ts';
import {
  answersInFlight,
  closeServer,
  limitIdleConnections,
  refusedWhileDraining,
  SERVER_TIMEOUTS,
  serverOptions,
} from './connections.ts';
import { loadKubeConfig } from './kube.ts';
import type { Logger } from './log.ts';
import { retryAfterHeader } from './retry-after.ts';
import { recording, telemetry, type Telemetry } from './telemetry.ts';

// The connection layer (timeouts, idle limit, drain) lives in connections.ts; the functions take it from here.
export {
  closeServer,
  limitIdleConnections,
  serverOptions,
  SERVER_TIMEOUTS,
  type ServerTimeouts,
} from './connections.ts';

/** Largest request body accepted, in bytes (Kubernetes objects are at most ~1.5 MiB). */
export const DEFAULT_BODY_LIMIT = 3 * 1024 * 1024;

/** A JSON error answer: `{ error, reason? }` with an HTTP status. */
export class HttpError extends Error {
  readonly status: number;
  readonly reason: string | undefined;
  /** @param status HTTP status (4xx for the caller's fault, 5xx to ask for a retry). */
  constructor(status: number, message: string, reason?: string) {
    super(message);
    this.status = status;
    this.reason = reason;
  }
}

/**
 * What a handler decided, in words every function shares; {@link sendOutcome} is the one
 * place that turns it into an HTTP status and a JSON body (SPEC §4, §5, §15):
 * `done` 200 (the work the request names is done), `bad-input` 400 (malformed or unusable
 * input: fix the request), `forbidden` 403, `not-found` 404, `conflict` 409 and
 * `unprocessable` 422 (states that wait for a person), `retry` 503 (a retry can fix it).
 * A `retry` may say how long to wait first (`retryAfterSeconds`: the `Retry-After` header,
 * lib/retry-after.ts); the other kinds never carry one.
 */
export type Outcome =
  | { kind: 'done'; body: object }
  | {
      kind: 'bad-input' | 'forbidden' | 'not-found' | 'conflict' | 'unprocessable' | 'retry';
      error: string;
      reason?: string | undefined;
      body?: object;
      /** `retry` only: seconds the sender should wait before retrying (sent as `Retry-After`). */
      retryAfterSeconds?: number | undefined;
    };

/** HTTP status of each {@link Outcome} kind. */
export const OUTCOME_STATUS: Record<Outcome['kind'], number> = {
  done: 200,
  'bad-input': 400,
  forbidden: 403,
  'not-found': 404,
  conflict: 409,
  unprocessable: 422,
  retry: 503,
};

/**
 * Sends an outcome: its status from {@link OUTCOME_STATUS}; the body as given for `done`,
 * else `{error, reason?, ...body}`; a `retry` with `retryAfterSeconds` also gets a
 * `Retry-After` header (retry-after.ts `retryAfterHeader`: whole seconds, 1 to 30).
 */
export function sendOutcome(res: Response, o: Outcome): void {
  if (o.kind === 'done') {
    res.status(OUTCOME_STATUS.done).json(o.body);
    return;
  }
  if (o.kind === 'retry' && o.retryAfterSeconds !== undefined)
    res.set('Retry-After', retryAfterHeader(o.retryAfterSeconds));
  res.status(OUTCOME_STATUS[o.kind]).json({ error: o.error, ...(o.reason ? { reason: o.reason } : {}), ...o.body });
}

/** Header naming the log line that holds an event answer's detail (a random UUID, nothing else). */
export const EVENT_ANSWER_ID_HEADER = 'x-request-id';

/** Message of the log line with an event answer's detail (see {@link sendEventOutcome}). */
export const EVENT_ANSWER_LOG = 'event answer';

/**
 * The body of each event answer that is not a 200 (SPEC §12: an answer to an event never names
 * objects, outcomes or identities). Constant per kind, so a sender learns only what to do.
 */
export const EVENT_ANSWERS: Readonly<Record<Exclude<Outcome['kind'], 'done'>, string>> = {
  'bad-input': 'the request holds no event this function can use; the function log names why',
  forbidden: 'not allowed',
  'not-found': 'not found',
  conflict: 'conflict; deliver again later',
  unprocessable: 'the events are about objects this function does not handle',
  retry: 'the work is not finished; deliver again',
};

/**
 * Sends the outcome of a CloudEvents request, naming nothing (SPEC §12): a `done` is 200 with an
 * empty body (also what Knative's dispatcher needs: it sends `Prefer: reply` and reads a 2xx
 * body as a reply event, counting one that is no CloudEvent as a failed delivery); anything
 * else is its status with `{error}` from {@link EVENT_ANSWERS}, and a `retry` keeps its
 * `Retry-After`. What the handler decided (the objects, outcomes and errors) goes to one log
 * line, {@link EVENT_ANSWER_LOG} at debug level (info when not done), under a random id the
 * answer carries in {@link EVENT_ANSWER_ID_HEADER}: an operator finds it from a dead letter's
 * or a sender's record, a test reads it back.
 */
export function sendEventOutcome(res: Response, o: Outcome, logger: Logger): void {
  const requestId = randomUUID();
  res.set(EVENT_ANSWER_ID_HEADER, requestId);
  const status = OUTCOME_STATUS[o.kind];
  if (o.kind === 'done') {
    logger.debug(EVENT_ANSWER_LOG, { requestId, status, detail: o.body });
    res.status(status).end();
    return;
  }
  const { kind, retryAfterSeconds, error, reason, body } = o;
  const detail = { error, ...(reason ? { reason } : {}), ...body };
  logger.info(EVENT_ANSWER_LOG, { requestId, status, detail });
  if (kind === 'retry' && retryAfterSeconds !== undefined) res.set('Retry-After', retryAfterHeader(retryAfterSeconds));
  res.status(status).json({ error: EVENT_ANSWERS[kind] });
}

/**
 * Creates an express app with `GET /healthz`; each route reads its body with {@link readBody}.
 * A request behind a refused body on the same connection is not run (the connection is closing).
 * A request that reaches a draining server (connections.ts `closeServer`) is answered 503 with
 * `Connection: close` and `Retry-After: 1` before any route runs: the sender retries elsewhere.
 */
export function createApp(): Express {
  const app = express();
  app.disable('x-powered-by');
  // A request sent behind a refused body, on a connection already half-closed ({@link stopReading}):
  // no answer could go out, so it is not run.
  app.use((req, res, next) => (ENDING.has(req.socket) ? void res.destroy() : next()));
  app.use(observeAnswers);
  app.use((req, res, next) => {
    if (!refusedWhileDraining(req)) return next();
    res.set('retry-after', '1').status(503).json({ error: 'this instance is stopping; send the request again' });
  });
  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  return app;
}

/**
 * Records each answer (./telemetry.ts): its route, method, status and duration once sent, in a
 * server span that continues the caller's W3C trace context (a Broker's delivery carries
 * `traceparent`) and is named after the matched route's template, so the set is bounded; the
 * raw path is never recorded. Nothing when telemetry is off.
 */
const observeAnswers: RequestHandler = (req, res, next) => {
  if (!recording()) return next();
  const started = performance.now();
  const method = req.method;
  void telemetry().span(method, { kind: 'server', parent: req.headers }, (span) => {
    const ended = new Promise<void>((resolve) =>
      res.on('close', () => {
        const matched = (req.route as { path?: unknown } | undefined)?.path;
        const route = typeof matched === 'string' ? matched : 'unmatched';
        span.rename(`${method} ${route}`);
        span.set({ 'http.request.method': method, 'http.route': route, 'http.response.status_code': res.statusCode });
        if (!res.writableFinished) span.fail('the connection closed before the answer was sent');
        else {
          if (res.statusCode >= 500) span.fail(`answered ${res.statusCode}`);
          telemetry().httpAnswer(route, method, res.statusCode, (performance.now() - started) / 1000);
        }
        resolve();
      }),
    );
    next();
    return ended;
  });
};

/** How long a connection whose body was refused stays half-closed after the answer, or after the body it took in ended, before it is dropped (ms). */
const LINGER_MS = 2_000;
/** Connections {@link stopReading} ends: a request behind the refused one on them is not run. */
const ENDING = new WeakSet<object>();

/** Content types of an AdmissionReview or a prepare request. */
export const JSON_TYPES: readonly string[] = ['application/json'];
/** Content types of CloudEvents as Knative delivers them: binary (JSON data), structured and batch mode. */
export const EVENT_TYPES: readonly string[] = [
  'application/json',
  'application/cloudevents+json',
  'application/cloudevents-batch+json',
];

/**
 * Middleware reading a CloudEvents delivery's body ({@link readBody} with {@link EVENT_TYPES}).
 * A binary-mode ping (`ce-type: dev.knative.sources.ping`) is taken whatever its content type:
 * SPEC §12 never reads a ping's payload, and a PingSource may send its `data` as text/plain.
 */
export const readEvents = (): RequestHandler =>
  readBody({ types: EVENT_TYPES, anyType: (req) => req.get('ce-type') === PING_EVENT_TYPE });

/**
 * Middleware reading a route's body as UTF-8 text into `req.body` (the handlers parse it, so
 * a malformed body is their 4xx). A body of another content type, encoding or charset is a
 * 415 before any byte is read; a request without a body, or with an empty one, is let through
 * with `''`. A body over `limit` is a 413 at
 * once when `Content-Length` says so, otherwise as soon as the limit is passed: reading stops
 * there (raw-body pauses the stream) and the connection is closed after the answer, so the
 * sender is not read to its end. The heap a body may cost is bounded (./body-memory.ts): a body
 * that does not fit the process's budget of bodies in flight is a 503 with `Retry-After: 1`
 * before any byte is read, and one holding more than {@link MAX_JSON_CONTAINERS} JSON objects
 * and arrays a 413.
 * @param opts.types accepted media types (parameters such as `charset` are ignored).
 * @param opts.limit bytes (default {@link DEFAULT_BODY_LIMIT}).
 * @param opts.anyType requests read whatever their type, encoding or charset (their body is never interpreted).
 * @param opts.budget the bodies in flight it reserves from (default: the process's).
 */
export function readBody(opts: {
  types: readonly string[];
  limit?: number;
  anyType?: (req: Request) => boolean;
  budget?: BodyBudget;
}): RequestHandler {
  const limit = opts.limit ?? DEFAULT_BODY_LIMIT;
  const budget = opts.budget ?? processBodyBudget;
  return (req, res, next) => {
    const type = req.is([...opts.types]);
    // An empty body has no type to check (a ping without data carries none, or any).
    if (type === null || req.headers['content-length'] === '0') {
      req.body = '';
      return next();
    }
    const refused = opts.anyType?.(req)
      ? undefined
      : type === false
        ? `content type must be one of ${opts.types.join(', ')}`
        : unreadable(req);
    if (refused) throw new HttpError(415, refused);
    // A chunked body may grow to the limit; it is held until the answer is over.
    const declared = Number(req.headers['content-length']);
    const size = Number.isSafeInteger(declared) && declared >= 0 ? Math.min(declared, limit) : limit;
    if (!budget.take(size)) {
      stopReading(req, res, size);
      res.set('retry-after', '1');
      throw new HttpError(503, 'too many large request bodies at once; send it again shortly');
    }
    res.once('close', () => budget.give(size));
    getRawBody(req, { limit, length: req.headers['content-length'], encoding: 'utf8' }).then(
      (text) => {
        if (!opts.anyType?.(req) && countJsonContainers(text) > MAX_JSON_CONTAINERS) {
          next(new HttpError(413, `request body holds more than ${MAX_JSON_CONTAINERS} JSON objects and arrays`));
          return;
        }
        req.body = text;
        next();
      },
      (err: { type?: string }) => {
        // Past the limit or broken: what is left of it is not read at all.
        stopReading(req, res, 0);
        next(err);
      },
    );
  };
}

/** Why a body of an accepted type cannot be read as UTF-8 text, if it cannot. */
function unreadable(req: Request): string | undefined {
  const encoding = req.headers['content-encoding'];
  if (encoding && encoding !== 'identity') return 'content encoding must be identity';
  // JSON is UTF-8 (RFC 8259 §8.1): any other declared charset is refused, not guessed at.
  const charset = parseContentType(req.headers['content-type'] ?? '').parameters.charset?.toLowerCase();
  return charset && charset !== 'utf-8' && charset !== 'utf8' ? 'charset must be utf-8' : undefined;
}

/**
 * Ends a connection whose body was refused. Once the answer is out the connection is half-closed
 * (the sender sees the answer and the end before anything else) and dropped a moment later
 * ({@link LINGER_MS}). A body refused only for want of room (`drop` > 0: its size, within the
 * limit) is taken in and thrown away (Node dumps a request nobody reads), and the connection
 * stays until the body has ended (then {@link LINGER_MS}), or within the server's own bounds:
 * `idleMs` without a byte (the socket's timeout, limitIdleConnections), `requestMs` in all
 * (SERVER_TIMEOUTS). Closed while bytes are still coming, the close would turn into a reset,
 * and a reset makes the sender's kernel drop the answer before the sender has read it (a busy
 * sender reads late). A body past the limit is never read further, and nothing after a body is
 * read.
 */
function stopReading(req: Request, res: Response, drop: number): void {
  ENDING.add(req.socket);
  // Node ends the answer to a `Connection: close` request by destroying the socket once it is
  // written: with body bytes unread, that is the reset. Only a half-close, then; the rest is ours.
  req.socket.destroySoon = () => void req.socket.end();
  req.socket.pause();
  let timer: NodeJS.Timeout | undefined;
  const hangUpIn = (ms: number) => {
    clearTimeout(timer);
    timer = setTimeout(() => req.socket.destroy(), ms).unref();
  };
  req.socket.once('close', () => clearTimeout(timer));
  res.on('finish', () => {
    req.socket.end();
    req.socket.pause();
    if (drop <= 0 || req.complete) return hangUpIn(LINGER_MS);
    req.once('end', () => {
      req.socket.pause();
      hangUpIn(LINGER_MS);
    });
    // Node set its keep-alive timeout when the answer finished: the idle bound applies instead.
    req.socket.setTimeout(SERVER_TIMEOUTS.idleMs);
    hangUpIn(SERVER_TIMEOUTS.requestMs);
    req.resume();
    req.socket.resume();
  });
}

/** Our words for raw-body's error types (its own messages may quote the body). */
const BODY_PARSER_MESSAGES = new Map([
  ['entity.too.large', 'request body too large'],
  ['entity.parse.failed', 'request body is not valid'],
  ['request.size.invalid', 'request body is shorter or longer than its Content-Length'],
  ['encoding.unsupported', 'request body encoding is not supported'],
]);

/** The message of a 4xx raised by a middleware (body-parser's own words may quote the body). */
const clientErrorMessage = (e: { type?: string; message?: string }): string =>
  BODY_PARSER_MESSAGES.get(e.type ?? '') ?? e.message ?? 'bad request';

/**
 * The last middleware: turns thrown errors into JSON answers. Body-parser errors keep their
 * status (400 malformed, 413 too large); {@link HttpError} keeps its status and message;
 * anything else is a 500 whose message is logged, not returned. An error after the answer's
 * headers went out is logged and its connection destroyed.
 */
export function errorHandler(logger: Logger): ErrorRequestHandler {
  return (err, req, res, _next) => {
    const e = err as { status?: number; statusCode?: number; type?: string; message?: string };
    if (res.headersSent) {
      // Half an answer is out: nothing honest can follow it on this connection.
      logger.error('request failed after its answer began', { path: req.path, error: describeError(err) });
      res.destroy();
      return;
    }
    if (err instanceof HttpError) {
      res.status(err.status).json({ error: err.message, ...(err.reason ? { reason: err.reason } : {}) });
      return;
    }
    const status = e.status ?? e.statusCode ?? 500;
    if (status >= 400 && status < 500) {
      res.status(status).json({ error: clientErrorMessage(e) });
      return;
    }
    // An unexpected error may come from an API call: described without the answer's text (SPEC §15).
    logger.error('request failed', { path: req.path, error: describeError(err) });
    res.status(500).json({ error: 'internal error; see the function log' });
  };
}

/**
 * Stops on SIGTERM or SIGINT (SPEC §13): {@link FunctionHandle.close} with `drainMs` as the
 * deadline, then exits 0 once every connection has closed, or 1 if answers were still in
 * flight at the deadline, pushing `flush`'s telemetry first. The push fits inside the same
 * deadline (the grace period is all there is): with telemetry on, the drain leaves it up to
 * {@link FLUSH_MS} (at most a fifth of the deadline), and it gets what is left. A second
 * signal changes nothing.
 * @param drainMs the drain deadline (ms): Knative's termination grace period is the revision's
 *   `timeoutSeconds`, and the manifests set `CAPTF_DRAIN_SECONDS` to it ({@link drainMsFromEnv}).
 */
export function stopGracefully(fn: FunctionHandle, drainMs: number, flush?: Telemetry): void {
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    fn.logger.info('stopping', { signal, inFlight: answersInFlight(fn.server), drainSeconds: drainMs / 1000 });
    const t0 = performance.now();
    const reserved = flush ? Math.min(FLUSH_MS, drainMs / 5) : 0;
    const drained = await fn.close(drainMs - reserved);
    // What was recorded up to the last answer, pushed before the pod goes, within the deadline.
    await flush?.shutdown(Math.min(FLUSH_MS, Math.max(0, drainMs - (performance.now() - t0))));
    if (!drained) {
      fn.logger.warn('answers still in flight at the drain deadline; exiting', {
        inFlight: answersInFlight(fn.server),
        drainSeconds: drainMs / 1000,
      });
      process.exit(1);
    }
    fn.logger.info('stopped');
    process.exit(0);
  };
  process.on('SIGTERM', () => void stop('SIGTERM'));
  process.on('SIGINT', () => void stop('SIGINT'));
}

/** The longest a stop waits for the last metrics push, in ms. */
export const FLUSH_MS = 5_000;

/** Default drain deadline (s) when `CAPTF_DRAIN_SECONDS` is unset; the manifests always set it. */
export const DEFAULT_DRAIN_SECONDS = 30;

/**
 * The drain deadline in ms from `CAPTF_DRAIN_SECONDS` (whole seconds, 1–3600; default
 * {@link DEFAULT_DRAIN_SECONDS}).
 * @throws Error naming the variable for any other value.
 */
export function drainMsFromEnv(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.CAPTF_DRAIN_SECONDS?.trim() || String(DEFAULT_DRAIN_SECONDS);
  const seconds = Number(raw);
  if (!/^\d+$/.test(raw) || seconds < 1 || seconds > 3600)
    throw new Error(`CAPTF_DRAIN_SECONDS=${raw} must be a whole number of seconds from 1 to 3600`);
  return seconds * 1000;
}

/** The port to listen on: `$PORT` (Knative sets it) or `fallback`. @throws Error on a bad value. */
export function portFromEnv(fallback = 8080, env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.PORT;
  if (raw === undefined || raw === '') return fallback;
  const port = Number(raw);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`PORT=${raw} is not a port number`);
  return port;
}

/** What every function's `start()` accepts (tests pass a kubeconfig, port 0 and a logger). */
export interface StartOptions {
  /** Port to listen on; 0 picks a free one. Default `$PORT` or 8080. */
  port?: number;
  /** Address to bind; default all interfaces (`0.0.0.0`, as in a container). */
  host?: string;
  /** API access; default {@link loadKubeConfig} (`$KUBECONFIG` or in-cluster). */
  kubeconfig?: import('@kubernetes/client-node').KubeConfig;
  logger?: Logger;
  /** Environment to read configuration from; default `process.env`. */
  env?: NodeJS.ProcessEnv;
}

/**
 * What every function's `start()` resolves from its options, the same way in each: the port
 * (`opts.port`, else `$PORT`, else 8080), the API access (`opts.kubeconfig`, else
 * `$KUBECONFIG` of `opts.env`, else the in-cluster service account) and the environment.
 * @throws Error for a bad `$PORT` or when no Kubernetes configuration is usable.
 */
export function startSettings(opts: StartOptions): { port: number; kubeconfig: KubeConfig; env: NodeJS.ProcessEnv } {
  const env = opts.env ?? process.env;
  return {
    port: opts.port ?? portFromEnv(8080, env),
    kubeconfig: opts.kubeconfig ?? loadKubeConfig(env.KUBECONFIG || undefined),
    env,
  };
}

/** A running function. */
export interface FunctionHandle {
  server: Server;
  /** The port actually bound. */
  port: number;
  /** `http` or `https`. */
  scheme: 'http' | 'https';
  logger: Logger;
  /**
   * Releases watchers and drains the server ({@link closeServer}).
   * @returns true once every connection closed, false if some were open at `deadlineMs`.
   */
  close(deadlineMs?: number): Promise<boolean>;
}

/**
 * Listens and resolves once bound.
 * @returns the bound port.
 * @throws the listen error (e.g. EADDRINUSE).
 */
export function listen(server: Server, port: number, host = '0.0.0.0'): Promise<number> {
  return new Promise((res, rej) => {
    server.once('error', rej);
    server.listen(port, host, () => {
      server.off('error', rej);
      const addr = server.address();
      res(typeof addr === 'object' && addr ? addr.port : port);
    });
  });
}

/**
 * Serves `app` over plain HTTP as the event functions do: {@link errorHandler} last, the
 * connection limits of ./connections.ts, bound to `port` (0 = any free) on `host`.
 * @returns the running function; `close()` drains it ({@link closeServer}).
 * @throws the listen error (e.g. EADDRINUSE).
 */
export async function servePlain(app: Express, logger: Logger, port: number, host?: string): Promise<FunctionHandle> {
  app.use(errorHandler(logger));
  const server = createServer(serverOptions(), app);
  limitIdleConnections(server);
  const bound = await listen(server, port, host);
  return { server, port: bound, scheme: 'http', logger, close: (deadlineMs) => closeServer(server, deadlineMs) };
}
