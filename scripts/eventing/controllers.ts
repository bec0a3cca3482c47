/**
 * A stand-in for the Knative Eventing controllers that do not run locally: from the applied
 * Broker, Triggers and PingSources it computes every field the data plane reads and the
 * controllers would have written (status through the status subresource, and the Broker's
 * InMemoryChannel with one subscriber per Trigger). Pure functions; scripts/eventing/dataplane.ts writes
 * their results. Each rule cites the upstream code (knative.dev/eventing v0.49.2, and
 * knative.dev/pkg for destination resolution) it follows; only what this project's manifests
 * use is supported (MTChannelBasedBroker on an InMemoryChannel, transport encryption off; each
 * Trigger gets its OIDC identity, so deliveries are signed, while no hop verifies one).
 */
import type { KubernetesObject } from '@kubernetes/client-node';
import { oidcServiceAccountName } from '../../functions/lib/senders.ts';

/** A `duckv1.Destination`: a reference and/or a URI. */
export interface Destination {
  ref?: { apiVersion?: string; kind: string; name: string; namespace?: string };
  uri?: string;
  /** The audience a delivery to it is signed for (knative.dev/pkg AddressableFromDestinationV1 keeps it). */
  audience?: string;
}

/** A `DeliverySpec` (eventing duck v1). */
export interface Delivery {
  deadLetterSink?: Destination;
  retry?: number;
  backoffPolicy?: string;
  backoffDelay?: string;
  timeout?: string;
  retryAfterMax?: string;
}

/** The parts of a Broker the stand-in reads. */
export type Broker = KubernetesObject & { spec?: { delivery?: Delivery } };
/** The parts of a Trigger the stand-in reads. */
export type Trigger = KubernetesObject & {
  spec: { broker: string; subscriber: Destination & { audience?: string }; delivery?: Delivery };
};
/** The parts of a PingSource the stand-in reads. */
export type PingSource = KubernetesObject & { spec: { sink: Destination; schedule: string } };

/** Resolves a destination's `ref` to a URL; throws for references it does not know. */
export type RefResolver = (ref: NonNullable<Destination['ref']>) => string;

/** Base URLs (`http://127.0.0.1:<port>`) of the ingress, the filter and the dispatcher. */
export interface DataPlaneAddresses {
  ingress: string;
  filter: string;
  dispatcher: string;
}

/** A condition as the controllers write it (knative.dev/pkg apis.Condition). */
export interface Condition {
  type: string;
  status: 'True';
  lastTransitionTime: string;
}

/** `Ready` and each dependent condition of a living condition set, all True. */
export function readyConditions(types: readonly string[], now: Date): Condition[] {
  const lastTransitionTime = now.toISOString().replace(/\.\d+Z$/, 'Z');
  return [...types, 'Ready'].map((type) => ({ type, status: 'True', lastTransitionTime }));
}

/** Dependent conditions of each kind (pkg/apis/…/*_lifecycle.go condition sets). */
export const CONDITIONS = {
  Broker: [
    'IngressReady',
    'TriggerChannelReady',
    'FilterReady',
    'Addressable',
    'DeadLetterSinkResolved',
    'EventPoliciesReady',
  ],
  InMemoryChannel: [
    'DispatcherReady',
    'ServiceReady',
    'EndpointsReady',
    'Addressable',
    'ChannelServiceReady',
    'DeadLetterSinkResolved',
    'EventPoliciesReady',
  ],
  Trigger: [
    'BrokerReady',
    'SubscriptionReady',
    'DependencyReady',
    'SubscriberResolved',
    'DeadLetterSinkResolved',
    'OIDCIdentityCreated',
  ],
  PingSource: ['SinkProvided', 'Deployed', 'OIDCIdentityCreated'],
} as const;

/**
 * A destination's URL, as knative.dev/pkg resolver URIResolver.AddressableFromDestinationV1:
 * the ref's address, with a relative `uri` resolved against it; or an absolute `uri` alone.
 * @throws Error for an absolute URI beside a ref, a relative URI alone, or neither.
 */
export function resolveDestination(dest: Destination, resolveRef: RefResolver): string {
  if (dest.ref) {
    const base = resolveRef(dest.ref);
    if (dest.uri === undefined) return base;
    if (URL.canParse(dest.uri))
      throw new Error('absolute URI is not allowed when Ref or [apiVersion, kind, name] exists');
    return new URL(dest.uri, base).toString();
  }
  if (dest.uri !== undefined && URL.canParse(dest.uri) && new URL(dest.uri).host) return dest.uri;
  throw new Error(dest.uri ? `URI is not absolute: ${dest.uri}` : 'destination missing Ref and URI');
}

/** The Broker's address: the shared ingress, path `/<namespace>/<name>` (pkg/reconciler/broker/broker.go httpAddress). */
export const brokerAddress = (a: DataPlaneAddresses, b: KubernetesObject): string =>
  `${a.ingress}/${b.metadata!.namespace}/${b.metadata!.name}`;

/**
 * The Broker's channel name, `<broker>-kne-trigger` (pkg/reconciler/broker/resources/channel.go
 * BrokerChannelName, kmeta.ChildName).
 * @throws Error when it would pass 63 characters (upstream then hashes; not needed here).
 */
export function channelName(broker: KubernetesObject): string {
  const name = `${broker.metadata!.name}-kne-trigger`;
  if (name.length > 63) throw new Error(`Broker name ${broker.metadata!.name} is too long for this stand-in`);
  return name;
}

/**
 * The channel's address on the dispatcher. Path-based (`/<namespace>/<name>`), which the
 * dispatcher routes by when the path is not `/` (pkg/channel/multichannelfanout
 * EventHandler.ServeHTTP), as upstream's HTTPS channel addresses do; upstream's HTTP address
 * routes by host name instead, which needs cluster DNS.
 */
export const channelAddress = (a: DataPlaneAddresses, namespace: string, name: string): string =>
  `${a.dispatcher}/${namespace}/${name}`;

/** The filter's URL for one Trigger, `/triggers/<ns>/<name>/<uid>` (pkg/reconciler/sugar/trigger/path Generate). */
export const filterUrl = (a: DataPlaneAddresses, t: KubernetesObject): string =>
  `${a.filter}/triggers/${t.metadata!.namespace}/${t.metadata!.name}/${t.metadata!.uid}`;

/**
 * The delivery a Trigger's Subscription gets: the Trigger's, or else the Broker's
 * (pkg/reconciler/broker/trigger/trigger.go subscribeToBrokerChannel).
 */
export const chosenDelivery = (t: Trigger, b: Broker): Delivery | undefined => t.spec.delivery ?? b.spec?.delivery;

/** The dead-letter sink a Trigger's dead letters go to: its own, or else the Broker's (trigger.go resolveDeadLetterSink). */
const triggerDeadLetterSink = (t: Trigger, b: Broker): Destination | undefined =>
  t.spec.delivery?.deadLetterSink ?? b.spec?.delivery?.deadLetterSink;

/** The Trigger's `status.deadLetterSinkUri`: {@link triggerDeadLetterSink} resolved. */
export function triggerDeadLetterSinkUri(t: Trigger, b: Broker, resolveRef: RefResolver): string | undefined {
  const dls = triggerDeadLetterSink(t, b);
  return dls ? resolveDestination(dls, resolveRef) : undefined;
}

/**
 * The channel subscriber's `delivery`. The Subscription's dead-letter sink is its delivery's,
 * or else the channel's (= the Broker's) (pkg/reconciler/subscription/subscription.go
 * resolveDeadLetterSink); retry, backoff and timeouts come from the Subscription's delivery
 * only (deliverySpec). So a Trigger with its own delivery but no sink still dead-letters to
 * the Broker's sink, with its own retry settings. A sink of the chosen delivery is the filter's
 * `…/dls` path, as the Trigger reconciler sets it with `authentication-oidc` (trigger.go
 * subscribeToBrokerChannel): the filter then sends the dead letter on to the Trigger's sink,
 * signed as the Trigger for the sink's audience (filter_handler.go handleDispatchToDLSRequest).
 */
export function subscriberDelivery(
  t: Trigger,
  b: Broker,
  { addresses, resolveRef }: { addresses: DataPlaneAddresses; resolveRef: RefResolver },
): Delivery | undefined {
  const chosen = chosenDelivery(t, b);
  if (!chosen) return undefined;
  const uri = chosen.deadLetterSink
    ? `${filterUrl(addresses, t)}/dls`
    : b.spec?.delivery?.deadLetterSink && resolveDestination(b.spec.delivery.deadLetterSink, resolveRef);
  const out: Delivery = uri ? { deadLetterSink: { uri } } : {};
  for (const k of ['retry', 'backoffPolicy', 'backoffDelay', 'timeout', 'retryAfterMax'] as const)
    if (chosen[k] !== undefined) Object.assign(out, { [k]: chosen[k] });
  return Object.keys(out).length ? out : undefined;
}

/**
 * One `spec.subscribers[]` entry of the Broker's channel for a Trigger (subscription.go
 * updateChannelAddSubscriptionSpec): the filter's URL as subscriber, the Broker's address as
 * reply (trigger.go: with OIDC off the reply is the Broker), and the delivery above. `uid` and
 * `generation` are the Trigger's: no Subscription object exists here.
 */
export function channelSubscriber(
  t: Trigger,
  b: Broker,
  { addresses, resolveRef }: { addresses: DataPlaneAddresses; resolveRef: RefResolver },
): Record<string, unknown> {
  const delivery = subscriberDelivery(t, b, { addresses, resolveRef });
  return {
    uid: t.metadata!.uid,
    generation: t.metadata!.generation ?? 1,
    subscriberUri: filterUrl(addresses, t),
    replyUri: brokerAddress(addresses, b),
    ...(delivery ? { delivery } : {}),
  };
}

/**
 * The annotation that makes an InMemoryChannel answer its sender before it delivers (each
 * event in the background); set on the Broker, copied to its channel. The manifests' Broker has it.
 */
export const ASYNC_HANDLER = 'messaging.knative.dev/async-handler';

/**
 * The Broker's InMemoryChannel as the Broker reconciler creates it (broker.go ReconcileKind):
 * owned by the Broker, labels TriggerChannelLabels, annotation `eventing.knative.dev/scope:
 * cluster` plus the Broker's `messaging.knative.dev/*` annotations (e.g. `async-handler`),
 * `spec.delivery` = the Broker's; and the subscribers the Subscription reconciler would add.
 */
export function brokerChannel(
  b: Broker,
  triggers: readonly Trigger[],
  ctx: { addresses: DataPlaneAddresses; resolveRef: RefResolver },
): KubernetesObject & { spec: Record<string, unknown> } {
  const { name, namespace, uid, annotations = {} } = b.metadata!;
  const messaging = Object.entries(annotations).filter(([k]) => k.startsWith('messaging.knative.dev'));
  return {
    apiVersion: 'messaging.knative.dev/v1',
    kind: 'InMemoryChannel',
    metadata: {
      name: channelName(b),
      namespace,
      labels: { 'eventing.knative.dev/broker': name!, 'eventing.knative.dev/brokerEverything': 'true' },
      annotations: { 'eventing.knative.dev/scope': 'cluster', ...Object.fromEntries(messaging) },
      ownerReferences: [
        { apiVersion: 'eventing.knative.dev/v1', kind: 'Broker', name: name!, uid: uid!, controller: true },
      ],
    },
    spec: {
      ...(b.spec?.delivery ? { delivery: b.spec.delivery } : {}),
      subscribers: triggers.filter((t) => t.spec.broker === name).map((t) => channelSubscriber(t, b, ctx)),
    },
  };
}

/** What the controllers write to each kind's status, with `Ready` and every dependent condition True. */
export interface StatusContext {
  addresses: DataPlaneAddresses;
  resolveRef: RefResolver;
  now: Date;
}

const observed = (o: KubernetesObject) => ({ observedGeneration: o.metadata!.generation ?? 1 });

/**
 * The InMemoryChannel's status (pkg/reconciler/inmemorychannel/controller/inmemorychannel.go
 * ReconcileKind): its address, its `spec.delivery` dead-letter sink resolved, Ready. The
 * dispatcher builds its handler only for a Ready channel whose observedGeneration is current
 * (InMemoryChannel.IsReady), and writes `status.subscribers` itself.
 */
export function channelStatus(
  imc: KubernetesObject & { spec: { delivery?: Delivery } },
  ctx: StatusContext,
): Record<string, unknown> {
  const dls = imc.spec.delivery?.deadLetterSink;
  return {
    ...observed(imc),
    address: { url: channelAddress(ctx.addresses, imc.metadata!.namespace!, imc.metadata!.name!) },
    ...(dls ? { deadLetterSinkUri: resolveDestination(dls, ctx.resolveRef) } : {}),
    conditions: readyConditions(CONDITIONS.InMemoryChannel, ctx.now),
  };
}

/**
 * The Broker's status (broker.go ReconcileKind): the channel's address and reference as status
 * annotations (the ingress answers 500 without `knative.dev/channelAddress`), its own address
 * (httpAddress), its resolved dead-letter sink, Ready.
 */
export function brokerStatus(b: Broker, imc: KubernetesObject, ctx: StatusContext): Record<string, unknown> {
  const dls = b.spec?.delivery?.deadLetterSink;
  return {
    ...observed(b),
    annotations: {
      'knative.dev/channelAddress': channelAddress(ctx.addresses, imc.metadata!.namespace!, imc.metadata!.name!),
      'knative.dev/channelAPIVersion': 'messaging.knative.dev/v1',
      'knative.dev/channelKind': 'InMemoryChannel',
      'knative.dev/channelName': imc.metadata!.name!,
    },
    address: { name: 'http', url: brokerAddress(ctx.addresses, b) },
    ...(dls ? { deadLetterSinkUri: resolveDestination(dls, ctx.resolveRef) } : {}),
    ...(dls?.audience ? { deadLetterSinkAudience: dls.audience } : {}),
    conditions: readyConditions(CONDITIONS.Broker, ctx.now),
  };
}

/**
 * A Trigger's status (trigger.go ReconcileKind): the subscriber's URL (the filter answers 404
 * without it) and audience (`spec.subscriber.audience`), the dead-letter sink
 * (resolveDeadLetterSink), Ready, and the OIDC identity Eventing gives it with
 * `authentication-oidc` on (pkg/auth/serviceaccount.go SetupOIDCServiceAccount: the account
 * {@link triggerServiceAccount} makes). The broker filter signs every delivery of a Trigger
 * that has both (filter_handler.go send, pkg/kncloudevents/event_dispatcher.go createRequest),
 * whatever the flag says; the local data plane keeps the flag off, so no hop verifies a token
 * (that would need the API server's OIDC discovery from these processes).
 */
export function triggerStatus(t: Trigger, b: Broker, ctx: StatusContext): Record<string, unknown> {
  const dls = triggerDeadLetterSink(t, b);
  const audience = t.spec.subscriber.audience;
  return {
    ...observed(t),
    subscriberUri: resolveDestination(t.spec.subscriber, ctx.resolveRef),
    ...(audience ? { subscriberAudience: audience } : {}),
    ...(dls ? { deadLetterSinkUri: resolveDestination(dls, ctx.resolveRef) } : {}),
    ...(dls?.audience ? { deadLetterSinkAudience: dls.audience } : {}),
    auth: { serviceAccountName: oidcServiceAccountName(t.metadata!.name!) },
    conditions: readyConditions(CONDITIONS.Trigger, ctx.now),
  };
}

/**
 * The OIDC ServiceAccount of a Trigger, as Eventing makes it (pkg/auth/serviceaccount.go
 * GetOIDCServiceAccountForResource): named by {@link oidcServiceAccountName}, in the Trigger's
 * namespace, controlled by the Trigger, labelled `eventing.knative.dev/oidc: enabled`.
 */
export function triggerServiceAccount(t: Trigger): KubernetesObject {
  const { name, namespace, uid } = t.metadata as { name: string; namespace: string; uid: string };
  return {
    apiVersion: 'v1',
    kind: 'ServiceAccount',
    metadata: {
      name: oidcServiceAccountName(name),
      namespace,
      ownerReferences: [
        {
          apiVersion: 'eventing.knative.dev/v1',
          kind: 'Trigger',
          name,
          uid,
          controller: true,
          blockOwnerDeletion: false,
        },
      ],
      annotations: { description: `Service Account for OIDC Authentication for Trigger "${name}"` },
      labels: { 'eventing.knative.dev/oidc': 'enabled' },
    },
  };
}

/**
 * A PingSource's status (pkg/reconciler/pingsource/pingsource.go ReconcileKind): the sink's
 * URL, the CloudEvent attributes it produces, Ready (mtping skips sources that are not ready).
 */
export function pingSourceStatus(p: PingSource, ctx: StatusContext): Record<string, unknown> {
  const { name, namespace } = p.metadata!;
  return {
    ...observed(p),
    sinkUri: resolveDestination(p.spec.sink, ctx.resolveRef),
    ceAttributes: [
      { type: 'dev.knative.sources.ping', source: `/apis/v1/namespaces/${namespace}/pingsources/${name}` },
    ],
    conditions: readyConditions(CONDITIONS.PingSource, ctx.now),
  };
}
