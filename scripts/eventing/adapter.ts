/**
 * Knative and cert-manager pieces for tests, built or fetched through the Go module proxy
 * with the control-plane tools (scripts/tools/build.ts):
 * - Knative Eventing's ApiServerSource receive adapter, built from
 *   `knative.dev/eventing/cmd/apiserver_receive_adapter` (wrapper module
 *   scripts/tools/go/knative, cached in `.cache/knative/…`), and a helper that runs
 *   it against a kubeconfig so tests see the CloudEvents a real cluster would send;
 * - the real CRDs of Knative Serving/Eventing and cert-manager, read from the module cache
 *   at the versions pinned in scripts/tools/go/crds/go.mod, and installed into a
 *   control plane so manifests can be server-side dry-run against them (SPEC §13).
 *
 * `npm run knative:build` builds kustomize, the adapter and the Eventing data plane
 * (scripts/eventing/build.ts) ahead of time and fetches the CRDs.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import {
  KubernetesObjectApi,
  loadAllYaml,
  type KubeConfig,
  type V1CustomResourceDefinition,
} from '@kubernetes/client-node';
import { REPO_ROOT, pinnedVersion, type GoTool } from '../tools/build.ts';
import { freePort } from '../controlplane/controlplane.ts';
import { applyCRDs } from '../controlplane/crds.ts';
import { ensureGoBinary } from '../tools/build-lock.ts';

const execFileP = promisify(execFile);

/** The receive adapter's wrapper module (Knative Eventing 1.22 = knative.dev/eventing v0.49.x). */
export const KNATIVE_TOOLS: readonly GoTool[] = [
  {
    module: 'knative',
    versionOf: 'knative.dev/eventing',
    packages: ['knative.dev/eventing/cmd/apiserver_receive_adapter'],
  },
];

/**
 * Finds or builds the ApiServerSource receive adapter (about 4 minutes on two cores with an
 * empty Go cache; cached afterwards until the wrapper go.mod/go.sum change).
 * @param log progress lines (default stderr).
 * @returns the absolute path of the `apiserver_receive_adapter` binary.
 * @throws Error with the tail of the `go` output when the download or build fails.
 */
export function ensureApiServerSourceAdapter(log?: (line: string) => void): Promise<string> {
  return ensureGoBinary(KNATIVE_TOOLS, 'knative', 'apiserver_receive_adapter', log);
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
  /** Time to wait for the adapter to start its watches, in ms (default 60 000). */
  timeoutMs?: number;
}

/** A running adapter. */
export interface RunningAdapter {
  process: ChildProcess;
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
 * @throws Error with the adapter's last log lines when it exits or does not start in time.
 */
export async function startApiServerSourceAdapter(opts: AdapterOptions): Promise<RunningAdapter> {
  const bin = await ensureApiServerSourceAdapter();
  const env = adapterEnv(opts, await freePort());
  const child = spawn(bin, [], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  const logs: string[] = [];
  let started!: () => void;
  const startedP = new Promise<void>((r) => (started = r));
  const onData = (() => {
    let partial = '';
    return (d: Buffer) => {
      const lines = (partial + d.toString()).split('\n');
      partial = lines.pop() ?? '';
      for (const l of lines) {
        logs.push(l);
        opts.onLog?.(l);
        if (l.includes('STARTING -- ')) started();
      }
    };
  })();
  child.stdout.on('data', onData);
  child.stderr.on('data', onData);
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill('SIGTERM');
    const t = setTimeout(() => child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(t);
  };
  process.once('exit', () => child.kill('SIGKILL'));
  const timeoutMs = opts.timeoutMs ?? 60_000;
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
  return { process: child, logs, stop };
}

/** Third-party CRD files and the pinned module they come from. */
export interface CrdSource {
  module: string;
  files: string[];
}

/**
 * The CRDs the manifests use, by module (paths inside the module). Knative Serving's
 * Service; Eventing's ApiServerSource, PingSource, Broker, Trigger; cert-manager's Issuer
 * and Certificate.
 */
export const THIRD_PARTY_CRDS: readonly CrdSource[] = [
  { module: 'knative.dev/serving', files: ['config/core/300-resources/service.yaml'] },
  {
    module: 'knative.dev/eventing',
    files: ['apiserversource', 'pingsource', 'broker', 'trigger'].map((n) => `config/core/resources/${n}.yaml`),
  },
  {
    module: 'github.com/cert-manager/cert-manager',
    files: ['cert-manager.io_issuers.yaml', 'cert-manager.io_certificates.yaml'].map((n) => `deploy/crds/${n}`),
  },
];

const CRDS_MODULE_DIR = join(REPO_ROOT, 'scripts', 'tools', 'go', 'crds');

/**
 * Pinned version of a module in scripts/tools/go/crds/go.mod.
 * @throws Error when it is not required there.
 */
export function pinnedCrdModuleVersion(module: string): string {
  return pinnedVersion({ module: 'crds', versionOf: module, packages: [] });
}

/**
 * Downloads (or finds in the module cache) each pinned module and parses its CRD files.
 * @param sources which files of which modules (default {@link THIRD_PARTY_CRDS}).
 * @returns the CRDs, each with the module@version it came from.
 * @throws Error when `go mod download` fails (the module proxy does not serve a version).
 */
export async function loadThirdPartyCRDs(
  sources: readonly CrdSource[] = THIRD_PARTY_CRDS,
): Promise<{ source: string; crd: V1CustomResourceDefinition }[]> {
  const out: { source: string; crd: V1CustomResourceDefinition }[] = [];
  for (const src of sources) {
    const { stdout } = await execFileP('go', ['mod', 'download', '-json', src.module], {
      cwd: CRDS_MODULE_DIR,
      env: { ...process.env, GOFLAGS: '-mod=readonly' },
      maxBuffer: 1 << 20,
    }).catch((err: { stdout?: string; message: string }) => {
      throw new Error(`go mod download ${src.module} (in ${CRDS_MODULE_DIR}): ${err.stdout || err.message}`);
    });
    const info = JSON.parse(stdout) as { Dir?: string; Version: string; Error?: string };
    if (!info.Dir) throw new Error(`go mod download ${src.module}: ${info.Error ?? 'no Dir'}`);
    for (const f of src.files) {
      for (const doc of loadAllYaml(readFileSync(join(info.Dir, f), 'utf8')) as V1CustomResourceDefinition[]) {
        if (doc?.kind === 'CustomResourceDefinition')
          out.push({ source: `${src.module}@${info.Version}/${f}`, crd: doc });
      }
    }
  }
  return out;
}

/**
 * Installs the third-party CRDs with the project's {@link applyCRDs} (server-side apply,
 * then Established and serving lists).
 * @returns the CRD names installed.
 * @throws Error when the API server rejects one or it is not ready in `timeoutMs`.
 */
export async function installThirdPartyCRDs(kc: KubeConfig, timeoutMs = 60_000): Promise<string[]> {
  return applyCRDs(
    kc,
    (await loadThirdPartyCRDs()).map((c) => c.crd),
    timeoutMs,
  );
}

/**
 * The CRDs Knative Eventing's broker data plane reads or writes (scripts/eventing/dataplane.ts): Broker,
 * Trigger, EventPolicy, EventType, Subscription (the ingress, filter and dispatcher watch
 * them), PingSource, ApiServerSource, and the InMemoryChannel, all from knative.dev/eventing
 * at the version pinned in scripts/tools/go/crds/go.mod.
 */
export const EVENTING_CRDS: readonly CrdSource[] = [
  {
    module: 'knative.dev/eventing',
    files: [
      ...['broker', 'trigger', 'eventpolicy', 'eventtype', 'subscription', 'pingsource', 'apiserversource'].map(
        (n) => `config/core/resources/${n}.yaml`,
      ),
      'config/channels/in-memory-channel/resources/in-memory-channel.yaml',
    ],
  },
];

/**
 * Installs {@link EVENTING_CRDS} with {@link applyCRDs}. Idempotent, and safe beside
 * {@link installThirdPartyCRDs} (and a concurrent call): both apply the same files with the
 * same field manager, so the CRDs they share come out unchanged.
 * @returns the CRD names installed.
 * @throws Error when the API server rejects one or it is not ready in `timeoutMs`.
 */
export async function installEventingCRDs(kc: KubeConfig, timeoutMs = 60_000): Promise<string[]> {
  return applyCRDs(
    kc,
    (await loadThirdPartyCRDs(EVENTING_CRDS)).map((c) => c.crd),
    timeoutMs,
  );
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { ensureKustomize } = await import('../tools/kustomize.ts');
  console.log(`kustomize: ${await ensureKustomize()}`);
  console.log(`apiserver_receive_adapter: ${await ensureApiServerSourceAdapter()}`);
  const { ensureEventingDataPlane } = await import('./build.ts');
  for (const [component, path] of Object.entries(await ensureEventingDataPlane()))
    console.log(`eventing ${component}: ${path}`);
  const crds = [...(await loadThirdPartyCRDs()), ...(await loadThirdPartyCRDs(EVENTING_CRDS))];
  for (const source of new Set(crds.map((c) => c.source))) console.log(`CRD: ${source}`);
}
