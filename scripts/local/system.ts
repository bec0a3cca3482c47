/**
 * The whole system on one machine (SPEC §14), shared by `npm start` and `npm run demo`:
 * a control plane (embedded, or a cluster the user named), the CRDs, the three functions as
 * child processes of the container's entrypoint (`node functions/main.ts <name>`), and the
 * wiring Knative would provide — the admission webhook over HTTPS registered by a
 * ValidatingWebhookConfiguration, API events as CloudEvents (the real ApiServerSource
 * adapter when built, else ./events.ts), and PingSource-like ticks.
 */
import { request } from 'node:https';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { CoreV1Api, KubeConfig, makeInformer, type KubernetesListObject, type V1Secret } from '@kubernetes/client-node';
import { GROUP, IDENTITY_PLURAL, VERSION, type ConsumerKind } from '../../functions/lib/api.ts';
import { consumerKindsFromEnv } from '../../functions/lib/consumers.ts';
import { describeError } from '../../functions/lib/kube.ts';
import { ANNOTATION_IDENTITY, ANNOTATION_SOURCE_HASH, LABEL_MIRRORED } from '../../functions/lib/mirror.ts';
import { builtGoBinary } from '../build-lock.ts';
import { startControlPlane, type ControlPlane } from '../controlplane/controlplane.ts';
import { installCRDs } from '../controlplane/crds.ts';
import { createWebhookPair, type CertPair } from '../controlplane/pki.ts';
import {
  KNATIVE_TOOLS,
  ensureApiServerSourceAdapter,
  startApiServerSourceAdapter,
  type SourceConfig,
} from '../knative.ts';
import { isRunning, spawnFunction, type FunctionProcess } from '../process.ts';
import { firstLine, sleep } from '../wait.ts';
import {
  Delivery,
  pingMessage,
  schedulePing,
  startLocalEventSource,
  waitForWatchCaches,
  watchedResources,
  type DeliveryReport,
} from './events.ts';
import { LogPrinter, adapterLine, describeMirrorChange, formatLine, type MirrorView, type Printed } from './print.ts';
import { WEBHOOK_CONFIGURATION, registerWebhook } from './webhook.ts';

export { WEBHOOK_CONFIGURATION, webhookConfiguration } from './webhook.ts';

/** The functions `npm start` runs, in start order. */
export const FUNCTION_NAMES = ['admission', 'mirror-sync', 'identity-status'] as const;
/** One of {@link FUNCTION_NAMES}. */
export type FunctionName = (typeof FUNCTION_NAMES)[number];

/** PingSource names, as in the manifests (manifests/base/eventing.yaml). */
export const PINGS = { status: 'captf-identity-status', resync: 'captf-resync' } as const;

/** Options of {@link startSystem}. */
export interface SystemOptions {
  /** State folder: the embedded control plane's (wiped on start), webhook certificates, logs. */
  dir: string;
  /** Run against this kubeconfig instead of an embedded control plane. */
  kubeconfig?: string | undefined;
  /** With `kubeconfig`: install the CRDs (and the webhook when the API server is on loopback). */
  install?: boolean;
  /** Identity status ping interval in ms (default 5 minutes). */
  statusEveryMs?: number;
  /** Resync ping interval in ms (default 10 minutes). */
  resyncEveryMs?: number;
  /** `auto`: the real adapter when already built, else the local source; `build`: build it if needed; `local`: never the adapter. */
  eventSource?: 'auto' | 'build' | 'local';
  /** Trigger-like delivery back-off base in ms (default 1000). */
  backoffMs?: number;
  /** Receives each readable line (debug ones too; the caller filters). */
  print: (p: Printed) => void;
  /** Progress lines while starting (build, control plane). */
  progress: (line: string) => void;
  /** Every raw output line of the functions and adapters, before printing (the demo scans them). */
  onRawLine?: (component: string, line: string) => void;
}

/** A running function process (scripts/process.ts). */
export type RunningFunction = FunctionProcess;

/** The running system. */
export interface RunningSystem {
  kubeconfigPath: string;
  /** API server URL. */
  server: string;
  /** Set when the control plane is embedded. */
  controlPlane?: ControlPlane;
  functions: Record<FunctionName, RunningFunction>;
  /** Which event source delivers API events. */
  eventSource: 'adapter' | 'local';
  /** Whether the ValidatingWebhookConfiguration was registered. */
  webhook: boolean;
  /** Sends one PingSource tick now and resolves when it was delivered (or given up on). */
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

/** The Trigger-like deliveries to the two event-driven functions. */
interface Deliveries {
  toMirrorSync: Delivery;
  toIdentityStatus: Delivery;
}

function isLoopback(server: string): boolean {
  const host = new URL(server).hostname;
  return host === '127.0.0.1' || host === 'localhost' || host === '[::1]';
}

/** Path of the receive adapter when it was built already (nothing is built here). */
export function builtAdapterPath(): string | undefined {
  return builtGoBinary(KNATIVE_TOOLS, 'knative', 'apiserver_receive_adapter');
}

/**
 * Starts everything, in order: control plane (embedded unless `opts.kubeconfig`), CRDs, the
 * webhook's serving certificate, the three functions, the webhook registration, the event
 * source, the mirror watch that prints mirror changes, and the ping schedules.
 * @returns the running system; call `stop()` to end it.
 * @throws Error saying which step failed; everything started before it is stopped first.
 */
export async function startSystem(opts: SystemOptions): Promise<RunningSystem> {
  const s = newStartup(opts);
  try {
    const cluster = await connectControlPlane(s);
    const install = await installCRDsWhenAsked(s, cluster);
    const tls = await createWebhookPair(join(opts.dir, 'webhook-pki'), 'captf-local-webhook-ca');
    const functions = await startFunctions(s, functionEnvs(cluster.kubeconfigPath, tls.leaf), tls.caPem);
    const webhook = install && (await registerLocalWebhook(s, cluster, functions.admission.url, tls.caPem));
    const deliveries = startDeliveries(s, functions);
    const eventSource = await startEventSource(s, cluster, functions, deliveries);
    s.cleanups.push(await watchMirrors(cluster.kc, s.emit));
    schedulePings(s, deliveries);
    return {
      kubeconfigPath: cluster.kubeconfigPath,
      server: cluster.server,
      ...(cluster.controlPlane ? { controlPlane: cluster.controlPlane } : {}),
      functions,
      eventSource,
      webhook,
      ping: (which) => ping(deliveries, which),
      stop: s.stop,
    };
  } catch (err) {
    await s.stop();
    throw err;
  }
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
 * Step 2, the CRDs: always on the embedded control plane; on a named cluster only with
 * `install`.
 * @returns whether this system installs things (CRDs, webhook) into the cluster.
 */
async function installCRDsWhenAsked(s: Startup, cluster: Cluster): Promise<boolean> {
  const install = !s.opts.kubeconfig || Boolean(s.opts.install);
  if (install) {
    s.opts.progress(`installing CRDs into ${cluster.server}`);
    await installCRDs(cluster.kc);
  }
  return install;
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

/** Step 4: the functions, from the container's entrypoint, on free ports, one after the other. */
async function startFunctions(
  s: Startup,
  envs: Record<FunctionName, NodeJS.ProcessEnv>,
  caPem: string,
): Promise<Record<FunctionName, RunningFunction>> {
  const functions = {} as Record<FunctionName, RunningFunction>;
  for (const name of FUNCTION_NAMES) {
    s.opts.progress(`starting ${name}`);
    const onLine = (l: string) => {
      s.opts.onRawLine?.(name, l);
      s.emit(s.printer.line(name, l));
    };
    const fn = await startFunction({ name, env: envs[name], onLine }, caPem);
    s.cleanups.push(() => fn.stop());
    functions[name] = fn;
  }
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

/** Step 6: deliveries (Trigger-like) to the two event-driven functions; each outcome is a (debug) line. */
function startDeliveries(s: Startup, functions: Record<FunctionName, RunningFunction>): Deliveries {
  const report = (r: DeliveryReport) => {
    const fn = r.sink === functions['mirror-sync'].url + '/' ? 'mirror-sync' : 'identity-status';
    s.emit({
      debug: !r.failed,
      component: 'events',
      subject: fn,
      text: `${r.failed ? 'gave up on' : 'delivered'} ${r.type} ${r.subject} → ${r.status || 'unreachable'} after ${r.attempts} attempt(s)${r.error ? ` (${r.error})` : ''}`,
    });
  };
  const options = { onReport: report, ...(s.opts.backoffMs ? { backoffMs: s.opts.backoffMs } : {}) };
  const toMirrorSync = new Delivery(`${functions['mirror-sync'].url}/`, options);
  const toIdentityStatus = new Delivery(`${functions['identity-status'].url}/`, options);
  s.cleanups.push(() => {
    toMirrorSync.stop();
    toIdentityStatus.stop();
  });
  return { toMirrorSync, toIdentityStatus };
}

/** Which adapter binary to use, building it when asked; undefined for the local source. */
async function adapterBinary(s: Startup): Promise<string | undefined> {
  const mode = s.opts.eventSource ?? 'auto';
  if (mode === 'build') return ensureApiServerSourceAdapter(s.opts.progress);
  return mode === 'auto' ? builtAdapterPath() : undefined;
}

/**
 * Step 7, API events: the real adapter (one per Trigger's worth of resources) when there is
 * one, else the local source.
 */
async function startEventSource(
  s: Startup,
  cluster: Cluster,
  functions: Record<FunctionName, RunningFunction>,
  deliveries: Deliveries,
): Promise<'adapter' | 'local'> {
  const kinds = consumerKindsFromEnv(process.env);
  const resources = watchedResources(cluster.kc, kinds, deliveries.toMirrorSync, deliveries.toIdentityStatus);
  await waitForWatchCaches(
    cluster.kc,
    resources.map((r) => r.path),
  );
  if (await adapterBinary(s)) {
    await startAdapters(s, cluster.kubeconfigPath, adapterSources(kinds, functions));
    return 'adapter';
  }
  const local = await startLocalEventSource(cluster.kc, cluster.server, resources, {
    onError: (msg) => s.emit({ debug: false, component: 'events', subject: '', text: msg }),
  });
  s.cleanups.push(() => local.stop());
  return 'local';
}

/** The two ApiServerSources of the manifests, as [name, sink URL, config]. */
function adapterSources(
  kinds: readonly ConsumerKind[],
  functions: Record<FunctionName, RunningFunction>,
): [string, string, SourceConfig][] {
  const gvr = (Group: string, Version: string, Resource: string) => ({ gvr: { Group, Version, Resource } });
  const objects = [
    ...kinds.map((k) => gvr(k.group, k.version, k.plural)),
    gvr(GROUP, VERSION, IDENTITY_PLURAL),
    gvr('', 'v1', 'namespaces'),
  ];
  const config = (resources: SourceConfig['resources']): SourceConfig => ({
    namespaces: [],
    allNamespaces: true,
    mode: 'Reference',
    resources,
  });
  return [
    ['captf-objects', functions['mirror-sync'].url, config(objects)],
    ['captf-identities', functions['identity-status'].url, config([gvr(GROUP, VERSION, IDENTITY_PLURAL)])],
  ];
}

/** Starts one adapter per source, each once its reflectors start, then waits out their first list. */
async function startAdapters(
  s: Startup,
  kubeconfigPath: string,
  sources: [string, string, SourceConfig][],
): Promise<void> {
  for (const [name, sink, source] of sources) {
    const adapter = await startApiServerSourceAdapter({
      kubeconfigPath,
      sink: `${sink}/`,
      source,
      name,
      onLog: (l) => {
        s.opts.onRawLine?.(`adapter ${name}`, l);
        s.emit(adapterLine(name, l));
      },
    });
    s.cleanups.push(() => adapter.stop());
    // startApiServerSourceAdapter resolves at the first STARTING line, before discovery;
    // the reflectors start after "Starting in … mode".
    const deadline = Date.now() + 30_000;
    while (!adapter.logs.some((l) => /Starting in (resilient|fail-fast) mode/.test(l)) && Date.now() < deadline)
      await sleep(50);
  }
  // Their first list/watch round trip; objects created before it ends produce no event.
  await sleep(1000);
}

/** Step 9: PingSource ticks. */
function schedulePings(s: Startup, deliveries: Deliveries): void {
  s.cleanups.push(schedulePing(deliveries.toIdentityStatus, PINGS.status, s.opts.statusEveryMs ?? 5 * 60_000));
  s.cleanups.push(schedulePing(deliveries.toMirrorSync, PINGS.resync, s.opts.resyncEveryMs ?? 10 * 60_000));
}

/** Sends one PingSource tick now and resolves when it was delivered (or given up on). */
async function ping(deliveries: Deliveries, which: keyof typeof PINGS): Promise<void> {
  const d = which === 'status' ? deliveries.toIdentityStatus : deliveries.toMirrorSync;
  d.send(pingMessage(PINGS[which]));
  await d.idle();
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
