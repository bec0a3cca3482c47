/**
 * Deliveries signed as the functions' own Triggers sign them (SPEC §12), for callers that
 * deliver without Knative's Broker: the bench's fronts and rows, tests that post to a system's
 * functions, a pod on the node. The functions run with the sender check their Knative Services
 * ship, so an unsigned delivery is refused there as it is on a cluster.
 */
import { CoreV1Api, type KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import { EVENT_AUDIENCE_ENV, EVENT_SENDERS_ENV } from '../../functions/lib/senders.ts';
import { createOnce } from '../lib/kube.ts';
import { serviceAccountToken } from '../lib/serviceaccount.ts';
import { knativeContainer, type FunctionName } from './functions.ts';

/** The functions that take events. */
export type EventFunction = Extract<FunctionName, 'mirror-sync' | 'identity-status' | 'dead-letters'>;

/**
 * A delivery's `Authorization` header as Knative's Broker signs one, with no Broker, for function `fn` of the
 * rendered manifests: `Bearer <token>` of the first ServiceAccount its Knative Service lists in
 * {@link EVENT_SENDERS_ENV}, for the audience in {@link EVENT_AUDIENCE_ENV}. The account is made
 * when missing (on a cluster with Eventing, the Trigger reconciler makes it). The token is valid an hour.
 * @throws Error when the Service ships no sender check; the API error of a refused TokenRequest.
 */
export async function shippedSender(
  kc: KubeConfig,
  rendered: readonly KubernetesObject[],
  fn: FunctionName,
): Promise<string> {
  const env = new Map((knativeContainer(rendered, fn)?.env ?? []).map((e) => [e.name, e.value ?? '']));
  const audience = env.get(EVENT_AUDIENCE_ENV);
  const [, namespace, name] =
    /^system:serviceaccount:([^:]+):([^:*,]+)(,|$)/.exec(env.get(EVENT_SENDERS_ENV) ?? '') ?? [];
  if (!audience || !namespace || !name) throw new Error(`${fn} ships no audience or no ServiceAccount sender`);
  await createOnce(
    kc.makeApiClient(CoreV1Api).createNamespacedServiceAccount({ namespace, body: { metadata: { name } } }),
  );
  return `Bearer ${await serviceAccountToken(kc, { namespace, name, audience })}`;
}

/** How long a minted header is reused, in ms: half its token's hour, as Knative renews well before expiry. */
export const SIGNATURE_REUSE_MS = 30 * 60_000;

/**
 * {@link shippedSender} for each event function, minted once and renewed after
 * {@link SIGNATURE_REUSE_MS}, so a caller can sign every delivery of a long run.
 */
export function shippedSigner(
  kc: KubeConfig,
  rendered: readonly KubernetesObject[],
): (fn: EventFunction) => Promise<string> {
  const minted = new Map<EventFunction, { at: number; header: Promise<string> }>();
  return (fn) => {
    const last = minted.get(fn);
    if (last && Date.now() - last.at < SIGNATURE_REUSE_MS) return last.header;
    const header = shippedSender(kc, rendered, fn);
    minted.set(fn, { at: Date.now(), header });
    header.catch(() => minted.delete(fn));
    return header;
  };
}
