/**
 * The whole system on one machine (SPEC §14), shared by `npm start` and `npm run demo`: a
 * control plane (embedded, or a cluster the user named and allowed to install into), the
 * project's and Knative Eventing's CRDs, the three functions as child processes of the
 * container's entrypoint (`node functions/main.ts <name>`: Knative Serving does not run here,
 * so a ksvc is a process on a loopback port), and the wiring Knative provides in a cluster:
 * - the admission webhook over HTTPS, registered by a ValidatingWebhookConfiguration;
 * - every event through Knative's real Broker: Knative's ApiServerSource adapter (configured
 *   from the rendered `captf-objects` ApiServerSource) and mtping (the rendered PingSources)
 *   send to Broker `captf`, whose ingress, in-memory channel and filter (scripts/eventing/dataplane.ts,
 *   Knative Eventing's own binaries) deliver by the rendered Triggers, with their retries,
 *   back-off and dead-letter sink (./dead-letters.ts prints what lands there).
 * Nothing here delivers, retries or schedules events itself; ./events.ts says what is left.
 */
import { request } from 'node:https';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import {
  AppsV1Api,
  CoreV1Api,
  KubeConfig,
  KubernetesObjectApi,
  makeInformer,
  type V1ClusterRoleBinding,
  type KubernetesListObject,
  type KubernetesObject,
  type V1CustomResourceDefinition,
  type V1Secret,
} from '@kubernetes/client-node';
import { describeError, isConflict } from '../../functions/lib/kube.ts';
import { ANNOTATION_IDENTITY, ANNOTATION_SOURCE_HASH, LABEL_MIRRORED } from '../../functions/lib/mirror.ts';
import { startControlPlane, type ControlPlane } from '../controlplane/controlplane.ts';
import { applyCRDs, installCRDs } from '../controlplane/crds.ts';
import { createWebhookPair, type CertPair } from '../controlplane/pki.ts';
import { EVENTING_BINARIES, ensureEventingDataPlane } from '../eventing/build.ts';
import { startEventingDataPlane } from '../eventing/dataplane.ts';
import {
  EVENTING_CRDS,
  ensureApiServerSourceAdapter,
  loadThirdPartyCRDs,
  sourceConfigFor,
  startApiServerSourceAdapter,
  type ApiServerSourceSpec,
} from '../eventing/adapter.ts';
import { ensureKustomize, render } from '../tools/kustomize.ts';
import { isRunning, spawnFunction, type FunctionProcess } from '../lib/process.ts';
import { bothSettled, firstLine, sleep } from '../lib/wait.ts';
import { startDeadLetterSink, type DeadLetter } from '../local/dead-letters.ts';
import { cronSchedule, pingMessage, waitForWatchCaches, watchPaths } from '../local/events.ts';
import {
  LogPrinter,
  adapterLine,
  dataPlaneLine,
  deadLetterLine,
  describeMirrorChange,
  formatLine,
  type MirrorView,
  type Printed,
} from '../local/print.ts';
import { WEBHOOK_CONFIGURATION, registerWebhook } from './webhook.ts';

export { WEBHOOK_CONFIGURATION, webhookConfiguration } from './webhook.ts';

/** The functions `npm start` runs, in start order. */
export const FUNCTION_NAMES = ['admission', 'mirror-sync', 'identity-status'] as const;
/** One of {@link FUNCTION_NAMES}. */
export type FunctionName = (typeof FUNCTION_NAMES)[number];

/** PingSource names, as in the manifests (manifests/base/eventing.yaml). */
export const PINGS = { status: 'captf-identity-status', resync: 'captf-resync' } as const;
/** The kustomization whose Broker, Triggers, PingSources and ApiServerSource the local mode runs. */
export const EVENTING_MANIFESTS = 'manifests/base';
/** Namespace of the Broker and the sources in the manifests. */
const EVENTING_NAMESPACE = 'captf-system';
/** The ApiServerSource of the manifests whose adapter runs locally. */
const API_SOURCE = 'captf-objects';
/** The Knative Services the Triggers and the Broker's delivery name. */
const SERVICES = {
  'mirror-sync': 'captf-mirror-sync',
  'identity-status': 'captf-identity-status',
  deadLetters: 'captf-dead-letters',
} as const;
/** The annotation `kubectl apply` keeps its last applied configuration in. */
const LAST_APPLIED = 'kubectl.kubernetes.io/last-applied-configuration';
/** Knative Eventing's deployment whose presence means a cluster runs Knative's own controllers. */
const EVENTING_CONTROLLER = { namespace: 'knative-eventing', name: 'eventing-controller' } as const;

/** Options of {@link startSystem}. */
export interface SystemOptions {
  /** State folder: the embedded control plane's (wiped on start), webhook certificates, logs. */
  dir: string;
  /** Run against this kubeconfig instead of an embedded control plane. */
  kubeconfig?: string | undefined;
  /**
   * With `kubeconfig`, required: allows writing into that cluster what the local system needs
   * there — the CRDs, Knative's Broker, Triggers, PingSources and InMemoryChannel, namespace
   * `knative-eventing`, and the webhook when the API server is on loopback.
   */
  install?: boolean;
  /** Identity status ping interval in ms (default 5 minutes); must be a PingSource schedule ({@link cronSchedule}). */
  statusEveryMs?: number;
  /** Resync ping interval in ms (default 10 minutes); must be a PingSource schedule ({@link cronSchedule}). */
  resyncEveryMs?: number;
  /** Receives each readable line (debug ones too; the caller filters). */
  print: (p: Printed) => void;
  /** Progress lines while starting (build, control plane). */
  progress: (line: string) => void;
  /** Every raw output line of the functions and the Knative processes, before printing (the demo scans them). */
  onRawLine?: (component: string, line: string) => void;
}

/** A running function process (scripts/lib/process.ts). */
export type RunningFunction = FunctionProcess;

/** The running system. */
export interface RunningSystem {
  kubeconfigPath: string;
  /** API server URL. */
  server: string;
  /** Set when the control plane is embedded. */
  controlPlane?: ControlPlane;
  functions: Record<FunctionName, RunningFunction>;
  /** The Broker's address: every event goes there (the adapter's, mtping's, `ping()`'s). */
  brokerUrl: string;
  /** The PingSources' schedules as mtping runs them. */
  schedules: Record<keyof typeof PINGS, string>;
  /** Whether the ValidatingWebhookConfiguration was registered. */
  webhook: boolean;
  /** The ServiceAccount playing the provider's manager, allowed to call prepare (embedded control plane only). */
  prepareCaller?: { namespace: string; name: string };
  /**
   * POSTs the CloudEvent a PingSource tick sends to the Broker now, which routes it by the
   * Triggers like mtping's; resolves once the Broker answered, which (default synchronous
   * channel) is after the function answered or the event was dead-lettered.
   * @throws Error when the Broker does not answer 2xx.
   */
  ping(which: keyof typeof PINGS): Promise<void>;
  /** Stops everything this call started, in reverse order; idempotent. */
  stop(): Promise<void>;
}

/** What the steps of {@link startSystem} share: the options, what to undo, where lines go. */
interface Startup {
  opts: SystemOptions;
  /** Undo actions of every step so far, run in reverse by `stop()`. */
  cleanups: (() => Promise<void> | void)[];
  printer: LogPrinter;
  emit: (p: Printed | undefined) => void;
  stop(): Promise<void>;
}

/** The cluster the system runs against. */
interface Cluster {
  /** Set when the control plane is embedded. */
  controlPlane: ControlPlane | undefined;
  kubeconfigPath: string;
  kc: KubeConfig;
  /** API server URL. */
  server: string;
}

function isLoopback(server: string): boolean {
  const host = new URL(server).hostname;
  return host === '127.0.0.1' || host === 'localhost' || host === '[::1]';
}

/**
 * Starts everything, in order: Knative's binaries and kustomize (built when missing), the
 * control plane (embedded unless `opts.kubeconfig`) while the manifests are rendered, the
 * CRDs, the webhook's serving certificate, the three functions, the webhook registration, the
 * dead-letter sink and the Broker's data plane, the ApiServerSource adapter, and the mirror
 * watch that prints mirror changes.
 * @returns the running system; call `stop()` to end it.
 * @throws Error saying which step failed; everything started before it is stopped first.
 *   Before anything starts: a named cluster without `install`, or a ping interval that is no
 *   PingSource schedule.
 */
export async function startSystem(opts: SystemOptions): Promise<RunningSystem> {
  const schedules = pingSchedules(opts);
  if (opts.kubeconfig && !opts.install) throw new Error(NAMED_CLUSTER_NEEDS_INSTALL);
  const s = newStartup(opts);
  try {
    await buildKnative(s);
    const [{ rendered, eventingCRDs }, cluster] = await bothSettled(readEventingFiles(), connectControlPlane(s));
    const eventingCRDsInstalled = await installAllCRDs(s, cluster, eventingCRDs);
    const tls = await createWebhookPair(join(opts.dir, 'webhook-pki'), 'captf-local-webhook-ca');
    const functions = await startFunctions(s, functionEnvs(cluster.kubeconfigPath, tls.leaf), tls.caPem);
    const webhook = await registerLocalWebhook(s, cluster, functions.admission.url, tls.caPem);
    await eventingCRDsInstalled;
    const brokerUrl = await startBroker(s, { cluster, rendered, functions, schedules });
    const prepareCaller = cluster.controlPlane ? await installPrepareCaller(cluster.kc, rendered) : undefined;
    await startAdapter(s, { cluster, rendered, brokerUrl });
    s.cleanups.push(await watchMirrors(cluster.kc, s.emit));
    return {
      kubeconfigPath: cluster.kubeconfigPath,
      server: cluster.server,
      ...(cluster.controlPlane ? { controlPlane: cluster.controlPlane } : {}),
      functions,
      brokerUrl,
      schedules,
      webhook,
      ...(prepareCaller ? { prepareCaller } : {}),
      ping: (which) => ping(brokerUrl, which),
      stop: s.stop,
    };
  } catch (err) {
    await s.stop();
    throw err;
  }
}

/** Why a named cluster needs `install` (the local Broker writes objects into it). */
const NAMED_CLUSTER_NEEDS_INSTALL =
  "events flow through Knative's Broker, which runs on this machine against the cluster and so writes " +
  "into it: the project's and Knative Eventing's CRDs, the manifests' Broker, Triggers and PingSources, an " +
  'InMemoryChannel and namespace knative-eventing. Nothing is written into a cluster you named unless you ' +
  'add --install';

/** The PingSources' schedules from the options (default: the manifests' 5 and 10 minutes). */
function pingSchedules(opts: SystemOptions): Record<keyof typeof PINGS, string> {
  return {
    status: cronSchedule(opts.statusEveryMs ?? 5 * 60_000),
    resync: cronSchedule(opts.resyncEveryMs ?? 10 * 60_000),
  };
}

/** What the events need that can be had before the control plane runs. */
interface EventingFiles {
  /** The rendered {@link EVENTING_MANIFESTS}. */
  rendered: KubernetesObject[];
  /** Knative Eventing's CRDs, read from the pinned module (a `go mod download` each start). */
  eventingCRDs: V1CustomResourceDefinition[];
}

/**
 * Step 0: the ApiServerSource adapter, the Broker's data plane and kustomize, each built when
 * missing (with progress; about 4 minutes for the adapter, then 30 s for the data plane with
 * the Go cache warm), before anything runs.
 */
async function buildKnative(s: Startup): Promise<void> {
  await ensureApiServerSourceAdapter(s.opts.progress);
  await ensureEventingDataPlane(s.opts.progress);
  await ensureKustomize(s.opts.progress);
}

/** Step 1 (beside the control plane's start): the manifests rendered, Knative Eventing's CRDs read. */
async function readEventingFiles(): Promise<EventingFiles> {
  const [rendered, crds] = await Promise.all([render(EVENTING_MANIFESTS), loadThirdPartyCRDs(EVENTING_CRDS)]);
  return { rendered, eventingCRDs: crds.map((c) => c.crd) };
}

/** The shared state of the steps, with a `stop()` that runs their cleanups once, in reverse. */
function newStartup(opts: SystemOptions): Startup {
  const cleanups: Startup['cleanups'] = [];
  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    for (const c of cleanups.reverse()) {
      try {
        await c();
      } catch (err) {
        opts.progress(`while stopping: ${firstLine(err)}`);
      }
    }
  };
  return { opts, cleanups, printer: new LogPrinter(), emit: (p) => p && opts.print(p), stop };
}

/** Step 1: the control plane, embedded unless the options name a kubeconfig. */
async function connectControlPlane(s: Startup): Promise<Cluster> {
  let controlPlane: ControlPlane | undefined;
  let kubeconfigPath: string;
  if (s.opts.kubeconfig) {
    kubeconfigPath = s.opts.kubeconfig;
    mkdirSync(s.opts.dir, { recursive: true });
  } else {
    const cp = await startControlPlane({ dir: s.opts.dir, log: s.opts.progress });
    s.cleanups.push(() => cp.stop());
    controlPlane = cp;
    kubeconfigPath = cp.kubeconfigPath;
  }
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfigPath);
  const server = kc.getCurrentCluster()?.server;
  if (!server) throw new Error(`${kubeconfigPath}: the current context names no cluster`);
  return { controlPlane, kubeconfigPath, kc, server };
}

/**
 * Step 2: the project's CRDs, then Knative Eventing's (the Broker's data plane reads and
 * writes Brokers, Triggers, PingSources, InMemoryChannels…) in the background while the
 * functions start, which do not need them. On a named cluster that runs Knative Eventing's own
 * controller, nothing is installed: that controller would reconcile the local Broker and
 * rewrite what the stand-in wrote (scripts/eventing/dataplane.ts).
 * @returns the Eventing CRDs' installation, to await before the data plane starts.
 * @throws Error when the cluster runs Knative Eventing, or a project CRD is rejected.
 */
async function installAllCRDs(
  s: Startup,
  cluster: Cluster,
  eventingCRDs: readonly V1CustomResourceDefinition[],
): Promise<Promise<void>> {
  if (s.opts.kubeconfig) await refuseRealEventing(cluster.kc);
  s.opts.progress(`installing the CRDs (the project's and Knative Eventing's) into ${cluster.server}`);
  await installCRDs(cluster.kc);
  const eventing = applyCRDs(cluster.kc, eventingCRDs).then(() => undefined);
  // Awaited before the data plane starts; a failure of an earlier step must not leave it unhandled.
  eventing.catch(() => undefined);
  return eventing;
}

/** @throws Error when the cluster runs Knative Eventing's controller (its deployment is there). */
async function refuseRealEventing(kc: KubeConfig): Promise<void> {
  const found = await kc
    .makeApiClient(AppsV1Api)
    .readNamespacedDeployment(EVENTING_CONTROLLER)
    .then(
      () => true,
      () => false,
    );
  if (found)
    throw new Error(
      `this cluster runs Knative Eventing (deployment ${EVENTING_CONTROLLER.namespace}/${EVENTING_CONTROLLER.name}): its controllers would take over the local Broker; deploy the manifests there instead (docs/deploy-knative.md), or use the embedded control plane`,
    );
}

/** The environment of each function: local mode, reachable from this machine only. */
function functionEnvs(kubeconfigPath: string, leaf: CertPair): Record<FunctionName, NodeJS.ProcessEnv> {
  const base: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    KUBECONFIG: kubeconfigPath,
    PORT: '0',
    HOST: '127.0.0.1',
    LOG_LEVEL: process.env.LOG_LEVEL ?? 'info',
    ...(process.env.CAPTF_CONSUMER_KINDS ? { CAPTF_CONSUMER_KINDS: process.env.CAPTF_CONSUMER_KINDS } : {}),
  };
  return {
    admission: { ...base, CAPTF_TLS_CERT_FILE: leaf.cert, CAPTF_TLS_KEY_FILE: leaf.key },
    'mirror-sync': base,
    'identity-status': base,
  };
}

/**
 * Step 4: the functions, from the container's entrypoint, on free ports, side by side (each
 * spends about a second starting Node and loading its modules), while Knative Eventing's
 * CRDs are installed. Every one that started is stopped with the rest, also when another
 * failed.
 * @throws the first function's start error.
 */
async function startFunctions(
  s: Startup,
  envs: Record<FunctionName, NodeJS.ProcessEnv>,
  caPem: string,
): Promise<Record<FunctionName, RunningFunction>> {
  s.opts.progress(`starting ${FUNCTION_NAMES.join(', ')}`);
  const started = await Promise.allSettled(
    FUNCTION_NAMES.map((name) => {
      const onLine = (l: string) => {
        s.opts.onRawLine?.(name, l);
        s.emit(s.printer.line(name, l));
      };
      return startFunction({ name, env: envs[name], onLine }, caPem);
    }),
  );
  const functions = {} as Record<FunctionName, RunningFunction>;
  started.forEach((r, i) => {
    if (r.status !== 'fulfilled') return;
    s.cleanups.push(() => r.value.stop());
    functions[FUNCTION_NAMES[i]!] = r.value;
  });
  const failed = started.find((r) => r.status === 'rejected');
  if (failed) throw failed.reason;
  return functions;
}

/**
 * Starts a function and resolves once it logged the port it bound and `/healthz` answered
 * 200 (over https trusting `caPem` when it serves TLS).
 * @throws Error with its last output lines when it exits or does not become healthy.
 */
async function startFunction(
  opts: { name: FunctionName; env: NodeJS.ProcessEnv; onLine: (l: string) => void },
  caPem: string,
): Promise<RunningFunction> {
  const fn = await spawnFunction(opts);
  try {
    await waitHealthy(fn, fn.scheme === 'https' ? caPem : undefined);
  } catch (err) {
    fn.kill();
    throw new Error(`${opts.name}: ${(err as Error).message}\n${fn.tail().join('\n')}`, { cause: err });
  }
  return fn;
}

/** GET `url` once: its status (https with `caPem` when given). */
function getStatus(url: string, caPem: string | undefined): Promise<number> {
  if (!caPem) return fetch(url, { signal: AbortSignal.timeout(2000) }).then((r) => r.status);
  return new Promise<number>((res, rej) => {
    const req = request(url, { ca: caPem, timeout: 2000 }, (r) => {
      r.resume();
      res(r.statusCode ?? 0);
    });
    req.on('error', rej);
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.end();
  });
}

/**
 * GETs the function's `/healthz` until it answers 200.
 * @throws Error when the function exits first or `timeoutMs` passes.
 */
async function waitHealthy(fn: RunningFunction, caPem: string | undefined, timeoutMs = 30_000): Promise<void> {
  const url = `${fn.url}/healthz`;
  const deadline = Date.now() + timeoutMs;
  let last = '';
  while (Date.now() < deadline) {
    if (!isRunning(fn.child)) throw new Error(`exited (${fn.child.exitCode ?? fn.child.signalCode})`);
    try {
      const status = await getStatus(url, caPem);
      if (status === 200) return;
      last = `HTTP ${status}`;
    } catch (err) {
      last = (err as Error).message;
    }
    await sleep(100);
  }
  throw new Error(`${url} not healthy after ${timeoutMs} ms: ${last}`);
}

/**
 * Step 5, the webhook registration — never on a remote cluster: it could not reach this
 * machine.
 * @returns whether it was registered.
 */
async function registerLocalWebhook(s: Startup, cluster: Cluster, url: string, caPem: string): Promise<boolean> {
  if (!isLoopback(cluster.server)) {
    s.opts.progress(
      `not registering the webhook: ${cluster.server} is not on this machine, so it could not call ${url}`,
    );
    return false;
  }
  const unregister = await registerWebhook(cluster.kc, { url, caBundlePem: caPem, name: WEBHOOK_CONFIGURATION });
  // Left behind on a named cluster it would block every identity write (failurePolicy Fail).
  s.cleanups.push(() => (s.opts.kubeconfig ? unregister() : undefined));
  return true;
}

/** What the event steps work with. */
interface EventingContext {
  cluster: Cluster;
  /** The rendered {@link EVENTING_MANIFESTS}. */
  rendered: readonly KubernetesObject[];
}

/**
 * Step 6: the dead-letter sink, then Knative's Broker data plane with the rendered Broker,
 * Triggers and PingSources (their schedules from the options), the Knative Services they name
 * resolved to the local functions and the sink. The data plane's warnings and errors are
 * printed (known start-up noise aside: print.ts dataPlaneLine), the rest is debug.
 * @returns the Broker's address.
 */
async function startBroker(
  s: Startup,
  ctx: EventingContext & {
    functions: Record<FunctionName, RunningFunction>;
    schedules: Record<keyof typeof PINGS, string>;
  },
): Promise<string> {
  const subscribers = {
    'mirror-sync': `${ctx.functions['mirror-sync'].url}/`,
    'identity-status': `${ctx.functions['identity-status'].url}/`,
  };
  await createNamespaceAsApplied(ctx.cluster.kc, ctx.rendered);
  const dls = await startDeadLetterSink((d) => printDeadLetter(s, d, subscribers));
  s.cleanups.push(() => dls.stop());
  s.opts.progress("starting Knative's Broker data plane: broker-ingress, broker-filter, imc-dispatcher, mtping");
  const dp = await startEventingDataPlane({
    kubeconfigPath: ctx.cluster.kubeconfigPath,
    kc: ctx.cluster.kc,
    objects: ctx.rendered,
    sinks: {
      [SERVICES['mirror-sync']]: subscribers['mirror-sync'],
      [SERVICES['identity-status']]: subscribers['identity-status'],
      [SERVICES.deadLetters]: dls.url,
    },
    schedules: { [PINGS.status]: ctx.schedules.status, [PINGS.resync]: ctx.schedules.resync },
    onLog: (component, line) => {
      const binary = EVENTING_BINARIES[component];
      s.opts.onRawLine?.(binary, line);
      s.emit(dataPlaneLine(binary, line));
    },
    onBuild: s.opts.progress,
  });
  s.cleanups.push(() => dp.stop());
  return dp.brokerUrl;
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
  if (!ns) throw new Error(`${EVENTING_MANIFESTS} renders no Namespace ${EVENTING_NAMESPACE}`);
  const annotations = { ...ns.metadata!.annotations, [LAST_APPLIED]: `${JSON.stringify(ns)}\n` };
  await kc
    .makeApiClient(CoreV1Api)
    .createNamespace({ body: { ...ns, metadata: { ...ns.metadata, annotations } } })
    .catch((err: unknown) => {
      if (!isConflict(err)) throw err;
    });
}

/**
 * The provider's manager as the embedded control plane plays it: the rendered `captf-prepare`
 * ClusterRole and its binding, and the ServiceAccount the binding names (in a cluster the
 * provider installs it), so `prepare` can be called as the docs show, with
 * `kubectl create token <sa> --audience captf-mirror-sync`. Only for a control plane this
 * process owns: nothing like it is written into a cluster the user named.
 * @returns the ServiceAccount. @throws Error when the manifests render no such binding.
 */
async function installPrepareCaller(
  kc: KubeConfig,
  rendered: readonly KubernetesObject[],
): Promise<{ namespace: string; name: string }> {
  const rbac = rendered.filter(
    (o) => (o.kind === 'ClusterRole' || o.kind === 'ClusterRoleBinding') && o.metadata?.name === 'captf-prepare',
  );
  const subject = (rbac.find((o) => o.kind === 'ClusterRoleBinding') as V1ClusterRoleBinding | undefined)
    ?.subjects?.[0];
  if (rbac.length !== 2 || !subject?.namespace)
    throw new Error(`${EVENTING_MANIFESTS} renders no captf-prepare ClusterRole and ClusterRoleBinding`);
  const sa = {
    apiVersion: 'v1',
    kind: 'ServiceAccount',
    metadata: { name: subject.name, namespace: subject.namespace },
  };
  const objects = KubernetesObjectApi.makeApiClient(kc);
  for (const o of [...rbac, sa])
    await objects.create(o).catch((err: unknown) => {
      if (!isConflict(err)) throw err;
    });
  return { namespace: subject.namespace, name: subject.name };
}

/** Prints a dead letter, naming the function it did not reach. */
function printDeadLetter(s: Startup, d: DeadLetter, subscribers: Record<string, string>): void {
  const fn = Object.entries(subscribers).find(([, url]) => d.destination?.startsWith(url))?.[0];
  const line = deadLetterLine(d, fn ?? d.destination);
  s.opts.onRawLine?.('dead-letter', formatLine(line));
  s.emit(line);
}

/**
 * Step 7, API events: Knative's ApiServerSource adapter, configured from the rendered
 * `captf-objects` ApiServerSource as Knative's controller would (scripts/eventing/adapter.ts
 * sourceConfigFor), sending to the Broker. Started once the API server can serve its
 * watches, and waited for until its first list is done: it is at-most-once, and objects
 * created before then would produce no event.
 */
async function startAdapter(s: Startup, ctx: EventingContext & { brokerUrl: string }): Promise<void> {
  const spec = ctx.rendered.find((o) => o.kind === 'ApiServerSource' && o.metadata?.name === API_SOURCE);
  if (!spec) throw new Error(`${EVENTING_MANIFESTS} renders no ApiServerSource ${API_SOURCE}`);
  const source = await sourceConfigFor(ctx.cluster.kc, spec as unknown as ApiServerSourceSpec);
  await waitForWatchCaches(ctx.cluster.kc, watchPaths(source));
  const adapter = await startApiServerSourceAdapter({
    kubeconfigPath: ctx.cluster.kubeconfigPath,
    sink: ctx.brokerUrl,
    source,
    name: API_SOURCE,
    namespace: EVENTING_NAMESPACE,
    onLog: (l) => {
      s.opts.onRawLine?.(`adapter ${API_SOURCE}`, l);
      s.emit(adapterLine(API_SOURCE, l));
    },
  });
  s.cleanups.push(() => adapter.stop());
  // startApiServerSourceAdapter resolves at the first STARTING line, before discovery;
  // the reflectors start after "Starting in … mode".
  const deadline = Date.now() + 30_000;
  while (!adapter.logs.some((l) => /Starting in (resilient|fail-fast) mode/.test(l)) && Date.now() < deadline)
    await sleep(50);
  // Their first list/watch round trip; objects created before it ends produce no event.
  await sleep(1000);
}

/** {@link RunningSystem.ping}: the CloudEvent a PingSource tick sends, POSTed to the Broker. */
async function ping(brokerUrl: string, which: keyof typeof PINGS): Promise<void> {
  const msg = pingMessage(PINGS[which], EVENTING_NAMESPACE);
  // The synchronous channel answers after the fan-out, retries included (31 s, or 62 s when
  // the dead-letter sink fails too).
  const res = await fetch(brokerUrl, {
    method: 'POST',
    headers: msg.headers,
    body: msg.body,
    signal: AbortSignal.timeout(120_000),
  });
  await res.arrayBuffer();
  if (!res.ok) throw new Error(`the Broker answered HTTP ${res.status} to the ${PINGS[which]} ping`);
}

/** What the printer needs of a mirror Secret seen by the watch. */
function mirrorView(s: V1Secret): MirrorView {
  const meta = s.metadata ?? {};
  const annotations = meta.annotations ?? {};
  return {
    namespace: meta.namespace ?? '',
    name: meta.name ?? '',
    identity: annotations[ANNOTATION_IDENTITY] ?? '?',
    owners: (meta.ownerReferences ?? []).map((o) => `${o.kind}/${o.name}`).sort(),
    hash: annotations[ANNOTATION_SOURCE_HASH] ?? '',
  };
}

/**
 * Watches Secrets labelled as mirrors and prints created/updated/deleted lines. Only
 * metadata is kept: each object's `data` is dropped as soon as it arrives.
 * @returns a function that stops the watch.
 */
async function watchMirrors(kc: KubeConfig, emit: (p: Printed | undefined) => void): Promise<() => Promise<void>> {
  const core = kc.makeApiClient(CoreV1Api);
  const selector = `${LABEL_MIRRORED}=true`;
  const seen = new Map<string, MirrorView>();
  const strip = (s: V1Secret): V1Secret => ({ metadata: s.metadata ?? {} });
  const informer = makeInformer<V1Secret>(
    kc,
    '/api/v1/secrets',
    async () => {
      const list = await core.listSecretForAllNamespaces({ labelSelector: selector });
      return { ...list, items: list.items.map(strip) } as KubernetesListObject<V1Secret>;
    },
    selector,
  );
  let listed = false;
  let stopped = false;
  const on = (verb: 'add' | 'update' | 'delete') => (s: V1Secret) => {
    const view = mirrorView(s);
    delete (s as { data?: unknown }).data;
    const key = `${view.namespace}/${view.name}`;
    const before = seen.get(key);
    if (verb === 'delete') seen.delete(key);
    else seen.set(key, view);
    if (listed) emit(describeMirrorChange(verb, view, before));
  };
  informer.on('add', on('add'));
  informer.on('update', on('update'));
  informer.on('delete', on('delete'));
  informer.on('error', (err: unknown) => {
    if (stopped) return;
    emit({ debug: true, component: 'mirror', subject: '', text: `watch failed (${describeError(err)}); restarting` });
    setTimeout(() => !stopped && informer.start().catch(() => undefined), 1000).unref();
  });
  await informer.start();
  listed = true;
  return async () => {
    stopped = true;
    await informer.stop();
  };
}

/** Prints a line unless it is debug and debug is off. */
export function printer(
  debug: boolean,
  out: (l: string) => void = (l) => process.stdout.write(l + '\n'),
): (p: Printed) => void {
  return (p) => {
    if (p.debug && !debug) return;
    out(formatLine(p));
  };
}
