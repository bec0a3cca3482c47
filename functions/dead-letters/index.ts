/**
 * dead-letters: the Broker's dead-letter sink (SPEC §12, §13). Knative sends it every event a
 * Trigger gave up on; it logs each one and counts it (`captf.dead_letters`), so an operator can
 * alert on them after its pod has scaled to zero. HTTP: `POST /` (CloudEvents, from its
 * senders only: lib/sender-gate.ts; on a cluster with `authentication-oidc` the Broker's filter
 * signs each dead letter as the Trigger that gave up), `GET /healthz`. Started by
 * `functions/main.ts dead-letters`.
 */
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
import { takeDeadLetters } from './handler.ts';

/**
 * Starts dead-letters.
 * @param opts port (0 = any free), host, kubeconfig (for the TokenReviews of its sender check),
 *   logger and env (see {@link StartOptions}).
 * @returns the running function.
 * @throws Error on bad configuration or a listen error.
 */
export async function start(opts: StartOptions = {}): Promise<FunctionHandle> {
  const { port: wanted, kubeconfig: kc, env } = startSettings(opts);
  const logger = opts.logger ?? createLogger('dead-letters');
  const senders = eventAuthFromEnv(env);
  const app = createApp();
  app.post(
    '/',
    senderGate(kc, senders, logger),
    // Read as every event function reads its events: their types, size and JSON limits.
    readEvents(),
    takeDeadLetters(logger),
  );
  return servePlain(app, logger, wanted, opts.host);
}
