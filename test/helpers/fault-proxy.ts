/**
 * A fault-injecting HTTPS proxy in front of the test control plane's API server: it serves a
 * certificate from the control plane's own CA, forwards every request as admin, and answers
 * in its place whenever `fault(method, url)` returns a fault — the honest way to make the
 * real API server's rare answers (410 Gone for an expired continue token, 503, 429) happen
 * on cue. A kubeconfig pointing at it is written for the function under test.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { createServer, request } from 'node:https';
import { join } from 'node:path';
import { loadKubeConfig } from '../../functions/lib/kube.ts';
import { createLeaf } from '../../scripts/controlplane/pki.ts';
import { admin, controlPlaneDir, suffix } from './cluster.ts';

/** An answer the proxy gives instead of the API server. */
export interface Fault {
  status: number;
  reason: string;
  message: string;
}

/** A running proxy. */
export interface FaultProxy {
  /** Kubeconfig (admin's credentials) whose server is the proxy. */
  kubeconfigPath: string;
  /** Requests answered with a fault so far. */
  faults(): number;
  close(): void;
}

/**
 * Starts the proxy.
 * @param fault decides per request: a fault to answer, or undefined to forward.
 * @param opts.kubeconfigPath whose client certificate the proxy forwards with (default
 *   admin's), so the audit log tells the proxied function's requests apart.
 */
export async function startFaultProxy(
  fault: (method: string, url: string) => Fault | undefined,
  opts: { kubeconfigPath?: string } = {},
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
  const tls = {
    cert: Buffer.from(user.certData!, 'base64'),
    key: Buffer.from(user.keyData!, 'base64'),
    ca: Buffer.from(a.kc.getCurrentCluster()!.caData!, 'base64'),
  };
  let faults = 0;
  const server = createServer({ cert: readFileSync(leaf.cert), key: readFileSync(leaf.key) }, (req, res) => {
    const f = fault(req.method ?? 'GET', req.url ?? '/');
    if (f) {
      faults++;
      req.resume();
      res.writeHead(f.status, { 'content-type': 'application/json' }).end(
        JSON.stringify({
          kind: 'Status',
          apiVersion: 'v1',
          metadata: {},
          status: 'Failure',
          reason: f.reason,
          code: f.status,
          message: f.message,
        }),
      );
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
    up.on('error', () => res.writeHead(502).end());
    req.pipe(up);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const text = readFileSync(asPath, 'utf8').replace(
    target.origin,
    `https://127.0.0.1:${(server.address() as { port: number }).port}`,
  );
  const kubeconfigPath = join(dir, 'users', `proxy-${suffix()}.kubeconfig`);
  writeFileSync(kubeconfigPath, text, { mode: 0o600 });
  return { kubeconfigPath, faults: () => faults, close: () => server.close() };
}
