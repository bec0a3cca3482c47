/**
 * Knative Eventing's ApiServerSource receive adapter (`knative.dev/eventing/cmd/apiserver_receive_adapter`,
 * tool set `knative` of scripts/tools/registry.ts), and a helper that runs it against a
 * kubeconfig so tests see the CloudEvents a real cluster would send.
 */
import { spawn } from 'node:child_process';
import { KubernetesObjectApi, type KubeConfig } from '@kubernetes/client-node';
import { freePort } from '../lib/ports.ts';
import { onLines, stopProcess } from '../lib/process.ts';
import { ensureTool } from '../tools/build.ts';

/**
 * Finds or builds the ApiServerSource receive adapter (about 4 minutes on two cores with an
 * empty Go cache); see {@link ensureTool}.
 * @returns the absolute path of the `apiserver_receive_adapter` binary.
 */
export function ensureApiServerSourceAdapter(log?: (line: string) => void): Promise<string> {
  return ensureTool('knative', 'apiserver_receive_adapter', log);
}

/** One watched resource of an ApiServerSource (`K_SOURCE_CONFIG.resources[]`). */
export interface SourceResource {
  /** Group, version and plural resource; `Group: ''` for the core group. */
  gvr: { Group: string; Version: string; Resource: string };
  /** Optional label selector, e.g. `captf.io/identity-source=true`. */
  selector?: string;
}

/**
 * `K_SOURCE_CONFIG` of the adapter (knative.dev/eventing pkg/adapter/apiserver Config).
 * `namespaces` is ignored for cluster-scoped resources; `allNamespaces` watches every namespace.
 */
export interface SourceConfig {
  namespaces: string[];
  allNamespaces: boolean;
  resources: SourceResource[];
  /** `Reference` (data = object reference) or `Resource` (data = the object). */
  mode: 'Reference' | 'Resource';
}

/** The part of an ApiServerSource (sources.knative.dev/v1) the adapter's configuration comes from. */
export interface ApiServerSourceSpec {
  metadata?: { namespace?: string };
  spec: {
    mode?: string;
    namespaceSelector?: { matchLabels?: Record<string, string>; matchExpressions?: unknown[] };
    resources: { apiVersion: string; kind: string; selector?: { matchLabels?: Record<string, string> } }[];
  };
}

/** A label selector as the adapter takes it (`k=v,…`). @throws Error for matchExpressions. */
function labels(s?: { matchLabels?: Record<string, string>; matchExpressions?: unknown[] }): string {
  if (s?.matchExpressions?.length) throw new Error('matchExpressions are not supported here');
  return Object.entries(s?.matchLabels ?? {})
    .map(([k, v]) => `${k}=${v}`)
    .join(',');
}

/** One resource of an ApiServerSource as a GVR (plural from discovery) with its label selector. */
async function sourceResource(
  disco: Discovery,
  r: ApiServerSourceSpec['spec']['resources'][number],
): Promise<SourceResource> {
  const res = await disco.plural(r.apiVersion, r.kind);
  if (!res) throw new Error(`the API server does not serve ${r.apiVersion} ${r.kind}`);
  const [group, version] = r.apiVersion.includes('/')
    ? (r.apiVersion.split('/') as [string, string])
    : ['', r.apiVersion];
  const selector = labels(r.selector);
  return { gvr: { Group: group, Version: version, Resource: res.name }, ...(selector ? { selector } : {}) };
}

/** Exposes client-node's discovery (kind → plural resource) for {@link sourceConfigFor}. */
class Discovery extends KubernetesObjectApi {
  plural(apiVersion: string, kind: string): Promise<{ name: string } | undefined> {
    return this.resource(apiVersion, kind);
  }
}

/**
 * Builds the adapter's `K_SOURCE_CONFIG` from an ApiServerSource the way Knative's
 * controller does (knative.dev/eventing pkg/reconciler/apiserversource): resources become
 * GVRs (plural from discovery), `matchLabels` become label selectors, an empty
 * `namespaceSelector` watches every namespace and no selector watches the source's own.
 * @throws Error when discovery does not know a kind, or for selectors it cannot express
 *   (matchExpressions; only what the manifests use is supported).
 */
export async function sourceConfigFor(kc: KubeConfig, source: ApiServerSourceSpec): Promise<SourceConfig> {
  const disco = kc.makeApiClient(Discovery);
  const resources: SourceResource[] = [];
  for (const r of source.spec.resources) resources.push(await sourceResource(disco, r));
  const ns = source.spec.namespaceSelector;
  const all = ns !== undefined && !labels(ns);
  if (ns && !all) throw new Error('namespaceSelector with labels is not supported here');
  return {
    namespaces: all ? [] : [source.metadata?.namespace ?? 'default'],
    allNamespaces: all,
    resources,
    mode: source.spec.mode === 'Resource' ? 'Resource' : 'Reference',
  };
}

/** Options of {@link startApiServerSourceAdapter}. */
export interface AdapterOptions {
  /** Kubeconfig the adapter lists and watches with (its RBAC is what it can see). */
  kubeconfigPath: string;
  /** Where CloudEvents go (HTTP URL, binary mode). */
  sink: string;
  source: SourceConfig;
  /** `NAME` of the ApiServerSource (default `captf-test`). */
  name?: string;
  /** `NAMESPACE` of the ApiServerSource (default `captf-system`). */
  namespace?: string;
  /** Receives each adapter log line (JSON, from zap). */
  onLog?: (line: string) => void;
  /** Added to the adapter's environment (e.g. `{ GODEBUG: 'netdns=go+2' }`: Go logs each name lookup). */
  env?: Readonly<Record<string, string>>;
}

/** A running adapter. */
export interface RunningAdapter {
  /** Every log line so far. */
  logs: string[];
  /** SIGTERM, then SIGKILL after 5 s; resolves when it exited. Idempotent. */
  stop(): Promise<void>;
}

/**
 * The environment the pinned adapter reads (knative.dev/eventing v0.49 pkg/adapter/v2
 * EnvConfig + pkg/adapter/apiserver): `K_SOURCE_CONFIG`, `K_SINK`, `NAME`, `NAMESPACE`,
 * `K_LOGGING_CONFIG`, `K_OBSERVABILITY_CONFIG` (v0.46+; replaces `K_METRICS_CONFIG`),
 * `SYSTEM_NAMESPACE`, `KUBECONFIG`, and `PROFILING_PORT` (its pprof server, default 8008,
 * moved to a free port so several adapters can run on one machine).
 */
export function adapterEnv(opts: AdapterOptions, profilingPort: number): NodeJS.ProcessEnv {
  return {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    KUBECONFIG: opts.kubeconfigPath,
    K_SOURCE_CONFIG: JSON.stringify(opts.source),
    K_SINK: opts.sink,
    NAME: opts.name ?? 'captf-test',
    NAMESPACE: opts.namespace ?? 'captf-system',
    K_LOGGING_CONFIG: '{}',
    K_OBSERVABILITY_CONFIG: '{}',
    SYSTEM_NAMESPACE: 'knative-eventing',
    PROFILING_PORT: String(profilingPort),
    ...opts.env,
  };
}

/**
 * Starts the ApiServerSource receive adapter against a kubeconfig, outside any cluster, and
 * resolves once it logged that its watches are starting (`STARTING -- …`).
 *
 * What to know when using it:
 * - Its health probes listen on :8080, hard-coded upstream; when the port is taken the probe
 *   server fails quietly and the adapter still works, so several can run at once.
 * - It is at-most-once: objects that exist when it starts produce no event, and an event
 *   whose delivery fails is logged and dropped. Its first list/watch may still be in flight
 *   when this resolves, so a test should change an object until its event arrives rather
 *   than expect the very first change to be seen.
 * - Leader election is off (the adapter only enables it when told to).
 * @returns the running adapter; call `stop()` when done.
 * @throws Error with the adapter's last log lines when it exits or does not start within 60 s.
 */
export async function startApiServerSourceAdapter(opts: AdapterOptions): Promise<RunningAdapter> {
  const bin = await ensureApiServerSourceAdapter();
  const env = adapterEnv(opts, await freePort());
  const child = spawn(bin, [], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  const logs: string[] = [];
  let started!: () => void;
  const startedP = new Promise<void>((r) => (started = r));
  const onLine = (l: string) => {
    logs.push(l);
    opts.onLog?.(l);
    if (l.includes('STARTING -- ')) started();
  };
  onLines(child.stdout!, onLine);
  onLines(child.stderr!, onLine);
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const stop = () => stopProcess(child, 5000);
  process.once('exit', () => child.kill('SIGKILL'));
  const timeoutMs = 60_000;
  let timer: NodeJS.Timeout | undefined;
  const outcome = await Promise.race([
    startedP.then(() => 'started' as const),
    exited.then(() => 'exited' as const),
    new Promise<'timeout'>((r) => (timer = setTimeout(() => r('timeout'), timeoutMs))),
  ]);
  clearTimeout(timer);
  if (outcome !== 'started') {
    await stop();
    throw new Error(
      `apiserver_receive_adapter ${outcome === 'exited' ? `exited (${child.exitCode ?? child.signalCode})` : `did not start in ${timeoutMs} ms`}:\n${logs.slice(-20).join('\n')}`,
    );
  }
  return { logs, stop };
}
