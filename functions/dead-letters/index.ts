/**
 * dead-letters: the Broker's dead-letter sink (SPEC §12, §13). Knative sends it every event a
 * Trigger gave up on; it logs each one and counts it (`captf.dead_letters`), so an operator can
 * alert on them after its pod has scaled to zero. HTTP: `POST /` (CloudEvents, from its
 * senders only: lib/sender-gate.ts; on a cluster with `authentication-oidc` the Broker's filter
 * signs each dead letter as the Trigger that gave up), `GET /healthz`. Started by
 * `functions/main.ts dead-letters`.
 */
import { startEventFunction } from '../lib/event-function.ts';
import type { FunctionHandle, StartOptions } from '../lib/http.ts';
import { takeDeadLetters } from './handler.ts';

/**
 * Starts dead-letters.
 * @param opts port (0 = any free), host, kubeconfig (for the TokenReviews of its sender check),
 *   logger and env (see {@link StartOptions}).
 * @returns the running function.
 * @throws Error on bad configuration or a listen error.
 */
export function start(opts: StartOptions = {}): Promise<FunctionHandle> {
  return startEventFunction('dead-letters', opts, ({ logger }) => takeDeadLetters(logger));
}
