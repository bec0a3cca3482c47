/**
 * A fault-injecting HTTPS proxy in front of the test control plane's API server: it serves a
 * certificate from the control plane's own CA, forwards every request (as admin, as a given
 * kubeconfig's user, or with the client's own credentials), and answers in its place whenever
 * `fault(method, url, req)` returns an answer — the honest way to make the real API server's
 * rare answers (410 Gone for an expired continue token, 503, 429) and a hostile proxy's
 * answers (an HTML page echoing the request headers, a forged Status, a reset connection)
 * happen on cue. A kubeconfig pointing at it is written for the function under test.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { createServer, request } from 'node:https';
import { join } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import { loadKubeConfig } from '../../functions/lib/kube.ts';
import { createLeaf } from '../../scripts/controlplane/pki.ts';
import { admin, controlPlaneDir, suffix } from './cluster.ts';

/** A Kubernetes Status the proxy answers with instead of the API server. */
export interface Fault {
  status: number;
  reason: string;
  message: string;
  /** The Status's `details` (name, kind, causes), when given. */
  details?: unknown;
  /** Extra answer headers (e.g. `Retry-After` on a 429). */
  headers?: Readonly<Record<string, string>>;
}

/**
 * The API server throttling a request, as its priority and fairness does: 429
 * `TooManyRequests`, with `Retry-After: <retryAfter>` when given (seconds or an HTTP-date).
 */
export const tooManyRequests = (retryAfter?: string): Fault => ({
  status: 429,
  reason: 'TooManyRequests',
  message: 'too many requests, please try again later',
  ...(retryAfter === undefined ? {} : { headers: { 'Retry-After': retryAfter } }),
});

/** Any answer the proxy gives instead of the API server: a Status, another body, or a reset connection. */
export type Answer = Fault | { status: number; contentType: string; body: string } | { reset: true };

/** A running proxy. */
export interface FaultProxy {
  /** Kubeconfig (admin's credentials, or those of `opts.kubeconfigPath`) whose server is the proxy. */
  kubeconfigPath: string;
  /** The proxy's URL (`https://127.0.0.1:<port>`, its certificate from the control plane's CA). */
  url: string;
  /** Requests answered instead of the API server so far. */
  faults(): number;
  close(): void;
}

/** The Kubernetes Status object of `f` (the fields given; absent ones are left out of its JSON). */
export function statusBody(f: { status: number; reason?: string; message?: string; details?: unknown }): object {
  const { status: code, reason, message, details } = f;
  return { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', reason, code, message, details };
}

/** An error page as a careless proxy writes one: every request header in a table, then `tail`. */
export function headerEchoPage(headers: IncomingHttpHeaders, tail: string): string {
  const rows = Object.entries(headers).map(([k, v]) => `<tr><td>${k}</td><td>${String(v)}</td></tr>`);
  return `<html><body><h1>Upstream error</h1><table>${rows.join('')}</table><p>${tail}</p></body></html>`;
}

/** A copy of `kc` (its user and CA) whose current cluster's server is `server` (a proxy, or a closed port). */
export function withServer(kc: KubeConfig, server: string): KubeConfig {
  const current = kc.getCurrentCluster()!.name;
  const out = new KubeConfig();
  out.loadFromOptions({
    clusters: kc.clusters.map((c) => (c.name === current ? { ...c, server } : c)),
    users: kc.users,
    contexts: kc.contexts,
    currentContext: kc.currentContext,
  });
  return out;
}

/** Gives `answer` to `req` instead of the API server. */
function reply(answer: Answer, req: IncomingMessage, res: ServerResponse): void {
  req.resume();
  if ('reset' in answer) req.socket.destroy();
  else if ('body' in answer) res.writeHead(answer.status, { 'content-type': answer.contentType }).end(answer.body);
  else
    res
      .writeHead(answer.status, { 'content-type': 'application/json', ...answer.headers })
      .end(JSON.stringify(statusBody(answer)));
}

/**
 * Starts the proxy.
 * @param fault decides per request: an answer to give, or undefined to forward; a promise of
 *   either holds the request until it settles (a slow API server).
 * @param opts.kubeconfigPath whose client certificate the proxy forwards with (default
 *   admin's), so the audit log tells the proxied function's requests apart.
 * @param opts.ownCredentials forward each request with the client's own credentials (its
 *   Authorization header, e.g. a ServiceAccount token) and no client certificate; clients
 *   reach the proxy with `withServer(theirKubeConfig, proxy.url)`.
 */
export async function startFaultProxy(
  fault: (method: string, url: string, req: IncomingMessage) => Answer | undefined | Promise<Answer | undefined>,
  opts: { kubeconfigPath?: string; ownCredentials?: boolean } = {},
): Promise<FaultProxy> {
  const a = admin();
  const dir = controlPlaneDir();
  const asPath = opts.kubeconfigPath ?? join(dir, 'admin.kubeconfig');
  const pki = join(dir, 'pki');
  const leaf = await createLeaf({
    ca: { cert: join(pki, 'ca.crt'), key: join(pki, 'ca.key') },
    dir: join(dir, 'users'),
    name: `proxy-${suffix()}`,
    cn: 'proxy',
    sans: ['IP:127.0.0.1'],
    usage: 'server',
  });
  const target = new URL(a.kc.getCurrentCluster()!.server);
  const user = loadKubeConfig(asPath).getCurrentUser()!;
  const ca = Buffer.from(a.kc.getCurrentCluster()!.caData!, 'base64');
  const tls = opts.ownCredentials
    ? { ca }
    : { cert: Buffer.from(user.certData!, 'base64'), key: Buffer.from(user.keyData!, 'base64'), ca };
  let faults = 0;
  const server = createServer({ cert: readFileSync(leaf.cert), key: readFileSync(leaf.key) }, async (req, res) => {
    const answer = await fault(req.method ?? 'GET', req.url ?? '/', req);
    // The client gave up while the fault held its request: nothing to forward.
    if (res.destroyed) return;
    if (answer) {
      faults++;
      reply(answer, req, res);
      return;
    }
    const up = request(
      {
        host: target.hostname,
        port: target.port,
        path: req.url,
        method: req.method,
        headers: { ...req.headers, host: target.host },
        ...tls,
      },
      (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers);
        r.pipe(res);
      },
    );
    up.on('error', () => (res.headersSent ? res.destroy() : res.writeHead(502).end()));
    // A client that goes away mid-request takes the upstream request with it (no socket left open).
    res.on('close', () => up.destroy());
    req.pipe(up);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const url = `https://127.0.0.1:${(server.address() as { port: number }).port}`;
  const text = readFileSync(asPath, 'utf8').replace(target.origin, url);
  const kubeconfigPath = join(dir, 'users', `proxy-${suffix()}.kubeconfig`);
  writeFileSync(kubeconfigPath, text, { mode: 0o600 });
  return { kubeconfigPath, url, faults: () => faults, close: () => server.close() };
}
