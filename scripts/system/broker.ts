/**
 * Events as a cluster delivers them, on this machine: the rendered Broker `captf`, its
 * Triggers and PingSources on Knative Eventing's own data plane (scripts/eventing/: ingress,
 * in-memory channel, filter, mtping), fed by Knative's ApiServerSource adapter configured from
 * the rendered `captf-objects` ApiServerSource, with the Triggers' retries, back-off and
 * dead-letter sink. The Knative Services the Triggers and their dead-letter sink name resolve
 * to the functions on their loopback ports. Nothing here delivers, retries or
 * schedules an event itself.
 */
import { CoreV1Api, CustomObjectsApi, type KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import { oidcServiceAccountName } from '../../functions/lib/senders.ts';
import { EVENTING_BINARIES, type EventingComponent } from '../eventing/build.ts';
import { startEventingDataPlane, SYSTEM_NAMESPACE } from '../eventing/dataplane.ts';
import { sourceConfigFor, startApiServerSourceAdapter, type ApiServerSourceSpec } from '../eventing/adapter.ts';
import { createOnce } from '../lib/kube.ts';
import { serviceAccountToken } from '../lib/serviceaccount.ts';
import type { Steps } from '../lib/steps.ts';
import { sleep } from '../lib/wait.ts';
import { deploymentLog } from '../node/kubelet.ts';
import type { TestNode } from '../node/node.ts';
import { pingMessage, waitForWatchCaches, watchPaths } from '../local/events.ts';
import { adapterLine, dataPlaneLine, type Printed } from '../local/print.ts';

/** PingSource names, as in the manifests (manifests/base/eventing.yaml). */
export const PINGS = { status: 'captf-identity-status', resync: 'captf-resync' } as const;
/** Namespace of the Broker and the sources in the manifests. */
export const EVENTING_NAMESPACE = 'captf-system';
/** The ApiServerSource of the manifests. */
export const API_SOURCE = 'captf-objects';
/** The annotation `kubectl apply` keeps its last applied configuration in. */
const LAST_APPLIED = 'kubectl.kubernetes.io/last-applied-configuration';

/** What {@link startBroker} works with. */
export interface BrokerContext {
  kc: KubeConfig;
  /** The admin kubeconfig file (the data plane's processes). */
  kubeconfigPath: string;
  rendered: readonly KubernetesObject[];
  /** The functions the Triggers deliver to, and their dead-letter sink, by name. */
  subscribers: Record<'mirror-sync' | 'identity-status' | 'dead-letters', string>;
  /** The PingSources' schedules. */
  schedules: Record<keyof typeof PINGS, string>;
  /** The system's steps, where the undo of what starts here goes. */
  steps: Pick<Steps, 'defer'>;
  progress: (line: string) => void;
  emit: (component: string, raw: string, p: Printed | undefined) => void;
  /** `config-observability`'s data for the data plane (dataplane.ts); default none. */
  observability?: Readonly<Record<string, string>>;
}

/**
 * The Broker's data plane with the rendered Broker, Triggers and
 * PingSources, the Knative Services they name resolved to the functions. The data
 * plane's warnings and errors are printed (known start-up noise aside: print.ts dataPlaneLine),
 * the rest is debug.
 * @returns the Broker's address where the data plane runs (`url`) and from this machine (`hostUrl`),
 *   and the data plane's output (`logs`, one live array of lines per component).
 */
export async function startBroker(
  ctx: BrokerContext,
): Promise<{ url: string; logs: Record<EventingComponent, string[]> }> {
  await createNamespaceAsApplied(ctx.kc, ctx.rendered);
  ctx.progress("starting Knative's Broker data plane: broker-ingress, broker-filter, imc-dispatcher, mtping");
  const dp = await startEventingDataPlane({
    kubeconfigPath: ctx.kubeconfigPath,
    kc: ctx.kc,
    objects: ctx.rendered,
    sinks: {
      'captf-mirror-sync': ctx.subscribers['mirror-sync'],
      'captf-identity-status': ctx.subscribers['identity-status'],
      'captf-dead-letters': ctx.subscribers['dead-letters'],
    },
    schedules: { [PINGS.status]: ctx.schedules.status, [PINGS.resync]: ctx.schedules.resync },
    onLog: (component, line) => {
      const binary = EVENTING_BINARIES[component];
      ctx.emit(binary, line, dataPlaneLine(binary, line));
    },
    onBuild: ctx.progress,
    ...(ctx.observability ? { observability: ctx.observability } : {}),
  });
  ctx.steps.defer(() => dp.stop());
  return { url: dp.brokerUrl, logs: dp.logs };
}

/**
 * Creates the manifests' namespace, unless it exists, as `kubectl apply -k manifests/` would:
 * with the `kubectl.kubernetes.io/last-applied-configuration` annotation. The Broker lives
 * there, so it must exist before the data plane starts; created any other way, the quick
 * start's `kubectl apply -f examples/` (which also names it) would warn that the annotation
 * is missing.
 */
async function createNamespaceAsApplied(kc: KubeConfig, rendered: readonly KubernetesObject[]): Promise<void> {
  const ns = rendered.find((o) => o.kind === 'Namespace' && o.metadata?.name === EVENTING_NAMESPACE);
  if (!ns) throw new Error(`the rendered manifests hold no Namespace ${EVENTING_NAMESPACE}`);
  const annotations = { ...ns.metadata!.annotations, [LAST_APPLIED]: `${JSON.stringify(ns)}\n` };
  await createOnce(
    kc.makeApiClient(CoreV1Api).createNamespace({ body: { ...ns, metadata: { ...ns.metadata, annotations } } }),
  );
}

/** What {@link startAdapter} needs. */
export interface AdapterContext {
  kc: KubeConfig;
  /** The kubeconfig the adapter acts with. */
  kubeconfigPath: string;
  rendered: readonly KubernetesObject[];
  sink: string;
  steps: Pick<Steps, 'defer'>;
  emit: BrokerContext['emit'];
}

/**
 * Knative's ApiServerSource adapter, configured from the rendered `captf-objects`
 * ApiServerSource as Knative's controller would (scripts/eventing/adapter.ts sourceConfigFor),
 * sending to `sink`. Started once the API server can serve its watches, and waited for until
 * its first list is done: it is at-most-once, and objects created before then would produce
 * no event.
 */
export async function startAdapter(ctx: AdapterContext): Promise<void> {
  const spec = ctx.rendered.find((o) => o.kind === 'ApiServerSource' && o.metadata?.name === API_SOURCE);
  if (!spec) throw new Error(`the rendered manifests hold no ApiServerSource ${API_SOURCE}`);
  const source = await sourceConfigFor(ctx.kc, spec as unknown as ApiServerSourceSpec);
  await waitForWatchCaches(ctx.kc, watchPaths(source));
  const adapter = await startApiServerSourceAdapter({
    kubeconfigPath: ctx.kubeconfigPath,
    sink: ctx.sink,
    source,
    name: API_SOURCE,
    namespace: EVENTING_NAMESPACE,
    onLog: (l) => ctx.emit(`adapter ${API_SOURCE}`, l, adapterLine(API_SOURCE, l)),
  });
  ctx.steps.defer(() => adapter.stop());
  // startApiServerSourceAdapter resolves at the first STARTING line, before discovery;
  // the reflectors start after "Starting in … mode".
  const deadline = Date.now() + 30_000;
  while (!adapter.logs.some((l) => /Starting in (resilient|fail-fast) mode/.test(l)) && Date.now() < deadline)
    await sleep(50);
  // Their first list/watch round trip; objects created before it ends produce no event.
  await sleep(1000);
}

/**
 * POSTs the CloudEvent a PingSource tick sends to the Broker now, which routes it by the
 * Triggers like mtping's; resolves once the Broker answered. The manifests' Broker (async
 * handler) answers at once and delivers in the background; with a serial channel the answer
 * would come after the function answered or the event was dead-lettered.
 * @param authorization the `Authorization` header a Broker with sender identity needs.
 * @throws Error when the Broker does not answer 2xx.
 */
export async function ping(brokerUrl: string, which: keyof typeof PINGS, authorization?: string): Promise<void> {
  const status = await sendToBroker(brokerUrl, pingMessage(PINGS[which], EVENTING_NAMESPACE), authorization);
  if (status < 200 || status > 299) throw new Error(`the Broker answered HTTP ${status} to the ${PINGS[which]} ping`);
}

/** A binary-mode CloudEvent: its headers (`ce-*`, `content-type`) and body. */
export interface EventMessage {
  headers: Record<string, string>;
  body: string;
}

/**
 * POSTs one CloudEvent to the Broker, which routes it by the Triggers.
 * @param authorization the `Authorization` header a Broker with sender identity needs.
 * @returns the Broker's status.
 */
export async function sendToBroker(brokerUrl: string, msg: EventMessage, authorization?: string): Promise<number> {
  // Generous for a serial channel, which answers after the fan-out, retries included (31 s, or
  // 62 s when the dead-letter sink fails too).
  const res = await fetch(brokerUrl, {
    method: 'POST',
    headers: { ...msg.headers, ...(authorization ? { authorization } : {}) },
    body: msg.body,
    signal: AbortSignal.timeout(120_000),
  });
  await res.arrayBuffer();
  return res.status;
}

/** The Deployment of Knative's installation that runs each data-plane component (scripts/eventing/install.ts). */
const INSTALLED_DEPLOYMENTS: Readonly<Record<EventingComponent, string>> = {
  ingress: 'mt-broker-ingress',
  filter: 'mt-broker-filter',
  dispatcher: 'imc-dispatcher',
  mtping: 'pingsource-mt-adapter',
};

/**
 * The manifests' Broker as Knative Eventing's own installation on the node runs it: its address
 * from this machine (a forward to the `broker-ingress` Service, so kube-proxy picks the pod), a
 * PingSource tick through it ({@link ping}) signed as mtping signs it (a token of the
 * PingSource's OIDC ServiceAccount for the Broker's audience: the installation runs with sender
 * identity), and each data-plane component's output as the kubelet logged it (read afresh at
 * each access).
 * @param o.podLogs the kubelet's pod-log folder.
 * @throws Error when the `broker-ingress` Service has no ClusterIP.
 */
export async function installedBroker(
  node: TestNode,
  o: { kc: KubeConfig; rendered: readonly KubernetesObject[]; podLogs: string },
): Promise<{
  url: string;
  ping(which: keyof typeof PINGS): Promise<void>;
  send(msg: EventMessage): Promise<number>;
  logs: Record<EventingComponent, string[]>;
}> {
  const svc = await o.kc
    .makeApiClient(CoreV1Api)
    .readNamespacedService({ namespace: SYSTEM_NAMESPACE, name: 'broker-ingress' });
  const ip = svc.spec?.clusterIP;
  if (!ip || ip === 'None') throw new Error(`Service ${SYSTEM_NAMESPACE}/broker-ingress has no ClusterIP`);
  const port = await node.forward({ host: ip, port: 80 });
  const broker = o.rendered.find((x) => x.kind === 'Broker')!.metadata!;
  const url = `http://127.0.0.1:${port}/${broker.namespace}/${broker.name}`;
  const logs = {} as Record<EventingComponent, string[]>;
  for (const [c, deployment] of Object.entries(INSTALLED_DEPLOYMENTS))
    Object.defineProperty(logs, c, {
      enumerable: true,
      get: () => deploymentLog(o.podLogs, SYSTEM_NAMESPACE, deployment),
    });
  const signedAs = async (which: keyof typeof PINGS) =>
    `Bearer ${await pingSourceToken(o.kc, broker as { name: string; namespace: string }, PINGS[which])}`;
  return {
    url,
    ping: async (which) => ping(url, which, await signedAs(which)),
    send: async (msg) => sendToBroker(url, msg, await signedAs('resync')),
    logs,
  };
}

/**
 * A token of PingSource `source`'s OIDC ServiceAccount (made by Knative's PingSource
 * reconciler) for the Broker's audience (its `status.address.audience`), as mtping mints one.
 * @throws Error when the Broker announces no audience or the TokenRequest fails.
 */
async function pingSourceToken(
  kc: KubeConfig,
  broker: { name: string; namespace: string },
  source: string,
): Promise<string> {
  const stored = (await kc.makeApiClient(CustomObjectsApi).getNamespacedCustomObject({
    group: 'eventing.knative.dev',
    version: 'v1',
    namespace: broker.namespace,
    plural: 'brokers',
    name: broker.name,
  })) as { status?: { address?: { audience?: string } } };
  const audience = stored.status?.address?.audience;
  if (!audience)
    throw new Error(`Broker ${broker.namespace}/${broker.name} announces no audience (sender identity off?)`);
  return serviceAccountToken(kc, {
    namespace: broker.namespace,
    name: oidcServiceAccountName(source, 'PingSource', 'sources.knative.dev'),
    audience,
  });
}

/**
 * What Knative's broker-filter logs for each delivery a subscriber answered non-2xx or did not
 * answer (`pkg/broker/filter/filter_handler.go`, v0.49.2; the channel then retries it).
 */
export const FAILED_DELIVERY = 'failed to send event';

/**
 * The failed deliveries among broker-filter's log `lines`, counted by their error (the zap
 * line's `error`, addresses elided, at most 160 characters): what a timed-out wait reports.
 */
export function failedDeliveries(lines: readonly string[]): { count: number; kinds: Record<string, number> } {
  const kinds: Record<string, number> = {};
  let count = 0;
  for (const line of lines) {
    if (!line.includes(FAILED_DELIVERY)) continue;
    count++;
    let error = line;
    try {
      const parsed = JSON.parse(line.slice(line.indexOf('{'))) as { error?: unknown };
      if (typeof parsed.error === 'string') error = parsed.error;
    } catch {
      // not JSON: the line itself
    }
    const kind = error.replace(/https?:\/\/\S+/g, '<url>').slice(0, 160);
    kinds[kind] = (kinds[kind] ?? 0) + 1;
  }
  return { count, kinds };
}
