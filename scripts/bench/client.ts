/**
 * The bench's own Kubernetes client: plain REST over one kept-alive HTTPS agent, with the
 * client certificate of a kubeconfig. It is deliberately independent of `functions/lib`
 * (and of `@kubernetes/client-node`'s request path): the baselines it measures must not move
 * when the product changes, and client-node 2.0.1 opens a new TLS connection per request,
 * which would inflate every floor. Only the kubeconfig file is parsed with client-node's loader.
 */
import { Agent, request } from 'node:https';
import { KubeConfig } from '@kubernetes/client-node';
import pLimit from 'p-limit';

/** An API answer: HTTP status and parsed JSON body (undefined for an empty body). */
export interface ApiAnswer<T = unknown> {
  status: number;
  body: T;
}

/** A non-2xx answer, thrown by {@link BenchClient.call}. */
export class ApiError extends Error {
  readonly status: number;
  constructor(method: string, path: string, status: number, body: unknown) {
    const reason = (body as { message?: string } | undefined)?.message ?? '';
    super(`${method} ${path} → ${status} ${reason}`.trim());
    this.status = status;
  }
}

/** One object of a watch stream (`{type, object}`), as the API server sends it. */
export interface WatchEvent<T> {
  type: 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';
  object: T;
}

/** Minimal object shape the bench reads. */
export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: {
    name: string;
    namespace?: string;
    uid?: string;
    resourceVersion?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    ownerReferences?: { apiVersion: string; kind: string; name: string; uid: string }[];
    deletionTimestamp?: string;
  };
  [field: string]: unknown;
}

/** Sockets of the bench's own kept-alive client: the client concurrency of every baseline and setup step. */
export const CLIENT_CONCURRENCY = 8;

/**
 * A kept-alive REST client for one kubeconfig user.
 * Methods throw {@link ApiError} on a non-2xx answer and `Error` on a transport failure.
 */
export class BenchClient {
  readonly server: string;
  private readonly agent: Agent;

  /**
   * @param kubeconfigPath a kubeconfig with `certificate-authority-data` and client-certificate data.
   * @param maxSockets sockets the agent keeps open at most (the client concurrency).
   * @throws Error when the kubeconfig lacks a cluster or client certificate.
   */
  constructor(kubeconfigPath: string, maxSockets = 16) {
    const kc = new KubeConfig();
    kc.loadFromFile(kubeconfigPath);
    const cluster = kc.getCurrentCluster();
    const user = kc.getCurrentUser();
    if (!cluster?.caData || !user?.certData || !user.keyData)
      throw new Error(`${kubeconfigPath}: needs CA data and a client certificate`);
    this.server = cluster.server;
    const b64 = (s: string) => Buffer.from(s, 'base64');
    this.agent = new Agent({
      keepAlive: true,
      maxSockets,
      ca: b64(cluster.caData),
      cert: b64(user.certData),
      key: b64(user.keyData),
    });
  }

  /**
   * One request. `body` is sent as JSON (or as given when `contentType` is set).
   * @returns status and parsed body. @throws ApiError on non-2xx.
   */
  async call<T = unknown>(method: string, path: string, body?: unknown, contentType = 'application/json'): Promise<T> {
    const r = await this.raw<T>(method, path, body, contentType);
    if (r.status < 200 || r.status > 299) throw new ApiError(method, path, r.status, r.body);
    return r.body;
  }

  /** Like {@link call} but returns any status instead of throwing. */
  async raw<T = unknown>(
    method: string,
    path: string,
    body?: unknown,
    contentType = 'application/json',
  ): Promise<ApiAnswer<T>> {
    const r = await this.text(method, path, body, contentType);
    let parsed: unknown;
    try {
      parsed = r.body ? JSON.parse(r.body) : undefined;
    } catch {
      parsed = { message: r.body.slice(0, 200) };
    }
    return { status: r.status, body: parsed as T };
  }

  /** One request; the body is returned as text (e.g. `/metrics`). */
  text(method: string, path: string, body?: unknown, contentType = 'application/json'): Promise<ApiAnswer<string>> {
    const payload = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
    return new Promise((res, rej) => {
      const req = request(
        `${this.server}${path}`,
        {
          method,
          agent: this.agent,
          headers: {
            accept: 'application/json',
            ...(payload ? { 'content-type': contentType, 'content-length': Buffer.byteLength(payload) } : {}),
          },
          timeout: 120_000,
        },
        (r) => {
          const chunks: Buffer[] = [];
          r.on('data', (d: Buffer) => chunks.push(d));
          r.on('end', () => res({ status: r.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
          r.on('error', rej);
        },
      );
      req.on('error', rej);
      req.on('timeout', () => req.destroy(new Error(`${method} ${path}: timed out`)));
      req.end(payload);
    });
  }

  /**
   * Lists a collection page by page (`limit`, `continue`).
   * @param pageSize objects per page (the bench's own choice, frozen with the baselines).
   * @returns every item and the list's resourceVersion and the number of pages read.
   */
  async list<T extends KubeObject>(
    path: string,
    pageSize: number,
    query = '',
  ): Promise<{ items: T[]; resourceVersion: string; pages: number }> {
    const items: T[] = [];
    let cont = '';
    let pages = 0;
    let resourceVersion: string;
    do {
      const sep = path.includes('?') ? '&' : '?';
      const q = `limit=${pageSize}${cont ? `&continue=${encodeURIComponent(cont)}` : ''}${query ? `&${query}` : ''}`;
      const page = await this.call<{ items: T[]; metadata: { continue?: string; resourceVersion: string } }>(
        'GET',
        `${path}${sep}${q}`,
      );
      pages++;
      items.push(...page.items);
      cont = page.metadata.continue ?? '';
      resourceVersion = page.metadata.resourceVersion;
    } while (cont);
    return { items, resourceVersion, pages };
  }

  /**
   * Streams a watch from `resourceVersion` (with bookmarks) and calls `onEvent` per object.
   * The stream is long-lived, on its own connection (no agent), so it never takes a socket
   * from the measured requests.
   * @returns `stop()`; `onEnd` is called when the server closes the stream or it fails.
   */
  watch<T>(opts: {
    path: string;
    resourceVersion: string;
    /** Extra query parameters, e.g. `labelSelector=…`. */
    query?: string;
    onEvent: (e: WatchEvent<T>) => void;
    onEnd: (err?: Error) => void;
  }): () => void {
    const { path, resourceVersion, onEvent, onEnd, query = '' } = opts;
    const sep = path.includes('?') ? '&' : '?';
    const url = `${this.server}${path}${sep}watch=1&allowWatchBookmarks=true&resourceVersion=${resourceVersion}${query ? `&${query}` : ''}`;
    const tls = this.agent.options;
    let stopped = false;
    const req = request(
      url,
      { ca: tls.ca, cert: tls.cert, key: tls.key, headers: { accept: 'application/json' } },
      (r) => {
        if (r.statusCode !== 200) {
          r.resume();
          onEnd(new Error(`watch ${path}: HTTP ${r.statusCode}`));
          return;
        }
        let partial = '';
        r.on('data', (d: Buffer) => {
          const lines = (partial + d.toString('utf8')).split('\n');
          partial = lines.pop() ?? '';
          for (const l of lines) if (l.trim()) onEvent(JSON.parse(l) as WatchEvent<T>);
        });
        r.on('end', () => !stopped && onEnd());
        r.on('error', (e) => !stopped && onEnd(e));
      },
    );
    req.on('error', (e) => !stopped && onEnd(e));
    req.end();
    return () => {
      stopped = true;
      req.destroy();
    };
  }

  /** Closes the kept-alive sockets. */
  close(): void {
    this.agent.destroy();
  }
}

/** Runs `fn(i)` for i in [0, n) with at most `concurrency` in flight (p-limit); rejects on the first failure. */
export async function inParallel(n: number, concurrency: number, fn: (i: number) => Promise<unknown>): Promise<void> {
  const limit = pLimit(concurrency);
  await Promise.all(Array.from({ length: n }, (_, i) => limit(() => fn(i))));
}
