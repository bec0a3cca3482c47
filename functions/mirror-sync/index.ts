/**
 * mirror-sync: the per-object credential mirror (SPEC §3–§8, §12). `POST /` takes
 * CloudEvents (ApiServerSource, PingSource) from its senders only (lib/sender-gate.ts), `POST /prepare` answers the provider's
 * manager before a Job starts (its caller authenticated and authorized first: prepare-gate.ts),
 * `GET /healthz`. Started by `functions/main.ts mirror-sync`.
 */
import { discoverConsumerKinds, kindName, setPageSizeFromEnv } from '../lib/consumers.ts';
import {
  createApp,
  JSON_TYPES,
  readBody,
  readEvents,
  sendOutcome,
  servePlain,
  startSettings,
  type FunctionHandle,
  type StartOptions,
} from '../lib/http.ts';
import { makeClients } from '../lib/kube.ts';
import { createLogger } from '../lib/log.ts';
import { senderGate } from '../lib/sender-gate.ts';
import { eventAuthFromEnv } from '../lib/senders.ts';
import { prepareAuthFromEnv } from './authorize.ts';
import type { ReconcileDeps } from './act.ts';
import { MirrorSyncHandler, type EventConfig } from './handler.ts';
import { prepare } from './prepare.ts';
import { PrepareGate, type Caller } from './prepare-gate.ts';
import { SINK_TOKEN_FILE } from './resync.ts';
import { Scheduler } from './scheduler.ts';

/** Default keys reconciled at once per request (fan-out, resync). */
export const DEFAULT_CONCURRENCY = 8;

/**
 * Reads mirror-sync's configuration from the environment: `CAPTF_CONCURRENCY`,
 * `CAPTF_SOURCE_SECRET_EVENTS`, `K_SINK`, and `CAPTF_SINK_TOKEN_FILE` (the token that signs
 * events to `K_SINK`; default {@link SINK_TOKEN_FILE}, where a SinkBinding mounts it).
 * @throws Error naming the bad variable.
 */
export function configFromEnv(env: NodeJS.ProcessEnv): EventConfig {
  const raw = env.CAPTF_CONCURRENCY ?? String(DEFAULT_CONCURRENCY);
  const concurrency = Number(raw);
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 256)
    throw new Error(`CAPTF_CONCURRENCY=${raw} must be an integer from 1 to 256`);
  const flag = env.CAPTF_SOURCE_SECRET_EVENTS ?? 'false';
  if (flag !== 'true' && flag !== 'false') throw new Error(`CAPTF_SOURCE_SECRET_EVENTS=${flag} must be true or false`);
  return { concurrency, ...sinkFromEnv(env), sourceSecretEvents: flag === 'true' };
}

/** `K_SINK` (a URL, or unset) and the token file that signs events to it. @throws TypeError on a bad URL. */
function sinkFromEnv(env: NodeJS.ProcessEnv): { sink?: string; sinkTokenFile: string } {
  const sink = env.K_SINK || undefined;
  if (sink) new URL(sink);
  return { ...(sink ? { sink } : {}), sinkTokenFile: env.CAPTF_SINK_TOKEN_FILE || SINK_TOKEN_FILE };
}

/**
 * Starts mirror-sync's HTTP server.
 * @returns the running function. @throws Error on bad configuration or a failed listen.
 */
export async function start(opts: StartOptions = {}): Promise<FunctionHandle> {
  const { port: wanted, kubeconfig, env } = startSettings(opts);
  const logger = opts.logger ?? createLogger('mirror-sync');
  const cfg = configFromEnv(env);
  const senders = eventAuthFromEnv(env);
  setPageSizeFromEnv(env);
  // Configured kinds' scopes first: a cluster-scoped kind is never listed in a namespace.
  const kinds = await discoverConsumerKinds(makeClients(kubeconfig, undefined, logger), env);
  logger.info('consumer kinds', {
    kinds: kinds.map((k) => `${kindName(k)}/${k.plural} (${k.namespaced === false ? 'cluster-scoped' : 'namespaced'})`),
  });
  const deps: ReconcileDeps = { kc: kubeconfig, kinds, logger };
  // The process's one queue of work, shared by events and prepare.
  const scheduler = new Scheduler(deps, cfg);
  const handler = new MirrorSyncHandler(deps, scheduler, cfg);
  // SPEC §5: the caller's token is checked before the body is read; the SubjectAccessReview
  // for the named object comes before anything about the object is read.
  const gate = new PrepareGate(kubeconfig, prepareAuthFromEnv(env), logger);
  const app = createApp();
  // SPEC §12: only the function's own senders reach the handler; their body is read after.
  app.post('/', senderGate(kubeconfig, senders, logger), readEvents(), handler.handle);
  app.post('/prepare', gate.authenticate, readBody({ types: JSON_TYPES }), async (req, res) => {
    const caller = res.locals.caller as Caller;
    const body = typeof req.body === 'string' ? req.body : '';
    sendOutcome(res, await prepare(deps, scheduler, body, (kind, r) => gate.authorize(caller, kind, r)));
  });
  return servePlain(app, logger, wanted, opts.host);
}
