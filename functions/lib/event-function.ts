/**
 * The shell every event function shares (SPEC §12): `POST /` behind the function's sender check
 * (./sender-gate.ts, before any byte of the body is read), then its events read with the event
 * functions' limits (./http.ts `readEvents`), then its handler; `GET /healthz`; plain HTTP.
 */
import type { KubeConfig } from '@kubernetes/client-node';
import type { RequestHandler } from 'express';
import { createApp, readEvents, servePlain, startSettings, type FunctionHandle, type StartOptions } from './http.ts';
import { createLogger, type Logger } from './log.ts';
import { senderGate } from './sender-gate.ts';
import { eventAuthFromEnv } from './senders.ts';

/** What an event function's handler is made from. */
export interface EventFunctionSettings {
  kc: KubeConfig;
  env: NodeJS.ProcessEnv;
  logger: Logger;
}

/**
 * Starts event function `name` with the handler `handlerOf` makes.
 * @returns the running function.
 * @throws Error on bad configuration (the sender check's, or the handler's) or a listen error.
 */
export async function startEventFunction(
  name: string,
  opts: StartOptions,
  handlerOf: (s: EventFunctionSettings) => RequestHandler,
): Promise<FunctionHandle> {
  const { port, kubeconfig: kc, env } = startSettings(opts);
  const logger = opts.logger ?? createLogger(name);
  const handler = handlerOf({ kc, env, logger });
  const app = createApp();
  app.post('/', senderGate(kc, eventAuthFromEnv(env), logger), readEvents(), handler);
  return servePlain(app, logger, port, opts.host);
}
