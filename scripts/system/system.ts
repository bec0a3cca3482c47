/**
 * The one way to start the world on this machine (SPEC §14), for `npm start`, the demo, the
 * bench, the soak and the tests: a control plane (started here, or a cluster the caller named)
 * with the CRDs, then, as the options ask, the four functions (from source or as the
 * production bundles, as admin or each as the least-privileged user of its ServiceAccount),
 * the admission webhook's registration, and events: the manifests' Broker, Triggers and
 * PingSources on Knative's own data plane fed by Knative's ApiServerSource adapter (./broker.ts),
 * or the bench's switchable delivery paths (scripts/bench/paths.ts). Without `serving` a
 * Knative Service is a process on a loopback port; with it, the manifests' Knative Services run
 * on Knative Serving on a real node (./serving.ts) and the Broker's data plane runs there too.
 *
 * {@link startSystem} reads as its list of named steps (scripts/lib/steps.ts), each leaving
 * its undo on one stack, which `stop()` (and any failed or aborted start) runs in reverse. A
 * new part of the world is one more option and one more step.
 */
import { mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { AppsV1Api, KubeConfig, VersionApi, type KubernetesObject } from '@kubernetes/client-node';
import { describeError } from '../../functions/lib/api-errors.ts';
import { DEFAULT_DRAIN_SECONDS } from '../../functions/lib/http.ts';
import { EventPaths } from '../bench/paths.ts';
import { startControlPlane, type ControlPlane } from '../controlplane/controlplane.ts';
import { applyCRDs, EVENTING_CRDS, installCRDs, loadThirdPartyCRDs } from '../controlplane/crds.ts';
import { shippedSigner, type EventFunction } from './senders.ts';
import { createWebhookPair } from '../controlplane/pki.ts';
import { ensureEventingDataPlane, type EventingComponent } from '../eventing/build.ts';
import { ensureApiServerSourceAdapter } from '../eventing/adapter.ts';
import type { FunctionProcess } from '../lib/process.ts';
import { Steps } from '../lib/steps.ts';
import { bothSettled, firstLine } from '../lib/wait.ts';
import { startNode, type TestNode } from '../node/node.ts';
import { startNodeRegistry, type NodeRegistry } from '../node/registry.ts';
import { installEventing } from '../eventing/install.ts';
import { startServing, type KnativeServing } from '../serving/serving.ts';
import { cronSchedule } from '../local/events.ts';
import { watchMirrors } from '../local/mirrors.ts';
import { watchScale } from '../local/scale.ts';
import { LogPrinter, type Printed } from '../local/print.ts';
import { ensureKustomize, render } from '../tools/kustomize.ts';
import {
  EVENTING_NAMESPACE,
  installedBroker,
  PINGS,
  ping,
  sendToBroker,
  startAdapter,
  startBroker,
  type EventMessage,
} from './broker.ts';
import {
  FUNCTION_NAMES,
  buildFunctions,
  functionEnv,
  startFunction,
  type FunctionName,
  type FunctionsBuild,
  type FunctionsFrom,
} from './functions.ts';
import { installPrepareCaller, serviceAccountUsers, type Actor } from './users.ts';
import { WEBHOOK_CONFIGURATION, registerWebhook } from './webhook.ts';
import { deployOnServing, renderForServing, withFunctionEnv, type ServedFunctions } from './serving.ts';
import { startObservability, type Observability } from '../observability/stack.ts';

export { FUNCTION_NAMES, type FunctionName } from './functions.ts';
export { PINGS } from './broker.ts';

/**
 * The kustomization the system runs (scripts/system/manifests/): every function a Knative
 * Service, with `Retry-After` honoured on mirror-sync's Triggers
 * (`components/retry-after`; the local data plane enables the feature flag it needs,
 * scripts/eventing/dataplane.ts `LOCAL_FEATURES`). Its CRDs are installed on their own
 * (scripts/controlplane/crds.ts), so {@link RunningSystem.rendered} leaves them out: the
 * namespace, RBAC, Knative Services, eventing and webhook objects.
 */
export const MANIFESTS = 'scripts/system/manifests';

/** Options of {@link startSystem}; without any but `dir` and `progress`: a control plane with the CRDs. */
export interface SystemOptions {
  /** State folder: the control plane's (wiped on start), webhook certificates, function logs. */
  dir: string;
  /** Progress lines while starting (builds, control plane) and stopping. */
  progress: (line: string) => void;
  /**
   * A running cluster instead of a control plane started here. Nothing is written into it
   * unless `install`: the CRDs, with `events: 'broker'` Knative's Broker, Triggers, PingSources,
   * InMemoryChannel and namespace `knative-eventing`, and the webhook when it is on loopback.
   */
  cluster?: { kubeconfig: string; install: boolean } | undefined;
  /** Size at which the control plane's audit log rotates, in MB (the bench reads one unrotated log). */
  auditLogMaxSizeMB?: number;
  /**
   * Start a real node (scripts/node/node.ts): the control plane runs inside its namespaces and
   * pods run on its kubelet; the host still reaches the API server on 127.0.0.1. Needs root.
   */
  node?: boolean;
  /** With `node`: the node enforces NetworkPolicy (scripts/node/netpol.ts). */
  networkPolicies?: boolean;
  /**
   * Knative Serving on a node (implies `node`): the functions run as the manifests' Knative
   * Services from the product image (./serving.ts), beside Knative Eventing's own installation
   * (`events: 'knative'`, required), which delivers to the Knative Services' addresses.
   * `functions` and `webhook` do not apply.
   */
  serving?: boolean;
  /**
   * With `serving`: apply the product's manifests onto it (default true). `false` leaves the
   * cluster as a user meets theirs before installing: Serving, Eventing, cert-manager's
   * stand-in, and none of the project's objects, CRDs included.
   */
  product?: boolean;
  /** A registry on the node (scripts/node/registry.ts), `localhost:<port>` from this machine and from the node. */
  registry?: boolean;
  /**
   * With `serving`: Prometheus and Jaeger inside the node (scripts/observability/stack.ts),
   * with Knative Serving's and Eventing's `config-observability` pointed at them before their
   * components start, and the functions' pods with the shipped component's settings pushing
   * there; {@link RunningSystem.observability} reaches both from this machine.
   */
  observability?: boolean;
  /** Run the functions from source or as the production bundles; absent: no functions. */
  functions?: FunctionsFrom;
  /**
   * `admin` (default): every part acts with the cluster's kubeconfig. `service-accounts`
   * (control plane started here only): each function and the event source is its own user,
   * bound to the roles the manifests give its ServiceAccount (./users.ts).
   */
  users?: 'admin' | 'service-accounts';
  /** Environment added to a function's (e.g. a scope that keeps it off other tests' objects). */
  env?: Partial<Record<FunctionName, Record<string, string>>>;
  /** With `events: 'broker'`: Knative's `config-observability` for its data plane (where its spans and metrics go). */
  knativeObservability?: Readonly<Record<string, string>>;
  /**
   * `broker`: the manifests' Broker and sources (./broker.ts); `fronts`: the bench's delivery
   * paths; `knative` (with `serving` only): Knative Eventing's own installation on the node
   * (scripts/eventing/install.ts) reconciles the manifests' Broker, Triggers, PingSources and
   * ApiServerSource as a cluster's does (no `broker` handle); absent: none.
   */
  events?: 'broker' | 'fronts' | 'knative';
  /** PingSource intervals in ms (default 5 and 10 minutes); each must be a PingSource schedule ({@link cronSchedule}). */
  pings?: { statusEveryMs?: number | undefined; resyncEveryMs?: number | undefined };
  /** Register the admission webhook when the API server is on this machine (it could not call it otherwise). */
  webhook?: boolean;
  /** Install the provider's manager allowed to call prepare (control plane started here only). */
  prepareCaller?: boolean;
  /** Readable lines: the functions', the data plane's, dead letters and mirror changes (debug ones too). */
  print?: (p: Printed) => void;
  /** Every raw output line of the functions and Knative's processes, before printing. */
  onRawLine?: (component: string, line: string) => void;
  /** Aborts a start (a Ctrl-C): what was started is stopped, then `startSystem` throws the abort reason. */
  signal?: AbortSignal;
}

/** The running system. */
export interface RunningSystem {
  dir: string;
  kubeconfigPath: string;
  kc: KubeConfig;
  /** API server URL. */
  server: string;
  /** Set when the control plane was started here. */
  controlPlane?: ControlPlane;
  /** With `node`: the node, where pods run. */
  node?: TestNode;
  /**
   * With `serving`: where Serving came from, the Knative Services' addresses, the way to them,
   * and the CA their `https://` addresses chain to.
   */
  serving?: ServedFunctions & { sources: string[]; caPem: string };
  /** With `registry`: the node's registry. */
  registry?: NodeRegistry | undefined;
  /** The rendered {@link MANIFESTS}. */
  rendered: readonly KubernetesObject[];
  /** The first instance of each function; empty when the options ask for none. */
  functions: Record<FunctionName, FunctionProcess>;
  /** Starts another instance of a function (its environment plus `extra`), stopped with the system. */
  startFunction(name: FunctionName, extra?: NodeJS.ProcessEnv): Promise<FunctionProcess>;
  /** The environment a function is started with (for callers that spawn their own). */
  functionEnv(name: FunctionName): NodeJS.ProcessEnv;
  /**
   * The `Authorization` header of a delivery to an event function, as its Triggers' deliveries
   * carry it (senders.ts `shippedSigner`): the functions check senders as shipped, so whoever
   * posts events to them without the Broker signs them with this.
   */
  sign(fn: EventFunction): Promise<string>;
  /** The functions' entrypoint (`functions/main.ts`, or the bundle's `main.mjs`). */
  main: string;
  /** PEM of the CA that signed admission's serving certificate. */
  webhookCaPem: string;
  /** Whether the ValidatingWebhookConfiguration was registered. */
  webhook: boolean;
  /**
   * With `events: 'broker'`, or `'knative'` with the product on Serving: the Broker's address
   * from this machine, the schedules mtping runs, a ping now, and the data plane's output.
   */
  broker?: {
    url: string;
    schedules: Record<keyof typeof PINGS, string>;
    /** {@link ping}: a PingSource tick's CloudEvent through the Broker. @throws Error on a non-2xx. */
    ping(which: keyof typeof PINGS): Promise<void>;
    /**
     * {@link sendToBroker}: any CloudEvent through the Broker, sent as the resync PingSource
     * sends (the Broker takes events from its sources only). @returns the Broker's status.
     */
    send(msg: EventMessage): Promise<number>;
    /** The data plane's output so far, one array of lines per component (live: it grows). */
    logs: Readonly<Record<EventingComponent, readonly string[]>>;
  };
  /** With `events: 'fronts'`: the bench's delivery paths. */
  eventPaths?: EventPaths;
  /** The ServiceAccount playing the provider's manager, allowed to call prepare. */
  prepareCaller?: { namespace: string; name: string };
  /** With `observability`: the receivers inside the node, reached from this machine. */
  observability?: Observability;
  /** Stops everything this call started, in reverse order; idempotent. */
  stop(): Promise<void>;
}

/** What the steps share: the options, the steps with their undo stack, where lines go. */
interface Startup {
  opts: SystemOptions;
  /** The start's named steps; each one's undo actions, run in reverse by `stop()`. */
  steps: Steps;
  printer: LogPrinter;
  /** A raw line of `component`, and what to print for it. */
  emit: (component: string, raw: string, p: Printed | undefined) => void;
}

/** The cluster the system runs against. */
interface Cluster {
  controlPlane: ControlPlane | undefined;
  node?: TestNode;
  kubeconfigPath: string;
  kc: KubeConfig;
  server: string;
}

/**
 * Starts the system the options describe, step by step: the tools it needs (built when
 * missing), the control plane while the manifests are rendered, the functions' build, the
 * CRDs, the users, the functions, the webhook registration, the events, the prepare caller
 * and the mirror watch.
 * @returns the running system; call `stop()` to end it.
 * @throws Error saying which step failed; everything started before it is stopped first.
 *   Before anything starts: a named cluster written into without `install`, or a ping
 *   interval that is no PingSource schedule.
 */
export async function startSystem(options: SystemOptions): Promise<RunningSystem> {
  const opts = resolvePaths(options);
  const schedules = checkOptions(opts);
  const s = newStartup(opts);
  const run = s.steps.run.bind(s.steps);
  return s.steps.attempt(async () => {
    await run('tools', () => buildTools(s));
    const [rendered, cluster] = await run('control plane and manifests', () =>
      bothSettled(renderManifests(s), connectCluster(s)),
    );
    const { serving, registry, observability } = await run('on the node', () => startOnNode(s, cluster));
    // After the control plane: it wipes the state folder the bundles are built into.
    const build = await run('functions build', () => buildFunctions(opts.functions ?? 'source', opts.dir));
    const eventingCRDs = await run('CRDs', () => installAllCRDs(s, cluster));
    const users = await run('users', () => actors(s, cluster, rendered));
    const tls = await run('webhook certificate', () =>
      createWebhookPair(join(opts.dir, 'webhook-pki'), 'captf-local-webhook-ca'),
    );
    const sign = shippedSigner(cluster.kc, rendered);
    const env = (name: FunctionName) =>
      functionEnv(name, { build, kubeconfig: users[name], leaf: tls.leaf, rendered, extra: opts.env?.[name] });
    const start = instanceStarter(s, { build, env, caPem: tls.caPem });
    const functions = await run('functions', () => startFunctions(s, start));
    const webhook = await run('webhook registration', () => registerLocalWebhook(s, cluster, functions, tls.caPem));
    await run('Eventing CRDs', () => eventingCRDs.installed);
    const served = await run('product on Serving', () =>
      deployFunctionsOnServing(s, { cluster, serving, rendered, schedules, observability }),
    );
    const events = await run('events', () =>
      startEvents(s, { cluster, rendered, functions, users, schedules, sign, ...(served ? { served } : {}) }),
    );
    const prepareCaller = await run(
      'prepare caller',
      async () => opts.prepareCaller && cluster.controlPlane && installPrepareCaller(cluster.kc, rendered),
    );
    await run('printing', () => watchForPrinting(s, cluster.kc, served !== undefined));
    return {
      dir: opts.dir,
      kubeconfigPath: cluster.kubeconfigPath,
      kc: cluster.kc,
      server: cluster.server,
      ...(cluster.controlPlane ? { controlPlane: cluster.controlPlane } : {}),
      ...(cluster.node ? { node: cluster.node } : {}),
      ...(served ? { serving: served } : {}),
      registry,
      rendered,
      functions,
      startFunction: start,
      functionEnv: env,
      sign,
      main: build.main,
      webhookCaPem: tls.caPem,
      webhook,
      ...events,
      ...(prepareCaller ? { prepareCaller } : {}),
      ...(observability ? { observability } : {}),
      stop: () => s.steps.stop(),
    };
  });
}

/** With `print`, lines for the mirrors' changes and, with Serving, the functions' scale. */
async function watchForPrinting(s: Startup, kc: KubeConfig, serving: boolean): Promise<void> {
  const print = s.opts.print;
  if (!print) return;
  s.steps.defer(await watchMirrors(kc, (p) => p && print(p)));
  if (serving) s.steps.defer(await watchScale(kc, EVENTING_NAMESPACE, print));
}

/** Why a named cluster needs `install` for events. */
const NAMED_CLUSTER_NEEDS_INSTALL =
  "events flow through Knative's Broker, which runs on this machine against the cluster and so writes " +
  "into it: the project's and Knative Eventing's CRDs, the manifests' Broker, Triggers and PingSources, an " +
  'InMemoryChannel and namespace knative-eventing. Nothing is written into a cluster you named unless you ' +
  'add --install';

/** The options with `dir` and a named kubeconfig absolute: the functions run in the repository's folder. */
function resolvePaths(opts: SystemOptions): SystemOptions {
  const cluster = opts.cluster && { ...opts.cluster, kubeconfig: resolve(opts.cluster.kubeconfig) };
  return { ...opts, dir: resolve(opts.dir), cluster };
}

/**
 * @returns the PingSources' schedules.
 * @throws Error for options that cannot work together, or an interval no PingSource can run.
 */
function checkOptions(opts: SystemOptions): Record<keyof typeof PINGS, string> {
  checkServing(opts);
  if ((opts.events || opts.webhook) && !opts.functions && !opts.serving)
    throw new Error("events and the webhook are delivered to the functions: add functions: 'source' or 'bundles'");
  if (opts.node && opts.webhook)
    throw new Error(
      "the webhook cannot be registered with node: the API server runs inside the node's network namespace and cannot call a function on the host's loopback",
    );
  if (opts.cluster) checkNamedCluster(opts, opts.cluster.install);
  return pingSchedules(opts.pings);
}

/** Options that cannot go together: when each test holds, what to say. */
const OPTION_CONFLICTS: readonly [(o: SystemOptions) => boolean, string][] = [
  [
    (o) => o.events === 'knative' && !o.serving,
    "events: 'knative' installs Knative Eventing on the node Serving runs on: add serving",
  ],
  [(o) => o.product === false && !o.serving, 'product: false leaves Serving empty: add serving'],
  [(o) => !!o.registry && !o.node && !o.serving, 'registry runs on the node: add node or serving'],
  [(o) => !!o.observability && !o.serving, 'observability runs inside the Serving node: add serving'],
  [
    (o) => !!o.networkPolicies && !o.node && !o.serving,
    'networkPolicies are enforced on the node: add node or serving',
  ],
  [
    (o) => !!o.serving && (!!o.functions || !!o.webhook || o.events !== 'knative'),
    "with serving the functions are Knative Services from the image, events come through Knative Eventing installed beside it, and the webhook is the manifests' own, through Knative: set events: 'knative', leave functions and webhook out",
  ],
];

/** @throws Error when `serving` comes with options it replaces, or an option lacks the one it needs. */
function checkServing(opts: SystemOptions): void {
  for (const [conflicts, why] of OPTION_CONFLICTS) if (conflicts(opts)) throw new Error(why);
}

/** @throws Error when the options would write into a named cluster without `install`, or need a control plane of their own. */
function checkNamedCluster(opts: SystemOptions, install: boolean): void {
  if (opts.node || opts.serving)
    throw new Error('a node runs with a control plane started here, not with a named cluster');
  if (!install && opts.events) throw new Error(NAMED_CLUSTER_NEEDS_INSTALL);
  if (!install && opts.webhook) throw new Error('registering the webhook writes into the cluster: it needs install');
  if (opts.users === 'service-accounts' || opts.auditLogMaxSizeMB !== undefined)
    throw new Error('users and the audit log are options of a control plane started here, not of a named cluster');
}

/** The PingSources' schedules (default: the manifests' 5 and 10 minutes). */
function pingSchedules(pings: SystemOptions['pings']): Record<keyof typeof PINGS, string> {
  return {
    status: cronSchedule(pings?.statusEveryMs ?? 5 * 60_000),
    resync: cronSchedule(pings?.resyncEveryMs ?? 10 * 60_000),
  };
}

/** The shared state of the steps: their undo stack (one stop for every caller), the printer. */
function newStartup(opts: SystemOptions): Startup {
  // The steps say more themselves (builds, the control plane): their names are not announced.
  const steps = new Steps({ progress: opts.progress, signal: opts.signal, announce: false });
  const emit: Startup['emit'] = (component, raw, p) => {
    opts.onRawLine?.(component, raw);
    if (p) opts.print?.(p);
  };
  return { opts, steps, printer: new LogPrinter(), emit };
}

/**
 * Kustomize, and with events Knative's adapter and the Broker's data plane, each built
 * when missing (with progress; minutes once, then cached), before anything runs.
 */
async function buildTools(s: Startup): Promise<void> {
  if (!s.opts.functions && !s.opts.serving) return;
  await ensureKustomize(s.opts.progress);
  if (!s.opts.events) return;
  await ensureApiServerSourceAdapter(s.opts.progress);
  await ensureEventingDataPlane(s.opts.progress);
}

/** Beside the control plane: the rendered {@link MANIFESTS}, which only the functions and events need. */
async function renderManifests(s: Startup): Promise<KubernetesObject[]> {
  if (s.opts.serving) return renderForServing(MANIFESTS, s.opts.dir);
  return s.opts.functions ? (await render(MANIFESTS)).filter((o) => o.kind !== 'CustomResourceDefinition') : [];
}

/**
 * With `serving`, Knative Serving on the node (scripts/serving/), and Eventing with `events:
 * 'knative'`; each with `knative` in its `config-observability` (read as they start).
 */
async function startKnativeServing(
  s: Startup,
  cluster: Cluster,
  knative: Readonly<Record<string, string>> | undefined,
): Promise<KnativeServing | undefined> {
  if (!s.opts.serving) return undefined;
  const serving = await startServing(cluster.node!, {
    dir: join(s.opts.dir, 'node'),
    log: s.opts.progress,
    ...(knative ? { observability: knative } : {}),
  });
  s.steps.defer(() => serving.stop());
  if (s.opts.events === 'knative') await installEventing(cluster.node!, s.opts.progress, knative);
  return serving;
}

/** With `observability`, Prometheus and Jaeger inside the node, stopped with it. */
async function startNodeObservability(s: Startup, cluster: Cluster): Promise<Observability | undefined> {
  if (!s.opts.observability) return undefined;
  s.opts.progress('starting Prometheus and Jaeger inside the node (docs/observability.md)');
  const observability = await startObservability({
    dir: join(s.opts.dir, 'observability'),
    log: s.opts.progress,
    node: cluster.node!,
  });
  s.steps.defer(() => observability.stop());
  return observability;
}

/** What runs on the node beside the control plane: the receivers, Serving (and Eventing), the registry. */
async function startOnNode(
  s: Startup,
  cluster: Cluster,
): Promise<{
  serving: KnativeServing | undefined;
  registry: NodeRegistry | undefined;
  observability: Observability | undefined;
}> {
  const observability = await startNodeObservability(s, cluster);
  const serving = await startKnativeServing(s, cluster, observability?.knative);
  return { serving, registry: await startRegistry(s, cluster), observability };
}

/** With `registry`, the node's registry (scripts/node/registry.ts), empty: a user pushes the product's image to it. */
async function startRegistry(s: Startup, cluster: Cluster): Promise<NodeRegistry | undefined> {
  if (!s.opts.registry) return undefined;
  const registry = await startNodeRegistry(cluster.node!, { dir: join(s.opts.dir, 'registry'), log: s.opts.progress });
  s.steps.defer(() => registry.stop());
  return registry;
}

/**
 * Beside rendering: the control plane, started here (inside a node when asked)
 * unless the options name a cluster.
 */
async function connectCluster(s: Startup): Promise<Cluster> {
  let controlPlane: ControlPlane | undefined;
  let node: TestNode | undefined;
  let kubeconfigPath: string;
  if (s.opts.cluster) {
    kubeconfigPath = s.opts.cluster.kubeconfig;
    mkdirSync(s.opts.dir, { recursive: true });
  } else if (s.opts.node || s.opts.serving) {
    node = await startNode({
      dir: s.opts.dir,
      log: s.opts.progress,
      ...(s.opts.auditLogMaxSizeMB !== undefined ? { auditLogMaxSizeMB: s.opts.auditLogMaxSizeMB } : {}),
      networkPolicies: s.opts.networkPolicies === true,
    });
    s.steps.defer(() => node!.stop());
    controlPlane = node.controlPlane;
    kubeconfigPath = controlPlane.kubeconfigPath;
  } else {
    const cp = await startControlPlane({
      dir: s.opts.dir,
      log: s.opts.progress,
      ...(s.opts.auditLogMaxSizeMB !== undefined ? { auditLogMaxSizeMB: s.opts.auditLogMaxSizeMB } : {}),
    });
    s.steps.defer(() => cp.stop());
    controlPlane = cp;
    kubeconfigPath = cp.kubeconfigPath;
  }
  mkdirSync(join(s.opts.dir, 'logs'), { recursive: true });
  const kc = new KubeConfig();
  try {
    kc.loadFromFile(kubeconfigPath);
  } catch (err) {
    // Not the cause: the parser quotes the file around the error, which may be a token or a key.
    // eslint-disable-next-line preserve-caught-error
    throw new Error(`${kubeconfigPath} is not a kubeconfig: ${firstLine(err)}`);
  }
  const server = kc.getCurrentCluster()?.server;
  if (!server) throw new Error(`${kubeconfigPath}: the current context names no cluster`);
  await kc
    .makeApiClient(VersionApi)
    .getCode()
    .catch((err: unknown) => {
      throw new Error(`${server} (from ${kubeconfigPath}) does not answer: ${describeError(err)}`);
    });
  return { controlPlane, ...(node ? { node } : {}), kubeconfigPath, kc, server };
}

/**
 * The project's CRDs (unless the cluster was named without `install`), then, with
 * events, Knative Eventing's in the background while the functions start, which do not need
 * them. On a named cluster that runs Knative Eventing's own controller, nothing is installed:
 * it would reconcile the local Broker and rewrite what the stand-in wrote.
 * @returns the Eventing CRDs' installation (`installed`), to await before the data plane starts.
 * @throws Error when the cluster runs Knative Eventing, or a project CRD is rejected.
 */
async function installAllCRDs(s: Startup, cluster: Cluster): Promise<{ installed: Promise<void> }> {
  const none = { installed: Promise.resolve() };
  if (s.opts.cluster && !s.opts.cluster.install) return none;
  if (s.opts.cluster && s.opts.events) await refuseRealEventing(cluster.kc);
  if (s.opts.product === false) return none;
  s.opts.progress(`installing the CRDs into ${cluster.server}`);
  await installCRDs(cluster.kc);
  // Knative's own installation brings its CRDs (scripts/eventing/install.ts).
  if (!s.opts.events || s.opts.events === 'knative') return none;
  // In a wrapper: an async function returning the promise itself would wait for it.
  const installed = loadThirdPartyCRDs(EVENTING_CRDS).then(async (crds) => {
    await applyCRDs(
      cluster.kc,
      crds.map((c) => c.crd),
    );
  });
  // Awaited before the data plane starts; a failure of an earlier step must not leave it unhandled.
  installed.catch(() => undefined);
  return { installed };
}

/** @throws Error when the cluster runs Knative Eventing's controller (its deployment is there). */
async function refuseRealEventing(kc: KubeConfig): Promise<void> {
  const found = await kc
    .makeApiClient(AppsV1Api)
    .readNamespacedDeployment({ namespace: 'knative-eventing', name: 'eventing-controller' })
    .then(
      () => true,
      () => false,
    );
  if (found)
    throw new Error(
      'this cluster runs Knative Eventing (deployment knative-eventing/eventing-controller): its controllers would take over the local Broker; deploy the manifests there instead (docs/deploy-knative.md), or use the embedded control plane',
    );
}

/** The kubeconfig each part acts with (./users.ts). */
async function actors(s: Startup, cluster: Cluster, rendered: readonly KubernetesObject[]) {
  if (s.opts.users !== 'service-accounts') {
    const all = [...FUNCTION_NAMES, 'event-source'] as const;
    return Object.fromEntries(all.map((a) => [a, cluster.kubeconfigPath])) as Record<Actor, string>;
  }
  s.opts.progress("the functions' and the event source's users, bound to the manifests' roles");
  return serviceAccountUsers(cluster.controlPlane!, cluster.kc, rendered);
}

/**
 * With `serving`, once the Eventing CRDs are in (the manifests hold an
 * ApiServerSource), the rendered manifests on Serving (./serving.ts).
 */
async function deployFunctionsOnServing(
  s: Startup,
  o: {
    cluster: Cluster;
    serving: KnativeServing | undefined;
    rendered: readonly KubernetesObject[];
    schedules: Record<keyof typeof PINGS, string>;
    /** The receivers its functions push to (their settings added to every function's container). */
    observability: Observability | undefined;
  },
): Promise<RunningSystem['serving']> {
  if (!o.serving || s.opts.product === false) return undefined;
  const byName = Object.entries(PINGS).map(([which, name]) => [name, o.schedules[which as keyof typeof PINGS]]);
  const eventing = { schedules: Object.fromEntries(byName) };
  const served = await deployOnServing(
    o.cluster.kc,
    o.cluster.node!,
    withFunctionEnv(o.rendered, o.observability?.functionEnv ?? {}),
    {
      eventing,
    },
  );
  return { ...served, sources: o.serving.sources, caPem: o.serving.caPem };
}

/** Starts instances of functions, each logging to `<dir>/logs/<name>-<n>.log`, stopped with the system. */
function instanceStarter(
  s: Startup,
  f: { build: FunctionsBuild; env: (name: FunctionName) => NodeJS.ProcessEnv; caPem: string },
): (name: FunctionName, extra?: NodeJS.ProcessEnv) => Promise<FunctionProcess> {
  let instance = 0;
  return async (name, extra) => {
    const fn = await startFunction({
      name,
      main: f.build.main,
      env: { ...f.env(name), ...extra },
      logFile: join(s.opts.dir, 'logs', `${name}-${instance++}.log`),
      caPem: f.caPem,
      onLine: (l) => s.emit(name, l, s.printer.line(name, l)),
    });
    if (s.steps.stopped) {
      await fn.stop();
      throw new Error(`${name} was started after the system stopped`);
    }
    // Its own drain deadline first (it then exits by itself), SIGKILL only after that.
    s.steps.defer(() => fn.stop(DEFAULT_DRAIN_SECONDS * 1000 + 5_000));
    return fn;
  };
}

/**
 * The functions, side by side (each spends about a second starting Node and loading
 * its modules), while Knative Eventing's CRDs are installed.
 * @throws the first function's start error, once every other one is started or failed.
 */
async function startFunctions(
  s: Startup,
  start: (name: FunctionName) => Promise<FunctionProcess>,
): Promise<Record<FunctionName, FunctionProcess>> {
  if (!s.opts.functions) return {} as Record<FunctionName, FunctionProcess>;
  s.opts.progress(`starting ${FUNCTION_NAMES.join(', ')}`);
  const started = await Promise.allSettled(FUNCTION_NAMES.map(start));
  const failed = started.find((r) => r.status === 'rejected');
  if (failed) throw failed.reason;
  const fns = started.map((r) => (r as PromiseFulfilledResult<FunctionProcess>).value);
  return Object.fromEntries(FUNCTION_NAMES.map((n, i) => [n, fns[i]])) as Record<FunctionName, FunctionProcess>;
}

/**
 * The webhook registration, when asked — never for a remote API server: it could not
 * reach this machine.
 * @returns whether it was registered.
 */
async function registerLocalWebhook(
  s: Startup,
  cluster: Cluster,
  functions: Record<FunctionName, FunctionProcess>,
  caPem: string,
): Promise<boolean> {
  if (!s.opts.webhook || !s.opts.functions) return false;
  const url = functions.admission.url;
  const host = new URL(cluster.server).hostname;
  if (!['127.0.0.1', 'localhost', '[::1]'].includes(host)) {
    s.opts.progress(
      `not registering the webhook: ${cluster.server} is not on this machine, so it could not call ${url}`,
    );
    return false;
  }
  const unregister = await registerWebhook(cluster.kc, { url, caBundlePem: caPem, name: WEBHOOK_CONFIGURATION });
  // Left behind on a named cluster it would block every identity write (failurePolicy Fail).
  s.steps.defer(() => (s.opts.cluster ? unregister() : undefined));
  return true;
}

/** What the events step works with. */
interface EventsContext {
  cluster: Cluster;
  rendered: readonly KubernetesObject[];
  functions: Record<FunctionName, FunctionProcess>;
  users: Record<Actor, string>;
  schedules: Record<keyof typeof PINGS, string>;
  /** With `serving`: the Knative Services the Triggers deliver to. */
  served?: ServedFunctions | undefined;
  /** Signs deliveries as the Triggers do ({@link RunningSystem.sign}). */
  sign: (fn: EventFunction) => Promise<string>;
}

/** The events the options ask for, from the API server and the pings to the functions. */
async function startEvents(s: Startup, ctx: EventsContext): Promise<Pick<RunningSystem, 'broker' | 'eventPaths'>> {
  const { cluster, rendered } = ctx;
  if (s.opts.events === 'fronts') {
    const paths = await EventPaths.start({
      dir: s.opts.dir,
      kc: cluster.kc,
      kubeconfigPath: cluster.kubeconfigPath,
      rendered,
      log: s.opts.progress,
      sign: ctx.sign,
    });
    s.steps.defer(() => paths.stop());
    await paths.connect({ kubeconfig: ctx.users['event-source'], functions: ctx.functions });
    return { eventPaths: paths };
  }
  if (s.opts.events === 'knative' && ctx.served) {
    const podLogs = join(s.opts.dir, 'node', 'kubelet', 'pod-logs');
    const broker = await installedBroker(cluster.node!, { kc: cluster.kc, rendered, podLogs });
    return { broker: { ...broker, schedules: ctx.schedules } };
  }
  if (s.opts.events !== 'broker') return {};
  const url = (name: FunctionName) => `${ctx.functions[name].url}/`;
  const broker = await startBroker({
    ...cluster,
    rendered,
    subscribers: {
      'mirror-sync': url('mirror-sync'),
      'identity-status': url('identity-status'),
      'dead-letters': url('dead-letters'),
    },
    schedules: ctx.schedules,
    steps: s.steps,
    progress: s.opts.progress,
    emit: s.emit,
    ...(s.opts.knativeObservability ? { observability: s.opts.knativeObservability } : {}),
  });
  await startAdapter({
    ...cluster,
    kubeconfigPath: ctx.users['event-source'],
    rendered,
    sink: broker.url,
    steps: s.steps,
    emit: s.emit,
  });
  return {
    broker: {
      url: broker.url,
      schedules: ctx.schedules,
      ping: (which) => ping(broker.url, which),
      send: (msg) => sendToBroker(broker.url, msg),
      logs: broker.logs,
    },
  };
}
