/**
 * Starts and stops a real local control plane — etcd, kube-apiserver and
 * kube-controller-manager on free loopback ports — for tests and the local mode (SPEC §14,
 * §15). Users authenticate with client certificates signed by `<dir>/pki/client-ca.*`
 * (CN = user, O = groups); authorization is Node,RBAC; the controller-manager runs the
 * controllers of {@link CONTROLLERS}: garbage collection, namespaces, Jobs, service accounts,
 * ClusterRole aggregation (so the built-in `admin`, `edit` and `view` grant what they do on a
 * cluster) and the `kube-root-ca.crt` ConfigMap of every namespace.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, mkdirSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import { createServer } from 'node:net';
import { join, resolve } from 'node:path';
import { KubeConfig, dumpYaml } from '@kubernetes/client-node';
import { isRunning, stopProcess } from '../lib/process.ts';
import { sleep } from '../lib/wait.ts';
import { ensureControlPlaneBinaries, type ControlPlaneBinaries } from '../tools/build.ts';
import { createCA, createLeaf, createServiceAccountKeys, type CertPair } from './pki.ts';

/**
 * Controllers the controller-manager runs (`--controllers`, names as kube-controller-manager
 * v1.36 `--help` lists them): those of a real cluster that this product's users and tests
 * touch. Each one costs CPU on a small machine shared by parallel test files, so the rest stay off
 * (the last two below cost about 0.2 s of CPU at start and a few ms per namespace made and
 * deleted, measured on two cores; nothing when idle).
 *
 * In:
 * - `garbage-collector-controller`: owner references really delete things (mirrors owned by consumers).
 * - `namespace-controller`: a deleted namespace really empties and goes (every test file's world).
 * - `job-controller`: Jobs get their Pods (test/integration/delivery.test.ts reads one).
 * - `serviceaccount-controller`: every namespace gets its `default` ServiceAccount, which
 *   those Pods run as (without it the API server refuses them).
 * - `serviceaccount-token-controller`: a Secret of type `kubernetes.io/service-account-token`
 *   gets its token, as on a cluster.
 * - `clusterrole-aggregation-controller`: fills the built-in `admin`, `edit` and `view`
 *   ClusterRoles, which are empty without it; users bound to them
 *   (`kubectl create rolebinding --clusterrole=edit`) get what a cluster gives
 *   (test/integration/controlplane-roles.test.ts).
 * - `root-ca-certificate-publisher-controller`: the `kube-root-ca.crt` ConfigMap in every
 *   namespace, which every Pod's service-account token volume names and a user listing
 *   ConfigMaps sees; one small write per new namespace.
 *
 * Out: `ttl-after-finished-controller` (no Job finishes: no kubelet runs Pods, and the
 * product's Jobs set no TTL); `pod-garbage-collector-controller` (Pods stay Pending on no
 * node); `resourcequota-controller` (nothing here creates a ResourceQuota, and it watches every
 * quota-able resource, a second garbage collector's worth of informers);
 * `disruption-controller` (no Pod runs, nothing evicts); the workload controllers
 * (deployment, replicaset, statefulset, daemonset, cronjob: the functions run as processes,
 * and the one Deployment a test makes has no replicas); endpoints and endpointslice (no
 * Services); `validatingadmissionpolicy-status-controller` (the API server enforces the tests'
 * ValidatingAdmissionPolicies itself; the controller only writes type-check warnings nobody
 * reads); the certificatesigningrequest ones (users are minted straight from the client CA);
 * the node, volume and cloud ones (no nodes, no volumes).
 */
export const CONTROLLERS = [
  'garbage-collector-controller',
  'namespace-controller',
  'job-controller',
  'serviceaccount-controller',
  'serviceaccount-token-controller',
  'clusterrole-aggregation-controller',
  'root-ca-certificate-publisher-controller',
];

/** Options of {@link startControlPlane}. */
export interface StartOptions {
  /** State folder (wiped on start): pki/, etcd data, logs/, kubeconfigs. */
  dir: string;
  /** Progress lines (build, start); defaults to stderr. */
  log?: (line: string) => void;
  /** Size at which the audit log rotates, in MB (default 200); the bench reads one unrotated log. */
  auditLogMaxSizeMB?: number;
}

/** A running control plane. */
export interface ControlPlane {
  dir: string;
  /** `https://127.0.0.1:<port>` */
  server: string;
  /** Kubeconfig of `admin` in group `system:masters`. */
  kubeconfigPath: string;
  binaries: ControlPlaneBinaries;
  /** Mints a client certificate for `name` in `groups` and writes a kubeconfig; returns its path. */
  userKubeConfig(name: string, groups?: readonly string[]): Promise<string>;
  /**
   * Fault injection (reliability tests): stops one component (SIGTERM, then SIGKILL), leaving
   * the others running. @throws Error for an unknown or already stopped component.
   */
  stopComponent(name: ControlPlaneComponent): Promise<void>;
  /**
   * Starts a stopped component again with the same arguments, ports and data; for
   * kube-apiserver, resolves once `/readyz` answers 200 again.
   */
  startComponent(name: ControlPlaneComponent): Promise<void>;
  /** Stops every process (SIGTERM, then SIGKILL after 10 s); idempotent. */
  stop(): Promise<void>;
}

/**
 * Returns a free TCP port (the OS picks it; a tiny race is accepted).
 * @param host the interface: 127.0.0.1 by default, `null` for every interface.
 */
export function freePort(host: string | null = '127.0.0.1'): Promise<number> {
  return new Promise((res, rej) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', rej);
    srv.listen({ port: 0, host: host ?? undefined }, () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? res(addr.port) : rej(new Error('no port'))));
    });
  });
}

/**
 * Writes a kubeconfig for a client-certificate user (data embedded, so the file stands alone).
 * @returns the path written.
 */
export function writeKubeConfig(
  path: string,
  { server, caPem, user, cert }: { server: string; caPem: string; user: string; cert: CertPair },
): string {
  const b64 = (p: string) => readFileSync(p).toString('base64');
  const config = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [
      { name: 'captf-local', cluster: { server, 'certificate-authority-data': Buffer.from(caPem).toString('base64') } },
    ],
    users: [{ name: user, user: { 'client-certificate-data': b64(cert.cert), 'client-key-data': b64(cert.key) } }],
    contexts: [{ name: `${user}@captf-local`, context: { cluster: 'captf-local', user } }],
    'current-context': `${user}@captf-local`,
  };
  writeFileSync(path, dumpYaml(config), { mode: 0o600 });
  return path;
}

function get(url: string, caPem: string, cert: CertPair): Promise<{ status: number; body: string }> {
  return new Promise((res, rej) => {
    const req = request(
      url,
      { ca: caPem, cert: readFileSync(cert.cert), key: readFileSync(cert.key), timeout: 5000 },
      (r) => {
        let body = '';
        r.on('data', (d: Buffer) => (body += d.toString()));
        r.on('end', () => res({ status: r.statusCode ?? 0, body }));
      },
    );
    req.on('error', rej);
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.end();
  });
}

const live = new Set<ChildProcess>();
// Last resort: a crashing parent must not leave etcd or the API server behind.
process.on('exit', () => {
  for (const c of live) c.kill('SIGKILL');
});

/** The certificates and keys of a control plane (in `<dir>/pki`). */
interface Pki {
  servingCA: CertPair;
  clientCA: CertPair;
  /** The service-account signing key pair. */
  sa: { key: string; pub: string };
  /** The API server's serving certificate. */
  serving: CertPair;
  /** Client certificate of `admin` in `system:masters`. */
  admin: CertPair;
  /** PEM of `servingCA`. */
  caPem: string;
}

/** Loopback ports of a control plane: etcd's client and peer ports, the API server's. */
type Ports = Record<'etcd' | 'peer' | 'api', number>;

/** A component process and its log file. */
interface Component {
  name: string;
  child: ChildProcess;
  logPath: string;
  bin: string;
  args: string[];
}

/** The processes a control plane runs. */
export type ControlPlaneComponent = 'etcd' | 'kube-apiserver' | 'kube-controller-manager';

/**
 * Starts etcd, kube-apiserver and (when available) kube-controller-manager in `opts.dir`,
 * building the binaries first if needed, and resolves once `/readyz` answers 200 (at most 2 minutes).
 * @throws Error naming the component and the tail of its log when a process exits early or
 *   readiness times out; everything started so far is stopped first.
 */
export async function startControlPlane(opts: StartOptions): Promise<ControlPlane> {
  const log = opts.log ?? ((l: string) => process.stderr.write(l + '\n'));
  const dir = resolve(opts.dir);
  const binaries = await ensureControlPlaneBinaries(log);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(join(dir, 'logs'), { recursive: true });
  const pki = await createPki(join(dir, 'pki'));
  const ports: Ports = { etcd: await freePort(), peer: await freePort(), api: await freePort() };
  const server = `https://127.0.0.1:${ports.api}`;
  const kubeconfigPath = writeKubeConfig(join(dir, 'admin.kubeconfig'), {
    server,
    caPem: pki.caPem,
    user: 'admin',
    cert: pki.admin,
  });
  writeAuditPolicy(dir);
  const components = newComponents(join(dir, 'logs'));
  try {
    components.start('etcd', binaries.etcd, etcdArgs(dir, ports));
    components.start('kube-apiserver', binaries.kubeApiserver, apiServerArgs(dir, ports, pki, opts.auditLogMaxSizeMB));
    await waitReady({ server, pki, components });
    if (binaries.kubeControllerManager)
      components.start(
        'kube-controller-manager',
        binaries.kubeControllerManager,
        controllerManagerArgs(kubeconfigPath, pki),
      );
    else
      log(
        '[controlplane] no kube-controller-manager in KUBEBUILDER_ASSETS: garbage collection will not run, and the built-in admin, edit and view ClusterRoles grant nothing',
      );
  } catch (err) {
    await components.stop();
    throw err;
  }
  return {
    dir,
    server,
    kubeconfigPath,
    binaries,
    userKubeConfig: (name: string, groups: readonly string[] = []) => userKubeConfig(dir, name, groups),
    stopComponent: (name) => components.stopOne(name),
    startComponent: async (name) => {
      components.restart(name);
      if (name === 'kube-apiserver') await waitReady({ server, pki, components });
    },
    stop: components.stop,
  };
}

/** The CAs, the service-account keys, the API server's serving certificate and admin's client certificate. */
async function createPki(pkiDir: string): Promise<Pki> {
  const [servingCA, clientCA, sa] = await Promise.all([
    createCA(pkiDir, 'ca', 'captf-local-ca'),
    createCA(pkiDir, 'client-ca', 'captf-local-client-ca'),
    createServiceAccountKeys(pkiDir),
  ]);
  const [serving, admin] = await Promise.all([
    createLeaf({
      ca: servingCA,
      dir: pkiDir,
      name: 'apiserver',
      cn: 'kube-apiserver',
      sans: ['IP:127.0.0.1', 'DNS:localhost'],
      usage: 'server',
    }),
    createLeaf({ ca: clientCA, dir: pkiDir, name: 'admin', cn: 'admin', orgs: ['system:masters'], usage: 'client' }),
  ]);
  return { servingCA, clientCA, sa, serving, admin, caPem: readFileSync(servingCA.cert, 'utf8') };
}

/** `<dir>/audit-policy.yaml`: every request at Metadata level. */
function writeAuditPolicy(dir: string): void {
  writeFileSync(
    join(dir, 'audit-policy.yaml'),
    dumpYaml({
      apiVersion: 'audit.k8s.io/v1',
      kind: 'Policy',
      omitStages: ['RequestReceived'],
      rules: [{ level: 'Metadata' }],
    }),
  );
}

/** The component processes of one control plane, started in order and stopped in reverse. */
type Components = ReturnType<typeof newComponents>;

/** Components that log to `<logDir>/<name>.log`. */
function newComponents(logDir: string) {
  const list: Component[] = [];
  let stopping = false;
  const spawnLogged = (name: string, bin: string, args: string[]): ChildProcess => {
    const fd = openSync(join(logDir, `${name}.log`), 'a');
    const child = spawn(bin, args, { stdio: ['ignore', fd, fd] });
    closeSync(fd);
    live.add(child);
    child.on('exit', () => live.delete(child));
    return child;
  };
  const find = (name: string): Component => {
    const c = list.find((x) => x.name === name);
    if (!c) throw new Error(`no control-plane component named ${name}`);
    return c;
  };
  return {
    list,
    start(name: string, bin: string, args: string[]): void {
      list.push({ name, child: spawnLogged(name, bin, args), logPath: join(logDir, `${name}.log`), bin, args });
    },
    /** Stops one component; it keeps its place (and arguments) in `list` for `restart`. */
    async stopOne(name: string): Promise<void> {
      const c = find(name);
      if (!isRunning(c.child)) throw new Error(`${name} is already stopped`);
      await stopProcess(c.child);
    },
    /** Starts a stopped component again with the arguments it had. */
    restart(name: string): void {
      const c = find(name);
      if (isRunning(c.child)) throw new Error(`${name} is running`);
      c.child = spawnLogged(name, c.bin, c.args);
    },
    /** Stops every process (SIGTERM, then SIGKILL after 10 s), newest first; idempotent. */
    async stop(): Promise<void> {
      if (stopping) return;
      stopping = true;
      // Reverse order: controller-manager and API server before etcd.
      for (const { child } of [...list].reverse()) await stopProcess(child);
    },
  };
}

/** The last 25 lines of a log file ('' when it cannot be read). */
function logTail(path: string): string {
  try {
    return readFileSync(path, 'utf8').split('\n').slice(-25).join('\n');
  } catch {
    return '';
  }
}

function etcdArgs(dir: string, ports: Ports): string[] {
  return [
    '--name=captf',
    `--data-dir=${join(dir, 'etcd')}`,
    `--listen-client-urls=http://127.0.0.1:${ports.etcd}`,
    `--advertise-client-urls=http://127.0.0.1:${ports.etcd}`,
    `--listen-peer-urls=http://127.0.0.1:${ports.peer}`,
    `--initial-advertise-peer-urls=http://127.0.0.1:${ports.peer}`,
    `--initial-cluster=captf=http://127.0.0.1:${ports.peer}`,
    '--unsafe-no-fsync=true',
    '--log-level=warn',
  ];
}

function apiServerArgs(dir: string, ports: Ports, pki: Pki, auditLogMaxSizeMB = 200): string[] {
  return [
    `--etcd-servers=http://127.0.0.1:${ports.etcd}`,
    '--bind-address=127.0.0.1',
    '--advertise-address=127.0.0.1',
    `--secure-port=${ports.api}`,
    `--tls-cert-file=${pki.serving.cert}`,
    `--tls-private-key-file=${pki.serving.key}`,
    `--client-ca-file=${pki.clientCA.cert}`,
    '--authorization-mode=Node,RBAC',
    '--service-cluster-ip-range=10.0.0.0/24',
    '--allow-privileged=true',
    '--service-account-issuer=https://kubernetes.default.svc.cluster.local',
    `--service-account-key-file=${pki.sa.pub}`,
    `--service-account-signing-key-file=${pki.sa.key}`,
    `--audit-policy-file=${join(dir, 'audit-policy.yaml')}`,
    `--audit-log-path=${join(dir, 'logs', 'audit.log')}`,
    `--audit-log-maxsize=${auditLogMaxSizeMB}`,
  ];
}

function controllerManagerArgs(kubeconfigPath: string, pki: Pki): string[] {
  return [
    `--kubeconfig=${kubeconfigPath}`,
    `--controllers=${CONTROLLERS.join(',')}`,
    `--service-account-private-key-file=${pki.sa.key}`,
    `--root-ca-file=${pki.servingCA.cert}`,
    '--leader-elect=false',
    '--secure-port=0',
    '--use-service-account-credentials=false',
  ];
}

/** How long the API server may take to answer `/readyz` 200, in ms. */
const READY_TIMEOUT_MS = 120_000;

/**
 * Polls `/readyz` (as admin) until it answers 200.
 * @throws Error when a component exits first (with the tail of its log) or time runs out.
 */
async function waitReady(opts: { server: string; pki: Pki; components: Components }): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  let last = '';
  while (Date.now() < deadline) {
    const gone = opts.components.list.find((p) => !isRunning(p.child));
    if (gone)
      throw new Error(
        `${gone.name} exited (${gone.child.exitCode ?? gone.child.signalCode}) before the control plane was ready:\n${logTail(gone.logPath)}`,
      );
    try {
      const r = await get(`${opts.server}/readyz`, opts.pki.caPem, opts.pki.admin);
      if (r.status === 200) return;
      last = `${r.status} ${r.body.slice(0, 500)}`;
    } catch (e) {
      last = String(e);
    }
    await sleep(250);
  }
  const apiServerLog = opts.components.list[1]?.logPath ?? '';
  throw new Error(`kube-apiserver not ready after ${READY_TIMEOUT_MS} ms: ${last}\n${logTail(apiServerLog)}`);
}

/**
 * Mints a user of a running control plane in `dir`: a client certificate with CN = `name`
 * and O = each group, signed by `<dir>/pki/client-ca.*`, and a kubeconfig for it.
 * Equivalent to `openssl req … -subj /CN=name/O=group` + `openssl x509 -req -CA client-ca.crt`.
 * @returns the kubeconfig path (`<dir>/users/<name>-<groups>.kubeconfig`).
 * @throws Error when `dir` holds no control plane or openssl fails.
 */
export async function userKubeConfig(dir: string, name: string, groups: readonly string[] = []): Promise<string> {
  const { server, caPem } = readAdminKubeConfig(dir);
  const clientCA = { cert: join(dir, 'pki', 'client-ca.crt'), key: join(dir, 'pki', 'client-ca.key') };
  const usersDir = join(dir, 'users');
  const base = `${name}-${groups.join('+')}-${randomBytes(3).toString('hex')}`.replace(/[^A-Za-z0-9_.+-]/g, '_');
  const cert = await createLeaf({ ca: clientCA, dir: usersDir, name: base, cn: name, orgs: groups, usage: 'client' });
  return writeKubeConfig(join(usersDir, `${base}.kubeconfig`), { server, caPem, user: name, cert });
}

/** Server URL and CA PEM from `<dir>/admin.kubeconfig`. @throws Error when absent. */
export function readAdminKubeConfig(dir: string): { server: string; caPem: string; kubeconfigPath: string } {
  const kubeconfigPath = join(resolve(dir), 'admin.kubeconfig');
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfigPath);
  const cluster = kc.getCurrentCluster();
  if (!cluster?.caData) throw new Error(`${kubeconfigPath} has no cluster with certificate-authority-data`);
  return { server: cluster.server, caPem: Buffer.from(cluster.caData, 'base64').toString('utf8'), kubeconfigPath };
}
