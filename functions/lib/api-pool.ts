/**
 * One kept-alive connection pool per process for every call to the API server (SPEC §0).
 *
 * Why: `@kubernetes/client-node` 2.0.1's KubeConfig authentication
 * (`KubeConfig.applySecurityAuthentication`) builds a new undici `Agent`, with its own TLS
 * context, for every request, so each call pays a TLS handshake and leaves a socket behind
 * until it idles out: hundreds of open sockets and several hundred MiB of RSS during a
 * resync (bench/HISTORY.md has the run without this pool; `npm run bench` shows the figures
 * with it). Here the kubeconfig still supplies the
 * credentials — TLS material and headers, including the in-cluster token, which client-node
 * re-reads from its file every 60 s as client-go does — but requests go through one shared,
 * bounded undici `Agent` per TLS identity.
 */
import { createHash } from 'node:crypto';
import type { RequestOptions } from 'node:https';
import type { KubeConfig, RequestContext, SecurityAuthentication } from '@kubernetes/client-node';
import { Agent } from 'undici';

/** Default sockets per process to the API server (`CAPTF_API_CONNECTIONS`). */
export const DEFAULT_API_CONNECTIONS = 8;

/** Idle sockets are closed after this long, in ms (the API server's own idle timeout is longer). */
const KEEP_ALIVE_MS = 30_000;

/**
 * Reads the pool size from `CAPTF_API_CONNECTIONS` (default {@link DEFAULT_API_CONNECTIONS}).
 * @throws Error naming the variable when it is not an integer from 1 to 256.
 */
export function apiConnectionsFromEnv(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.CAPTF_API_CONNECTIONS?.trim() || String(DEFAULT_API_CONNECTIONS);
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1 || n > 256)
    throw new Error(`CAPTF_API_CONNECTIONS=${raw} must be an integer from 1 to 256`);
  return n;
}

// One agent per TLS identity (CA, client certificate and key, server name): a function has
// one; a rotated certificate gets a new pool (rare enough that old ones are simply kept);
// tests that act as several users get one each.
const pools = new Map<string, Agent>();
let poolSize = DEFAULT_API_CONNECTIONS;

/** Sets the pool size for agents created from now on (a function sets it once at start-up). */
export function setApiConnections(n: number): void {
  poolSize = n;
}

function agentFor(opts: RequestOptions): Agent {
  const key = createHash('sha256')
    .update(
      JSON.stringify([
        String(opts.ca ?? ''),
        String(opts.cert ?? ''),
        String(opts.key ?? ''),
        opts.servername ?? '',
        opts.rejectUnauthorized ?? true,
      ]),
    )
    .digest('hex');
  let agent = pools.get(key);
  if (!agent) {
    agent = new Agent({
      connections: poolSize,
      keepAliveTimeout: KEEP_ALIVE_MS,
      connect: {
        ca: opts.ca as string | Buffer | undefined,
        cert: opts.cert as string | Buffer | undefined,
        key: opts.key as string | Buffer | undefined,
        ...(opts.servername ? { servername: opts.servername } : {}),
        ...(opts.rejectUnauthorized === false ? { rejectUnauthorized: false } : {}),
      },
    });
    pools.set(key, agent);
  }
  return agent;
}

/**
 * Authentication for client-node's generated API clients that takes credentials from `kc`
 * and sends every request through the process's shared pool.
 * @returns a SecurityAuthentication to pass as `authMethods.default`.
 */
export function pooledAuthentication(kc: KubeConfig): SecurityAuthentication {
  return {
    getName: () => 'captf pooled kubeconfig',
    async applySecurityAuthentication(context: RequestContext): Promise<void> {
      const opts: RequestOptions = {};
      await kc.applyToHTTPSOptions(opts);
      for (const [name, value] of Object.entries(opts.headers ?? {})) {
        if (value !== undefined) context.setHeaderParam(name, String(value));
      }
      if (opts.auth) context.setHeaderParam('Authorization', `Basic ${Buffer.from(opts.auth).toString('base64')}`);
      context.setDispatcher(agentFor(opts));
    },
  };
}

/** Closes every pooled socket (tests, graceful shutdown). */
export async function closeApiPools(): Promise<void> {
  const all = [...pools.values()];
  pools.clear();
  await Promise.all(all.map((a) => a.close()));
}
