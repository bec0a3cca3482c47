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
 *   ApiServerSource as Knative's controller would, sending to the bench's {@link Relay}.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import { buildBundles } from '../build.ts';
import { REPO_ROOT } from '../controlplane/build.ts';
import { startControlPlane, type ControlPlane } from '../controlplane/controlplane.ts';
import { installCRDs } from '../controlplane/crds.ts';
import { createCA, createLeaf } from '../controlplane/pki.ts';
import {
  sourceConfigFor,
  startApiServerSourceAdapter,
  type ApiServerSourceSpec,
  type RunningAdapter,
} from '../knative.ts';
import { render } from '../kustomize.ts';
import { warmCompileCache } from '../warm-compile-cache.ts';
import { BenchClient } from './client.ts';
import { AuditLog } from './measure.ts';
import { Relay } from './relay.ts';

/** The functions of `dist/main.mjs`. */
export type FunctionName = 'admission' | 'mirror-sync' | 'identity-status';

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

/** A running function process. */
export interface FunctionProcess {
  name: FunctionName;
  /** `http(s)://127.0.0.1:<port>` */
  url: string;
  pid: number;
  child: ChildProcess;
  /** Milliseconds from spawn to the `listening` line. */
  listenedMs: number;
  /** SIGTERM, SIGKILL after 10 s. */
  stop(): Promise<void>;
}

/** Everything a row needs. */
export interface BenchSystem {
  dir: string;
  cp: ControlPlane;
  /** The bench's admin client (setup, baselines, metrics). */
  admin: BenchClient;
  audit: AuditLog;
  relay: Relay;
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
  const cleanups: (() => Promise<void> | void)[] = [];
  const stop = async () => {
    for (const c of cleanups.splice(0).reverse()) await Promise.resolve(c()).catch(() => undefined);
  };
  try {
    log('building the production bundles and warming their compile cache');
    const app = join(dir, 'app');
    const built = await buildBundles({ outdir: join(app, 'dist') });
    const compileCache = join(app, 'compile-cache');
    await warmCompileCache(compileCache, built.outdir);

    log('starting the control plane');
    const cp = await startControlPlane({ dir: join(dir, 'controlplane'), log, auditLogMaxSizeMB: 100_000 });
    cleanups.push(() => cp.stop());
    const kc = new KubeConfig();
    kc.loadFromFile(cp.kubeconfigPath);
    await installCRDs(kc);
    const admin = new BenchClient(cp.kubeconfigPath, CLIENT_CONCURRENCY);
    cleanups.push(() => admin.close());

    log('rendering the manifests: RBAC, container settings and the ApiServerSource');
    const rendered = await render('manifests/overlays/without-crds');
    const kubeconfigs = {} as Record<keyof typeof USERS, string>;
    for (const [who, username] of Object.entries(USERS) as [keyof typeof USERS, string][]) {
      await bindAsUser(admin, rendered, SERVICE_ACCOUNTS[who], username);
      kubeconfigs[who] = await cp.userKubeConfig(username);
    }
    const containers = new Map<string, Container>();
    for (const o of rendered) {
      if (o.kind !== 'Service' || o.apiVersion !== 'serving.knative.dev/v1') continue;
      containers.set(
        o.metadata!.name!.replace(/^captf-/, ''),
        (o as unknown as { spec: { template: { spec: { containers: Container[] } } } }).spec.template.spec
          .containers[0]!,
      );
    }
    const memoryLimits = {} as Record<FunctionName, number>;
    for (const fn of ['admission', 'mirror-sync', 'identity-status'] as const) {
      const limit = containers.get(fn)?.resources?.limits?.memory;
      if (!limit) throw new Error(`the rendered Knative Service captf-${fn} sets no memory limit`);
      memoryLimits[fn] = quantityBytes(limit);
    }

    const pki = join(dir, 'webhook-pki');
    const ca = await createCA(pki, 'webhook-ca', 'captf-bench-webhook-ca');
    const leaf = await createLeaf({
      ca,
      dir: pki,
      name: 'admission',
      cn: 'captf-admission',
      sans: ['IP:127.0.0.1', 'DNS:localhost'],
      usage: 'server',
    });
    const functionEnv = (name: FunctionName): NodeJS.ProcessEnv => ({
      PATH: process.env.PATH,
      NODE_ENV: 'production',
      NODE_COMPILE_CACHE: compileCache,
      PORT: '0',
      HOST: '127.0.0.1',
      KUBECONFIG: kubeconfigs[name],
      ...Object.fromEntries((containers.get(name)?.env ?? []).map((e) => [e.name, e.value ?? ''])),
      ...(name === 'admission'
        ? { CAPTF_TLS_CERT_FILE: leaf.cert, CAPTF_TLS_KEY_FILE: leaf.key, CAPTF_ADMISSION_PLAIN_HTTP: 'false' }
        : {}),
    });
    let instance = 0;
    const startFunction = async (name: FunctionName): Promise<FunctionProcess> => {
      const fn = await spawnBundle(built.main, name, functionEnv(name), join(dir, 'logs', `${name}-${instance++}.log`));
      cleanups.push(() => fn.stop());
      return fn;
    };
    log('starting the functions');
    const functions = {
      admission: await startFunction('admission'),
      'mirror-sync': await startFunction('mirror-sync'),
      'identity-status': await startFunction('identity-status'),
    };

    const relay = await new Relay().start();
    cleanups.push(() => relay.stop());
    const source = rendered.find((o) => o.kind === 'ApiServerSource' && o.metadata?.name === 'captf-objects');
    if (!source) throw new Error('the rendered manifests hold no ApiServerSource captf-objects');
    log('starting the ApiServerSource adapter');
    const adapterLog = createWriteStream(join(dir, 'logs', 'adapter.log'));
    const adapter: RunningAdapter = await startApiServerSourceAdapter({
      kubeconfigPath: kubeconfigs['event-source'],
      sink: relay.url,
      source: await sourceConfigFor(kc, source as unknown as ApiServerSourceSpec),
      name: 'captf-objects',
      onLog: (l) => adapterLog.write(l + '\n'),
    });
    cleanups.push(() => adapter.stop());
    await adapterDelivering(admin, relay);

    return {
      dir,
      cp,
      admin,
      audit: new AuditLog(join(cp.dir, 'logs', 'audit.log')),
      relay,
      functions,
      startFunction,
      functionEnv,
      main: built.main,
      webhookCaPem: readFileSync(ca.cert, 'utf8'),
      memoryLimits,
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * Waits until the adapter's watches deliver: it is at-most-once and sends nothing for objects
 * that exist when its first list completes, so a row that created objects before then would
 * wait for events that never come. Touches a probe namespace until the relay receives an event.
 * @throws Error when no event arrives within 60 s.
 */
async function adapterDelivering(admin: BenchClient, relay: Relay): Promise<void> {
  const deadline = Date.now() + 60_000;
  relay.resetCounts();
  for (let i = 0; relay.counts.received === 0; i++) {
    if (Date.now() > deadline) throw new Error('the ApiServerSource adapter sent no event within 60 s');
    const body = { metadata: { name: 'captf-bench-probe', labels: { 'captf-bench/touch': String(i) } } };
    const r = await admin.raw('POST', '/api/v1/namespaces', body);
    if (r.status === 409)
      await admin.call(
        'PATCH',
        '/api/v1/namespaces/captf-bench-probe',
        { metadata: { labels: body.metadata.labels } },
        'application/merge-patch+json',
      );
    await new Promise((res) => setTimeout(res, 250));
  }
}

/**
 * Spawns `node <main> <name>` and resolves once it logged `listening` with its port.
 * @throws Error with the tail of its output when it exits or does not listen within 30 s.
 */
export async function spawnBundle(
  main: string,
  name: FunctionName,
  env: NodeJS.ProcessEnv,
  logPath: string,
): Promise<FunctionProcess> {
  const t0 = performance.now();
  const child = spawn(process.execPath, [main, name], { env, cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  // A bench that dies leaves no function behind.
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  child.once('exit', () => process.off('exit', killOnExit));
  const out = createWriteStream(logPath);
  const tail: string[] = [];
  let partial = '';
  let seen!: (v: { port: number; scheme: string }) => void;
  const listening = new Promise<{ port: number; scheme: string }>((r) => (seen = r));
  const onData = (d: Buffer) => {
    out.write(d);
    const lines = (partial + d.toString()).split('\n');
    partial = lines.pop() ?? '';
    for (const l of lines) {
      tail.push(l);
      if (tail.length > 20) tail.shift();
      if (!l.includes('"listening"')) continue;
      const j = JSON.parse(l) as { port: number; scheme?: string };
      seen({ port: j.port, scheme: j.scheme ?? 'http' });
    }
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const first = await Promise.race([
    listening,
    exited.then(() => 'exited' as const),
    new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), 30_000).unref()),
  ]);
  if (first === 'exited' || first === 'timeout') {
    child.kill('SIGKILL');
    throw new Error(
      `${name} ${first === 'exited' ? `exited (${child.exitCode ?? child.signalCode})` : 'did not listen within 30 s'}:\n${tail.join('\n')}`,
    );
  }
  const listenedMs = performance.now() - t0;
  return {
    name,
    url: `${first.scheme}://127.0.0.1:${first.port}`,
    pid: child.pid!,
    child,
    listenedMs,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        const t = setTimeout(() => child.kill('SIGKILL'), 10_000);
        await exited;
        clearTimeout(t);
      }
      out.end();
    },
  };
}
