/**
 * The system under measurement, started the way production runs it:
 * - a local control plane of its own (etcd, kube-apiserver, kube-controller-manager), with
 *   an audit log that does not rotate during a run;
 * - each function as its production bundle (`node dist/main.mjs <function>` with a warmed
 *   compile cache, as the image starts it), with the environment its Knative Service sets,
 *   as its own client-certificate user bound to the ClusterRoles its ServiceAccount gets in
 *   the rendered manifests (so the audit log attributes every request, and the bench
 *   exercises the least-privilege roles);
 * - Knative's real ApiServerSource adapter, configured from the rendered `captf-objects`
 *   ApiServerSource as Knative's controller would, and Knative's real Broker data plane
 *   (scripts/eventing/dataplane.ts) with the rendered Broker and Triggers, each function behind the
 *   bench's {@link Front}; {@link EventPaths} switches the adapter between the function and
 *   the Broker, and the Broker's channel between serial and concurrent delivery.
 */
import { createWriteStream, mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import { buildBundles } from '../lib/bundles.ts';
import { startControlPlane, type ControlPlane } from '../controlplane/controlplane.ts';
import { installCRDs } from '../controlplane/crds.ts';
import { createWebhookPair, type CertPair } from '../controlplane/pki.ts';
import { sourceConfigFor, type ApiServerSourceSpec, type SourceConfig } from '../eventing/adapter.ts';
import { render } from '../tools/kustomize.ts';
import { spawnFunction, type FunctionProcess } from '../lib/process.ts';
import { warmCompileCache } from '../lib/warm-compile-cache.ts';
import { BenchClient } from './client.ts';
import type { FunctionName } from '../system/system.ts';
import { bothSettled } from '../lib/wait.ts';
import { AuditLog } from './measure.ts';
import { EventPaths } from './paths.ts';

/** The functions of `dist/main.mjs` (one list of them, scripts/system/system.ts). */
export type { FunctionName };

/** Sockets of the bench's own kept-alive client: the client concurrency of every baseline and setup step. */
export const CLIENT_CONCURRENCY = 8;

/** Username of each function's client certificate (audit log `user.username`). */
export const USERS: Record<FunctionName | 'event-source', string> = {
  admission: 'captf-bench:admission',
  'mirror-sync': 'captf-bench:mirror-sync',
  'identity-status': 'captf-bench:identity-status',
  'event-source': 'captf-bench:event-source',
};

/** The ServiceAccount whose RBAC each user gets (manifests/base/rbac). */
const SERVICE_ACCOUNTS: Record<keyof typeof USERS, string> = {
  admission: 'captf-admission',
  'mirror-sync': 'captf-mirror-sync',
  'identity-status': 'captf-identity-status',
  'event-source': 'captf-event-sources',
};

/** A running function process (scripts/lib/process.ts); `stop()` also closes its log file. */
export type { FunctionProcess } from '../lib/process.ts';

/** Everything a row needs. */
export interface BenchSystem {
  dir: string;
  cp: ControlPlane;
  /** The bench's admin client (setup, baselines, metrics). */
  admin: BenchClient;
  audit: AuditLog;
  /** The adapter, the Broker's data plane, the functions' fronts and the delivery path in use. */
  events: EventPaths;
  /** The first instance of each function. */
  functions: Record<FunctionName, FunctionProcess>;
  /** Starts another instance of a function (cold-start row, two-instance row). */
  startFunction(name: FunctionName): Promise<FunctionProcess>;
  /** Environment a function bundle is started with (for the cold-start row's own spawns). */
  functionEnv(name: FunctionName): NodeJS.ProcessEnv;
  /** Path of `dist/main.mjs`. */
  main: string;
  /** PEM of the CA that signed the admission function's serving certificate. */
  webhookCaPem: string;
  /** Memory limit of each function's container in the rendered manifests, in bytes. */
  memoryLimits: Record<FunctionName, number>;
  stop(): Promise<void>;
}

interface Container {
  env?: { name: string; value?: string }[];
  resources?: { limits?: { memory?: string } };
}

/** Every function, in start order. */
const FUNCTIONS = ['admission', 'mirror-sync', 'identity-status'] as const;

/** Undo actions, run in reverse by {@link runCleanups}. */
type Cleanups = (() => Promise<void> | void)[];

/** Parses a Kubernetes memory quantity (`192Mi`, `1Gi`, `500M`) into bytes. */
export function quantityBytes(q: string): number {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|K|M|G)?$/.exec(q);
  if (!m) throw new Error(`unsupported quantity ${q}`);
  const mult: Record<string, number> = { Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, K: 1e3, M: 1e6, G: 1e9 };
  return Number(m[1]) * (m[2] ? mult[m[2]]! : 1);
}

/**
 * Grants `username` every ClusterRole the rendered manifests bind to ServiceAccount `sa`.
 * @throws the API error when the API server refuses an object.
 */
async function bindAsUser(
  admin: BenchClient,
  rendered: readonly KubernetesObject[],
  sa: string,
  username: string,
): Promise<void> {
  const bindings = rendered.filter((o) => o.kind === 'ClusterRoleBinding') as (KubernetesObject & {
    roleRef: { name: string };
    subjects?: { kind: string; name: string }[];
  })[];
  for (const b of bindings) {
    if (!b.subjects?.some((s) => s.kind === 'ServiceAccount' && s.name === sa)) continue;
    const role = rendered.find((o) => o.kind === 'ClusterRole' && o.metadata?.name === b.roleRef.name);
    if (!role) throw new Error(`rendered manifests bind ${sa} to missing ClusterRole ${b.roleRef.name}`);
    await admin.raw('POST', '/apis/rbac.authorization.k8s.io/v1/clusterroles', {
      ...role,
      metadata: { name: role.metadata!.name },
    });
    await admin.call('POST', '/apis/rbac.authorization.k8s.io/v1/clusterrolebindings', {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRoleBinding',
      metadata: { name: `${b.metadata!.name}-bench` },
      roleRef: b.roleRef,
      subjects: [{ kind: 'User', apiGroup: 'rbac.authorization.k8s.io', name: username }],
    });
  }
}

/**
 * Starts the whole system in `dir` (wiped first).
 * @param log progress lines.
 * @throws Error naming the step that failed; whatever started is stopped first.
 */
export async function startBenchSystem(dir: string, log: (line: string) => void): Promise<BenchSystem> {
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(join(dir, 'logs'), { recursive: true });
  const cleanups: Cleanups = [];
  const stop = () => runCleanups(cleanups);
  try {
    log('building the production bundles (meanwhile: the control plane and the Broker data plane)');
    const [app, { cp, kc, admin, rendered, events }] = await bothSettled(
      buildApp(dir),
      clusterAndBroker(dir, log, cleanups),
    );
    log('RBAC, container settings and the ApiServerSource from the rendered manifests');
    const kubeconfigs = await bindUsers(admin, rendered, cp);
    const containers = knativeContainers(rendered);
    const webhook = await createWebhookPair(join(dir, 'webhook-pki'), 'captf-bench-webhook-ca');
    const functionEnv = (name: FunctionName) =>
      bundleEnv({ name, ...app, kubeconfig: kubeconfigs[name], container: containers.get(name), leaf: webhook.leaf });
    const startFunction = functionStarter({ dir, main: app.main, functionEnv, cleanups });
    log('starting the functions');
    const functions = {} as Record<FunctionName, FunctionProcess>;
    for (const name of FUNCTIONS) functions[name] = await startFunction(name);
    log('starting the ApiServerSource adapter');
    await events.connect({
      kubeconfig: kubeconfigs['event-source'],
      source: await adapterSource(kc, rendered),
      functions,
      containerConcurrency: {
        'mirror-sync': containerConcurrency(rendered, 'mirror-sync'),
        'identity-status': containerConcurrency(rendered, 'identity-status'),
      },
    });
    return {
      dir,
      cp,
      admin,
      audit: new AuditLog(join(cp.dir, 'logs', 'audit.log')),
      events,
      functions,
      startFunction,
      functionEnv,
      main: app.main,
      webhookCaPem: webhook.caPem,
      memoryLimits: memoryLimits(containers),
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Runs every cleanup once, newest first, ignoring their errors. */
async function runCleanups(cleanups: Cleanups): Promise<void> {
  for (const c of cleanups.splice(0).reverse()) await Promise.resolve(c()).catch(() => undefined);
}

/** The production bundles in `<dir>/app/dist` and their warmed compile cache. */
async function buildApp(dir: string): Promise<{ main: string; compileCache: string }> {
  const app = join(dir, 'app');
  const built = await buildBundles({ outdir: join(app, 'dist') });
  const compileCache = join(app, 'compile-cache');
  await warmCompileCache(compileCache, built.outdir);
  return { main: built.main, compileCache };
}

/** The control plane with the CRDs, and the bench's admin client. */
async function startCluster(
  dir: string,
  log: (line: string) => void,
  cleanups: Cleanups,
): Promise<{ cp: ControlPlane; kc: KubeConfig; admin: BenchClient }> {
  const cp = await startControlPlane({ dir: join(dir, 'controlplane'), log, auditLogMaxSizeMB: 100_000 });
  cleanups.push(() => cp.stop());
  const kc = new KubeConfig();
  kc.loadFromFile(cp.kubeconfigPath);
  await installCRDs(kc);
  const admin = new BenchClient(cp.kubeconfigPath, CLIENT_CONCURRENCY);
  cleanups.push(() => admin.close());
  return { cp, kc, admin };
}

/** Each {@link USERS} user, bound to its ServiceAccount's roles; returns their kubeconfigs. */
async function bindUsers(
  admin: BenchClient,
  rendered: readonly KubernetesObject[],
  cp: ControlPlane,
): Promise<Record<keyof typeof USERS, string>> {
  const kubeconfigs = {} as Record<keyof typeof USERS, string>;
  for (const [who, username] of Object.entries(USERS) as [keyof typeof USERS, string][]) {
    await bindAsUser(admin, rendered, SERVICE_ACCOUNTS[who], username);
    kubeconfigs[who] = await cp.userKubeConfig(username);
  }
  return kubeconfigs;
}

/** The container of each rendered Knative Service, by function name. */
function knativeContainers(rendered: readonly KubernetesObject[]): Map<string, Container> {
  const containers = new Map<string, Container>();
  for (const o of rendered) {
    if (o.kind !== 'Service' || o.apiVersion !== 'serving.knative.dev/v1') continue;
    containers.set(
      o.metadata!.name!.replace(/^captf-/, ''),
      (o as unknown as { spec: { template: { spec: { containers: Container[] } } } }).spec.template.spec.containers[0]!,
    );
  }
  return containers;
}

/** `spec.template.spec.containerConcurrency` of a function's rendered Knative Service (0 when unset: no limit). */
function containerConcurrency(rendered: readonly KubernetesObject[], fn: FunctionName): number {
  const svc = rendered.find(
    (o) => o.kind === 'Service' && o.apiVersion === 'serving.knative.dev/v1' && o.metadata?.name === `captf-${fn}`,
  ) as { spec?: { template?: { spec?: { containerConcurrency?: number } } } } | undefined;
  return svc?.spec?.template?.spec?.containerConcurrency ?? 0;
}

/** Each function container's memory limit, in bytes. @throws Error when one sets none. */
function memoryLimits(containers: Map<string, Container>): Record<FunctionName, number> {
  const limits = {} as Record<FunctionName, number>;
  for (const fn of FUNCTIONS) {
    const limit = containers.get(fn)?.resources?.limits?.memory;
    if (!limit) throw new Error(`the rendered Knative Service captf-${fn} sets no memory limit`);
    limits[fn] = quantityBytes(limit);
  }
  return limits;
}

/** The environment a function bundle is started with: its Knative Service's, as its own user. */
function bundleEnv(opts: {
  name: FunctionName;
  compileCache: string;
  kubeconfig: string;
  container: Container | undefined;
  leaf: CertPair;
}): NodeJS.ProcessEnv {
  return {
    PATH: process.env.PATH,
    NODE_ENV: 'production',
    NODE_COMPILE_CACHE: opts.compileCache,
    PORT: '0',
    HOST: '127.0.0.1',
    KUBECONFIG: opts.kubeconfig,
    ...Object.fromEntries((opts.container?.env ?? []).map((e) => [e.name, e.value ?? ''])),
    ...(opts.name === 'admission'
      ? { CAPTF_TLS_CERT_FILE: opts.leaf.cert, CAPTF_TLS_KEY_FILE: opts.leaf.key, CAPTF_ADMISSION_PLAIN_HTTP: 'false' }
      : {}),
  };
}

/** Starts instances of functions, each logging to `<dir>/logs/<name>-<n>.log`, stopped with the system. */
function functionStarter(opts: {
  dir: string;
  main: string;
  functionEnv: (name: FunctionName) => NodeJS.ProcessEnv;
  cleanups: Cleanups;
}): (name: FunctionName) => Promise<FunctionProcess> {
  let instance = 0;
  return async (name) => {
    const logPath = join(opts.dir, 'logs', `${name}-${instance++}.log`);
    const fn = await spawnBundle({ main: opts.main, name, env: opts.functionEnv(name), logPath });
    opts.cleanups.push(() => fn.stop());
    return fn;
  };
}

/** The control plane, the rendered manifests, and the functions' fronts with the Broker's data plane. */
async function clusterAndBroker(dir: string, log: (line: string) => void, cleanups: Cleanups) {
  log('starting the control plane');
  const cluster = await startCluster(dir, log, cleanups);
  const rendered = await render('manifests/overlays/without-crds');
  const events = await EventPaths.start({
    dir,
    kc: cluster.kc,
    adminKubeconfig: cluster.cp.kubeconfigPath,
    rendered,
    admin: cluster.admin,
    log,
  });
  cleanups.push(() => events.stop());
  return { ...cluster, rendered, events };
}

/** The adapter's configuration, from the rendered `captf-objects` ApiServerSource as Knative's controller would. */
async function adapterSource(kc: KubeConfig, rendered: readonly KubernetesObject[]): Promise<SourceConfig> {
  const source = rendered.find((o) => o.kind === 'ApiServerSource' && o.metadata?.name === 'captf-objects');
  if (!source) throw new Error('the rendered manifests hold no ApiServerSource captf-objects');
  return sourceConfigFor(kc, source as unknown as ApiServerSourceSpec);
}

/**
 * Spawns `node <main> <name>` (scripts/lib/process.ts) with its output written to `logPath`, and
 * resolves once it logged `listening` with its port.
 * @throws Error with the tail of its output when it exits or does not listen within 30 s.
 */
export async function spawnBundle(opts: {
  main: string;
  name: FunctionName;
  env: NodeJS.ProcessEnv;
  logPath: string;
}): Promise<FunctionProcess> {
  const out = createWriteStream(opts.logPath);
  try {
    const fn = await spawnFunction({ name: opts.name, main: opts.main, env: opts.env, onData: (d) => out.write(d) });
    return {
      ...fn,
      async stop(graceMs) {
        await fn.stop(graceMs);
        out.end();
      },
    };
  } catch (err) {
    out.end();
    throw err;
  }
}
