/**
 * identity-status (SPEC §9): keeps each TerraformClusterIdentity's `Ready` condition and
 * `status.namespaces` true to the API server. Triggered by a PingSource (every identity) and
 * by ApiServerSource events about identities (that one). HTTP: `POST /` (CloudEvents, from
 * its senders only: lib/sender-gate.ts),
 * `GET /healthz`. Start with `npm run function -- identity-status`.
 */
import { consumerKindsFromEnv } from '../lib/consumers.ts';
import {
  createApp,
  readEvents,
  servePlain,
  startSettings,
  type FunctionHandle,
  type StartOptions,
} from '../lib/http.ts';
import { createLogger } from '../lib/log.ts';
import { senderGate } from '../lib/sender-gate.ts';
import { eventAuthFromEnv } from '../lib/senders.ts';
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
export async function start(opts: StartOptions = {}): Promise<FunctionHandle> {
  const { port: wanted, kubeconfig: kc, env } = startSettings(opts);
  const logger = opts.logger ?? createLogger('identity-status');
  const { concurrency, identitySelector } = statusConfigFromEnv(env);
  const senders = eventAuthFromEnv(env);
  const app = createApp();
  app.post(
    '/',
    // SPEC §12: only the function's own senders reach the handler; their body is read after.
    senderGate(kc, senders, logger),
    readEvents(),
    handleEvents({ kc, consumerKinds: consumerKindsFromEnv(env), concurrency, identitySelector, logger }),
  );
  return servePlain(app, logger, wanted, opts.host);
}
