/**
 * identity-status (SPEC §9): keeps each TerraformClusterIdentity's `Ready` condition and
 * `status.namespaces` true to the API server. Triggered by a PingSource (every identity) and
 * by ApiServerSource events about identities (that one). HTTP: `POST /` (CloudEvents, from
 * its senders only: lib/sender-gate.ts),
 * `GET /healthz`. Start with `npm run function -- identity-status`.
 */
import { consumerKindsFromEnv } from '../lib/consumers.ts';
import { startEventFunction } from '../lib/event-function.ts';
import type { FunctionHandle, StartOptions } from '../lib/http.ts';
import { handleEvents } from './handler.ts';

/** Env: how many identities a ping refreshes at once (1–64, default 8). */
export const CONCURRENCY_ENV = 'CAPTF_STATUS_CONCURRENCY';
/** Env: label selector limiting which identities this instance refreshes (default: all). */
export const IDENTITY_SELECTOR_ENV = 'CAPTF_STATUS_IDENTITY_SELECTOR';
/** Default of {@link CONCURRENCY_ENV}. */
export const DEFAULT_CONCURRENCY = 8;

/**
 * Reads identity-status's configuration.
 * @returns `{ concurrency, identitySelector }`.
 * @throws Error naming the variable when a value is malformed.
 */
export function statusConfigFromEnv(env: NodeJS.ProcessEnv): {
  concurrency: number;
  identitySelector: string | undefined;
} {
  const raw = env[CONCURRENCY_ENV]?.trim();
  const concurrency = raw ? Number(raw) : DEFAULT_CONCURRENCY;
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 64)
    throw new Error(`${CONCURRENCY_ENV}=${raw} must be an integer from 1 to 64`);
  return { concurrency, identitySelector: env[IDENTITY_SELECTOR_ENV]?.trim() || undefined };
}

/**
 * Starts identity-status.
 * @param opts port (0 = any free), host, kubeconfig, logger and env (see {@link StartOptions}).
 * @returns the running function; `close()` waits for in-flight refreshes.
 * @throws Error on bad configuration (no kubeconfig, malformed env) or a listen error.
 */
export function start(opts: StartOptions = {}): Promise<FunctionHandle> {
  return startEventFunction('identity-status', opts, ({ kc, env, logger }) =>
    handleEvents({ kc, consumerKinds: consumerKindsFromEnv(env), ...statusConfigFromEnv(env), logger }),
  );
}
