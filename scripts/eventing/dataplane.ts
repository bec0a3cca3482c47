/**
 * Knative Eventing's broker data plane as local processes, for `npm start`, the end-to-end
 * tests and the bench: the MTChannelBasedBroker ingress and filter, the
 * InMemoryChannel dispatcher and the PingSource adapter (mtping) of knative.dev/eventing
 * v0.49.2 (built by scripts/eventing/build.ts), run against a kubeconfig with the rendered
 * Broker, Triggers and PingSources applied unchanged.
 *
 * No eventing controller or webhook runs: the fields they would write are written by a small
 * stand-in (scripts/eventing/controllers.ts, each rule citing its upstream code) through the
 * status subresource, with Knative Services (Serving does not run here) resolved to the URLs
 * of local processes. Retries, back-off, dead letters, filtering and ping schedules are all
 * Knative's own code. docs/eventing-dataplane.md has the picture, the ports and the caveats.
 */
import {
  CoreV1Api,
  CustomObjectsApi,
  KubernetesObjectApi,
  PatchStrategy,
  setHeaderOptions,
  type KubeConfig,
  type KubernetesObject,
} from '@kubernetes/client-node';
import { ensureEventingDataPlane, EVENTING_BINARIES, type EventingComponent } from './build.ts';
import {
  brokerAddress,
  brokerChannel,
  brokerStatus,
  channelStatus,
  pingSourceStatus,
  triggerServiceAccount,
  triggerStatus,
  type Broker,
  type DataPlaneAddresses,
  type Delivery,
  type PingSource,
  type RefResolver,
  type StatusContext,
  type Trigger,
} from './controllers.ts';
import {
  choosePorts,
  spawnComponent,
  startRefusingProxy,
  stopComponent,
  waitListening,
  type ComponentProcess,
  type DataPlanePorts,
  type EnvContext,
  type SpawnOptions,
} from './processes.ts';
import { relocate } from '../tools/kustomize.ts';
import { createOnce, serverSideApply } from '../lib/kube.ts';
import { sleep } from '../lib/wait.ts';

/** Where the data plane's ConfigMaps and leader-election Leases live, as in a real installation. */
export const SYSTEM_NAMESPACE = 'knative-eventing';
/** The type of the event sent through the Broker to check the data plane is ready (no Trigger of the manifests matches it). */
export const PROBE_EVENT_TYPE = 'io.captf.eventing-dataplane.probe';
/** Field manager of the applied objects, and of the fields the stand-in controllers write. */
const MANAGERS = { apply: 'captf-eventing', controllers: 'captf-eventing-controllers' } as const;
/** The components in start order. */
const COMPONENTS = Object.keys(EVENTING_BINARIES) as EventingComponent[];

/** Options of {@link startEventingDataPlane}. */
export interface EventingDataPlaneOptions {
  /** Kubeconfig file the processes use (its user needs what upstream's service accounts may do; admin is simplest). */
  kubeconfigPath: string;
  /** The same cluster, for applying objects and writing status. */
  kc: KubeConfig;
  /**
   * Rendered manifests (`render('manifests/overlays/…')`); only the Broker (exactly one),
   * Triggers and PingSources are used, unchanged except for the namespace and schedules.
   */
  objects: readonly KubernetesObject[];
  /** Namespace to move them into from `captf-system` (test isolation); default: where they are. */
  namespace?: string;
  /** URL of the local process standing in for each Knative Service a `ref` names (subscribers, dead-letter sinks). */
  sinks: Readonly<Record<string, string>>;
  /** PingSource name → schedule written over the applied object (e.g. `*\/2 * * * * *`: seconds work, no webhook checks them). */
  schedules?: Readonly<Record<string, string>>;
  /** Each process's log line as it comes (JSON from zap, mostly). */
  onLog?: (component: EventingComponent, line: string) => void;
  /** Build progress lines when the binaries are missing (default stderr). */
  onBuild?: (line: string) => void;
  /** Added to every process's environment (e.g. `{ GODEBUG: 'netdns=go+2' }`: Go logs each name lookup). */
  env?: Readonly<Record<string, string>>;
  /**
   * `config-observability`'s data (knative.dev/pkg/observability: `tracing-protocol`,
   * `tracing-endpoint`, `metrics-protocol`, …); default empty, upstream's defaults (nothing exported).
   */
  observability?: Readonly<Record<string, string>>;
  /**
   * Where the processes read their ConfigMaps and keep their Leases (default
   * {@link SYSTEM_NAMESPACE}): a test that changes `observability` uses one of its own, so the
   * data planes of other files sharing the control plane keep theirs.
   */
  systemNamespace?: string;
}

/** A running data plane. */
export interface EventingDataPlane {
  /** The Broker's address (`http://127.0.0.1:<ingress port>/<namespace>/<broker>`): sources send here. */
  brokerUrl: string;
  /** Namespace of the Broker, Triggers, PingSources and InMemoryChannel. */
  namespace: string;
  /** The objects as applied (with uid and generation) and the InMemoryChannel made for the Broker. */
  applied: { broker: Broker; triggers: Trigger[]; pingSources: PingSource[]; channel: KubernetesObject };
  /** Every port each process listens on (all interfaces). */
  ports: DataPlanePorts;
  /** Each component's last log lines (at most 5000). */
  logs: Record<EventingComponent, string[]>;
  /** `host:port` of each HTTPS request the processes made to a name off the machine, refused on loopback (their `HTTPS_PROXY`). */
  refused: readonly string[];
  /** Sends `signal` (default SIGKILL) to one component; resolves once it exited. */
  kill(component: EventingComponent, signal?: NodeJS.Signals): Promise<void>;
  /** Stops one component if running and starts it again on the same ports; resolves once the Broker delivers again. */
  restart(component: EventingComponent): Promise<void>;
  /** Stops every process (SIGTERM, SIGKILL after 3 s). Idempotent. The applied objects stay. */
  stop(): Promise<void>;
}

/**
 * Moves the rendered eventing objects from `captf-system` into `namespace` ({@link relocate}), and the
 * Trigger filters that name a PingSource's CloudEvent `source`
 * (`/apis/v1/namespaces/<ns>/pingsources/<name>`) along with them, since the source attribute
 * mtping sends names the namespace it runs in.
 */
export function relocateEventing<T extends KubernetesObject>(objects: readonly T[], namespace: string): T[] {
  const prefix = '/apis/v1/namespaces/captf-system/pingsources/';
  return relocate(objects, namespace).map((o) => {
    const attrs = (o as { spec?: { filter?: { attributes?: Record<string, string> } } }).spec?.filter?.attributes;
    if (o.kind === 'Trigger' && attrs?.source?.startsWith(prefix))
      attrs.source = `/apis/v1/namespaces/${namespace}/pingsources/${attrs.source.slice(prefix.length)}`;
    return o;
  });
}

/** Resolves Knative Service refs through `sinks` and Broker refs to the Broker's address. */
function refResolver(
  sinks: Readonly<Record<string, string>>,
  broker: Broker,
  addresses: DataPlaneAddresses,
): RefResolver {
  return (ref) => {
    if (ref.kind === 'Service' && ref.apiVersion?.startsWith('serving.knative.dev/')) {
      const url = sinks[ref.name];
      if (!url) throw new Error(`no URL for Knative Service "${ref.name}": add it to sinks`);
      return url;
    }
    if (ref.kind === 'Broker' && ref.name === broker.metadata!.name) return brokerAddress(addresses, broker);
    throw new Error(`cannot resolve ${ref.apiVersion} ${ref.kind} "${ref.name}" locally`);
  };
}

/** Creates a namespace unless it exists. */
const ensureNamespace = (kc: KubeConfig, name: string): Promise<void> =>
  createOnce(kc.makeApiClient(CoreV1Api).createNamespace({ body: { metadata: { name } } }));

/**
 * The feature flags the local data plane sets in `config-features` (every other flag keeps
 * upstream's default, pkg/apis/feature/features.go newDefaults). `delivery-retryafter` is what a
 * cluster operator enables so that Knative's webhook accepts `delivery.retryAfterMax`
 * (pkg/apis/duck/v1/delivery_types.go Validate; refused as a disallowed field otherwise), which
 * the manifests' `components/retry-after` sets on mirror-sync's Triggers: with it the dispatcher
 * waits as long as a 429 or 503 answer's `Retry-After` asks, up to that maximum
 * (pkg/kncloudevents/retries.go generateBackoffFn). The data plane itself reads only
 * `retryAfterMax`; the flag is set so the local installation is the one a cluster needs.
 */
export const LOCAL_FEATURES: Readonly<Record<string, string>> = { 'delivery-retryafter': 'enabled' };

/**
 * Creates the system namespace and its three ConfigMaps when missing (`config-logging` empty:
 * upstream defaults), applies `observability` to `config-observability` and
 * {@link LOCAL_FEATURES} to `config-features` (their other keys are left as they are).
 */
async function ensureSystemNamespace(
  kc: KubeConfig,
  namespace: string,
  observability: Readonly<Record<string, string>> = {},
): Promise<void> {
  await ensureNamespace(kc, namespace);
  const core = kc.makeApiClient(CoreV1Api);
  await createOnce(core.createNamespacedConfigMap({ namespace, body: { metadata: { name: 'config-logging' } } }));
  const configMap = (name: string, data: Readonly<Record<string, string>>) =>
    apply(kc, {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name, namespace },
      data: { ...data },
    } as KubernetesObject);
  await configMap('config-observability', observability);
  await configMap('config-features', LOCAL_FEATURES);
}

/** {@link serverSideApply} as the data plane's field manager. */
const apply = <T extends KubernetesObject>(kc: KubeConfig, obj: T): Promise<T> =>
  serverSideApply(kc, obj, MANAGERS.apply);

/** Writes `status` through the status subresource (server-side apply by the stand-in's field manager). */
async function writeStatus(kc: KubeConfig, obj: KubernetesObject, status: Record<string, unknown>): Promise<void> {
  const [group, version] = obj.apiVersion!.split('/') as [string, string];
  const plural = `${obj.kind!.toLowerCase()}s`;
  const { name, namespace } = obj.metadata as { name: string; namespace: string };
  const body = { apiVersion: obj.apiVersion, kind: obj.kind, metadata: { name, namespace }, status };
  await kc
    .makeApiClient(CustomObjectsApi)
    .patchNamespacedCustomObjectStatus(
      { group, version, namespace, plural, name, body, fieldManager: MANAGERS.controllers, force: true },
      setHeaderOptions('Content-Type', PatchStrategy.ServerSideApply),
    );
}

/** The Broker, Triggers and PingSources of `objects`, relocated when asked. @throws Error unless there is exactly one Broker. */
function eventingObjects(opts: EventingDataPlaneOptions) {
  const objects = opts.namespace ? relocateEventing(opts.objects, opts.namespace) : [...opts.objects];
  const of = <T>(kind: string) => objects.filter((o) => o.kind === kind) as unknown as T[];
  const brokers = of<Broker>('Broker');
  if (brokers.length !== 1) throw new Error(`expected exactly one Broker in the objects, found ${brokers.length}`);
  return { broker: brokers[0]!, triggers: of<Trigger>('Trigger'), pingSources: of<PingSource>('PingSource') };
}

/** Applies a PingSource, then writes a schedule override over it (a merge patch of the applied object). */
async function applyPingSource(kc: KubeConfig, p: PingSource, schedule: string | undefined): Promise<PingSource> {
  const applied = await apply(kc, p);
  if (schedule === undefined) return applied;
  const patch = { apiVersion: p.apiVersion, kind: p.kind, metadata: applied.metadata, spec: { schedule } };
  const api = KubernetesObjectApi.makeApiClient(kc);
  return (await api.patch(
    patch,
    undefined,
    undefined,
    MANAGERS.apply,
    undefined,
    PatchStrategy.MergePatch,
  )) as PingSource;
}

/**
 * Applies the Broker, Triggers, PingSources and the Broker's InMemoryChannel, then writes what
 * the controllers would (scripts/eventing/controllers.ts), in the order they would: the
 * channel's status, the Broker's, each Trigger's OIDC ServiceAccount and status, the PingSources'.
 */
async function applyAndWire(opts: EventingDataPlaneOptions, addresses: DataPlaneAddresses) {
  const { kc } = opts;
  const wanted = eventingObjects(opts);
  await ensureNamespace(kc, wanted.broker.metadata!.namespace!);
  const broker = await apply(kc, wanted.broker);
  const triggers: Trigger[] = [];
  for (const t of wanted.triggers) triggers.push(await apply(kc, t));
  const pingSources: PingSource[] = [];
  for (const p of wanted.pingSources)
    pingSources.push(await applyPingSource(kc, p, opts.schedules?.[p.metadata!.name!]));
  const resolveRef = refResolver(opts.sinks, broker, addresses);
  const channel = await apply(kc, brokerChannel(broker, triggers, { addresses, resolveRef }));
  const ctx: StatusContext = { addresses, resolveRef, now: new Date() };
  await writeStatus(kc, channel, channelStatus(channel, ctx));
  await writeStatus(kc, broker, brokerStatus(broker, channel, ctx));
  for (const t of triggers) {
    await apply(kc, triggerServiceAccount(t));
    await writeStatus(kc, t, triggerStatus(t, broker, ctx));
  }
  for (const p of pingSources) await writeStatus(kc, p, pingSourceStatus(p, ctx));
  return { broker, triggers, pingSources, channel };
}

/**
 * Sends a probe event (type {@link PROBE_EVENT_TYPE}, matched by no Trigger of the manifests)
 * to the Broker until the ingress answers 2xx: the ingress knows the Broker, the dispatcher
 * has its channel's handler and every Trigger's filter answered.
 * @throws Error with the last answer when `deadline` passes.
 */
async function probeBroker(brokerUrl: string, deadline: number): Promise<void> {
  for (let n = 1; ; n++) {
    const answer = await fetch(brokerUrl, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'ce-specversion': '1.0',
        'ce-id': `probe-${process.pid}-${n}`,
        'ce-source': 'captf/eventing-dataplane',
        'ce-type': PROBE_EVENT_TYPE,
      },
      body: '{}',
      signal: AbortSignal.timeout(5000),
    }).then(
      (res) => (res.ok ? undefined : `HTTP ${res.status}`),
      (err: Error) => err.message,
    );
    if (answer === undefined) return;
    if (Date.now() > deadline) throw new Error(`the Broker at ${brokerUrl} did not accept a probe event (${answer})`);
    await sleep(200);
  }
}

/** The running processes and how to start each one. */
class Processes {
  readonly procs = new Map<EventingComponent, ComponentProcess>();
  readonly logs = Object.fromEntries(COMPONENTS.map((c) => [c, [] as string[]])) as Record<EventingComponent, string[]>;
  readonly spawnOpts: Omit<SpawnOptions, 'logs'>;
  readonly ready: { brokerUrl: string; timeoutMs: number };

  constructor(spawnOpts: Omit<SpawnOptions, 'logs'>, ready: { brokerUrl: string; timeoutMs: number }) {
    this.spawnOpts = spawnOpts;
    this.ready = ready;
  }

  /** Starts `components`, waits until each listens, then until the Broker takes a probe event. */
  async start(components: readonly EventingComponent[]): Promise<void> {
    const deadline = Date.now() + this.ready.timeoutMs;
    for (const c of components) this.procs.set(c, await spawnComponent(c, { ...this.spawnOpts, logs: this.logs[c] }));
    for (const c of components)
      await waitListening(c, this.procs.get(c)!, { ports: this.spawnOpts.env.ports, logs: this.logs[c], deadline });
    await probeBroker(this.ready.brokerUrl, deadline);
  }

  async kill(component: EventingComponent, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const proc = this.procs.get(component);
    if (!proc || proc.child.exitCode !== null || proc.child.signalCode !== null) return;
    proc.child.kill(signal);
    await proc.exited;
  }

  async restart(component: EventingComponent): Promise<void> {
    const proc = this.procs.get(component);
    if (proc) await stopComponent(proc);
    await this.start([component]);
  }

  async stop(): Promise<void> {
    await Promise.all([...this.procs.values()].map((p) => stopComponent(p)));
  }
}

/** The API server's host name or address (brackets of an IPv6 address removed), for `NO_PROXY`. */
function apiServerHost(kc: KubeConfig): string | undefined {
  const server = kc.getCurrentCluster()?.server;
  return server ? new URL(server).hostname.replace(/^\[(.*)\]$/, '$1') : undefined;
}

/**
 * Starts Knative Eventing's broker data plane against a cluster (see the file comment): builds
 * the binaries and creates the system namespace, its ConfigMaps and the target namespace when
 * missing, applies the Broker, Triggers and PingSources of `objects` and the Broker's
 * InMemoryChannel, writes every field the eventing controllers would, starts the ingress,
 * filter, dispatcher and mtping on free ports (on this machine with `HTTPS_PROXY` a loopback
 * proxy that refuses everything: scripts/eventing/processes.ts startRefusingProxy), and
 * resolves once the Broker accepts events.
 * Needs the Eventing CRDs (scripts/controlplane/crds.ts installEventingCRDs).
 * @returns the running data plane; call `stop()` when done.
 * @throws Error when there is not exactly one Broker, a ref cannot be resolved (a Knative
 *   Service missing from `sinks`), the API server rejects an object, a port is taken, a
 *   process exits, or the Broker does not accept a probe event within 60 s. The
 *   processes started so far are stopped first.
 */
export async function startEventingDataPlane(opts: EventingDataPlaneOptions): Promise<EventingDataPlane> {
  const bins = await ensureEventingDataPlane(opts.onBuild);
  const systemNamespace = opts.systemNamespace ?? SYSTEM_NAMESPACE;
  await ensureSystemNamespace(opts.kc, systemNamespace, opts.observability);
  const ports = await choosePorts();
  const local = (p: number) => `http://127.0.0.1:${p}`;
  const addresses = {
    ingress: local(ports.http.ingress),
    filter: local(ports.http.filter),
    dispatcher: local(ports.http.dispatcher),
  };
  const applied = await applyAndWire(opts, addresses);
  const brokerUrl = brokerAddress(addresses, applied.broker);
  const proxy = await startRefusingProxy();
  const env: EnvContext = {
    kubeconfigPath: opts.kubeconfigPath,
    systemNamespace,
    ports,
    httpsProxy: proxy.url,
    noProxy: apiServerHost(opts.kc),
    extraEnv: opts.env,
  };
  const spawnOpts = { bins, env, onLog: opts.onLog };
  const procs = new Processes(spawnOpts, { brokerUrl, timeoutMs: 60_000 });
  const stop = () => procs.stop().then(() => proxy.close());
  try {
    await procs.start(COMPONENTS);
  } catch (err) {
    await stop();
    throw err;
  }
  return {
    brokerUrl,
    namespace: applied.broker.metadata!.namespace!,
    applied,
    ports,
    logs: procs.logs,
    refused: proxy.refused,
    kill: (c, signal) => procs.kill(c, signal),
    restart: (c) => procs.restart(c),
    stop,
  };
}

/** The delivery spec type, for callers that edit Triggers or the Broker before starting. */
export type { Delivery };
