/**
 * Starts and stops a real local control plane — etcd, kube-apiserver and
 * kube-controller-manager on free loopback ports — for tests and the local mode (SPEC §14,
 * §15). Users authenticate with client certificates signed by `<dir>/pki/client-ca.*`
 * (CN = user, O = groups); authorization is Node,RBAC; the controller-manager runs the
 * controllers of {@link CONTROLLERS}: garbage collection, namespaces, Jobs, service accounts,
 * ClusterRole aggregation (so the built-in `admin`, `edit` and `view` grant what they do on a
 * cluster) and the `kube-root-ca.crt` ConfigMap of every namespace.
 */
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, mkdirSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import { join, resolve } from 'node:path';
import { KubeConfig, dumpYaml } from '@kubernetes/client-node';
import { freePort } from '../lib/ports.ts';
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

/**
 * Controllers added when the control plane serves a test node (scripts/node/node.ts), where
 * Pods really run:
 * - `node-lifecycle-controller` and `taint-eviction-controller`: the kubelet registers its Node
 *   tainted `node.kubernetes.io/not-ready`, and only the lifecycle controller removes the taint
 *   once the Node is Ready (nothing schedules before).
 * - `endpoints-controller`, `endpointslice-controller`, `endpointslice-mirroring-controller`:
 *   a Service's endpoints, which kube-proxy and CoreDNS read (Knative also reads legacy Endpoints).
 * - `deployment-controller`, `replicaset-controller`: Deployments get Pods.
 * - `ttl-controller`, `ttl-after-finished-controller`, `pod-garbage-collector-controller`:
 *   what a real cluster does with finished Jobs and orphaned Pods.
 */
export const NODE_CONTROLLERS = [
  'node-lifecycle-controller',
  'taint-eviction-controller',
  'endpoints-controller',
  'endpointslice-controller',
  'endpointslice-mirroring-controller',
  'deployment-controller',
  'replicaset-controller',
  'ttl-controller',
  'ttl-after-finished-controller',
  'pod-garbage-collector-controller',
];

/** The port the API server listens on at a test node's address (inside its namespace). */
export const NODE_API_PORT = 6443;

/** The names a Pod reaches the API server by: the `kubernetes` Service's ClusterIP and DNS names. */
const IN_CLUSTER_SANS = [
  'IP:10.0.0.1',
  'DNS:kubernetes',
  'DNS:kubernetes.default',
  'DNS:kubernetes.default.svc',
  'DNS:kubernetes.default.svc.cluster.local',
];

/** Where a control plane runs when it serves a test node: inside the node's namespaces. */
export interface OnNode {
  /** Spawns a process inside the node (scripts/node/namespace.ts `spawn`). */
  spawn(cmd: string, args: readonly string[], opts?: SpawnOptions): ChildProcess;
  /** A 127.0.0.1 port that reaches `target` inside (namespace.ts `forward`). */
  forward(target: { host: string; port: number }): Promise<number>;
  /** The node's address, which the API server binds and advertises. */
  address: string;
  /** The kube-scheduler binary (tool set `node`). */
  scheduler: string;
}

/** Options of {@link startControlPlane}. */
export interface StartOptions {
  /** State folder (wiped on start): pki/, etcd data, logs/, kubeconfigs. */
  dir: string;
  /** Progress lines (build, start); defaults to stderr. */
  log?: (line: string) => void;
  /** Size at which the audit log rotates, in MB (default 200); the bench reads one unrotated log. */
  auditLogMaxSizeMB?: number;
  /**
   * Serve a test node: run inside its namespaces, bind its address, add {@link NODE_CONTROLLERS}
   * and kube-scheduler. The host still reaches the API server on 127.0.0.1 (a forward).
   */
  node?: OnNode;
}

/** A running control plane. */
export interface ControlPlane {
  dir: string;
  /** `https://127.0.0.1:<port>` */
  server: string;
  /** Kubeconfig of `admin` in group `system:masters`. */
  kubeconfigPath: string;
  /**
   * Serving a node: admin's kubeconfig for processes inside it (the node's address; the
   * host's 127.0.0.1 forward does not exist there). Otherwise the same as `kubeconfigPath`.
   */
  insideKubeconfigPath: string;
  /** PEM of the CA that signed the API server's certificate. */
  caPem: string;
  /**
   * Path of the CA that signed the client certificate the API server presents to every
   * admission webhook (its AdmissionConfiguration's kubeconfig, {@link WEBHOOK_CLIENT_CN}): what
   * a webhook that checks its callers trusts (admission's `CAPTF_ADMISSION_CLIENT_CA_FILE`).
   */
  webhookClientCaPath: string;
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
  /** The CA of the certificate the API server presents to webhooks (its own, not the users' CA). */
  webhookClientCA: CertPair;
  /** The API server's client certificate towards webhooks. */
  webhookClient: CertPair;
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
export type ControlPlaneComponent = 'etcd' | 'kube-apiserver' | 'kube-controller-manager' | 'kube-scheduler';

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
  const { node } = opts;
  const pki = await createPki(join(dir, 'pki'), node ? [`IP:${node.address}`, ...IN_CLUSTER_SANS] : []);
  const { ports, bind, server } = await addresses(node);
  const kubeconfig = (name: string, url: string) =>
    writeKubeConfig(join(dir, name), { server: url, caPem: pki.caPem, user: 'admin', cert: pki.admin });
  const kubeconfigPath = kubeconfig('admin.kubeconfig', server);
  const insideKubeconfigPath = node
    ? kubeconfig('inside-admin.kubeconfig', `https://${bind}:${ports.api}`)
    : kubeconfigPath;
  writeAuditPolicy(dir);
  writeAdmissionConfiguration(dir, pki.webhookClient);
  const components = newComponents(join(dir, 'logs'), node?.spawn ?? spawn);
  try {
    components.start('etcd', binaries.etcd, etcdArgs(dir, ports));
    components.start(
      'kube-apiserver',
      binaries.kubeApiserver,
      apiServerArgs({ dir, ports, pki, bind, node: !!node, auditLogMaxSizeMB: opts.auditLogMaxSizeMB }),
    );
    await waitReady({ server, pki, components });
    startControllers(components, { binaries, kubeconfig: insideKubeconfigPath, pki, node, log });
  } catch (err) {
    await components.stop();
    throw err;
  }
  return {
    dir,
    server,
    kubeconfigPath,
    insideKubeconfigPath,
    caPem: pki.caPem,
    webhookClientCaPath: webhookClientCaPath(dir),
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

/**
 * The ports inside, the address the API server binds, and its URL from the host: on a node,
 * its address and a forward; otherwise free loopback ports.
 */
async function addresses(node: OnNode | undefined): Promise<{ ports: Ports; bind: string; server: string }> {
  const ports: Ports = { etcd: await freePort(), peer: await freePort(), api: node ? NODE_API_PORT : await freePort() };
  if (!node) return { ports, bind: '127.0.0.1', server: `https://127.0.0.1:${ports.api}` };
  const hostPort = await node.forward({ host: node.address, port: ports.api });
  return { ports, bind: node.address, server: `https://127.0.0.1:${hostPort}` };
}

/** kube-controller-manager (when available) and, serving a node, kube-scheduler. */
function startControllers(
  components: Components,
  o: {
    binaries: ControlPlaneBinaries;
    kubeconfig: string;
    pki: Pki;
    node: OnNode | undefined;
    log: (l: string) => void;
  },
): void {
  const { binaries, kubeconfig, pki, node } = o;
  if (binaries.kubeControllerManager)
    components.start(
      'kube-controller-manager',
      binaries.kubeControllerManager,
      controllerManagerArgs(kubeconfig, pki, node ? [...CONTROLLERS, ...NODE_CONTROLLERS] : CONTROLLERS),
    );
  else
    o.log(
      '[controlplane] no kube-controller-manager in KUBEBUILDER_ASSETS: garbage collection will not run, and the built-in admin, edit and view ClusterRoles grant nothing',
    );
  if (node)
    components.start('kube-scheduler', node.scheduler, [
      `--kubeconfig=${kubeconfig}`,
      `--authentication-kubeconfig=${kubeconfig}`,
      `--authorization-kubeconfig=${kubeconfig}`,
      '--leader-elect=false',
      '--secure-port=0',
    ]);
}

/**
 * The CAs, the service-account keys, the API server's serving certificate (for loopback and
 * `extraSans`) and admin's client certificate.
 */
async function createPki(pkiDir: string, extraSans: readonly string[]): Promise<Pki> {
  const [servingCA, clientCA, webhookClientCA, sa] = await Promise.all([
    createCA(pkiDir, 'ca', 'captf-local-ca'),
    createCA(pkiDir, 'client-ca', 'captf-local-client-ca'),
    createCA(pkiDir, WEBHOOK_CLIENT_CA, 'captf-local-webhook-client-ca'),
    createServiceAccountKeys(pkiDir),
  ]);
  const [serving, admin, webhookClient] = await Promise.all([
    createLeaf({
      ca: servingCA,
      dir: pkiDir,
      name: 'apiserver',
      cn: 'kube-apiserver',
      sans: ['IP:127.0.0.1', 'DNS:localhost', ...extraSans],
      usage: 'server',
    }),
    createLeaf({ ca: clientCA, dir: pkiDir, name: 'admin', cn: 'admin', orgs: ['system:masters'], usage: 'client' }),
    createLeaf({ ca: webhookClientCA, dir: pkiDir, name: 'webhook-client', cn: WEBHOOK_CLIENT_CN, usage: 'client' }),
  ]);
  const caPem = readFileSync(servingCA.cert, 'utf8');
  return { servingCA, clientCA, sa, serving, admin, webhookClientCA, webhookClient, caPem };
}

/** The subject CN of the client certificate the API server presents to admission webhooks. */
export const WEBHOOK_CLIENT_CN = 'kube-apiserver-webhook-client';

/** File base name of the CA of {@link WEBHOOK_CLIENT_CN}'s certificate, in `<dir>/pki`. */
const WEBHOOK_CLIENT_CA = 'webhook-client-ca';

/** The CA file of the client certificate the control plane in `dir` presents to webhooks. */
export const webhookClientCaPath = (dir: string): string => join(resolve(dir), 'pki', `${WEBHOOK_CLIENT_CA}.crt`);

/** The API server's AdmissionConfiguration, in the state folder. */
const ADMISSION_CONFIGURATION = 'admission-configuration.yaml';

/**
 * `<dir>/admission-configuration.yaml` and the kubeconfig it names: the API server presents
 * `cert` to every validating and mutating webhook (user `*`, any host), as an operator
 * configures a cluster whose webhooks check their callers (Kubernetes' "Authenticate API
 * servers" for admission webhooks). A webhook that asks for no certificate is unaffected.
 */
function writeAdmissionConfiguration(dir: string, cert: CertPair): void {
  const b64 = (p: string) => readFileSync(p).toString('base64');
  const kubeconfig = join(dir, 'webhook-client.kubeconfig');
  const user = { 'client-certificate-data': b64(cert.cert), 'client-key-data': b64(cert.key) };
  writeFileSync(kubeconfig, dumpYaml({ apiVersion: 'v1', kind: 'Config', users: [{ name: '*', user }] }));
  const plugin = (name: string) => ({
    name,
    configuration: {
      apiVersion: 'apiserver.config.k8s.io/v1',
      kind: 'WebhookAdmissionConfiguration',
      kubeConfigFile: kubeconfig,
    },
  });
  writeFileSync(
    join(dir, ADMISSION_CONFIGURATION),
    dumpYaml({
      apiVersion: 'apiserver.config.k8s.io/v1',
      kind: 'AdmissionConfiguration',
      plugins: [plugin('ValidatingAdmissionWebhook'), plugin('MutatingAdmissionWebhook')],
    }),
  );
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
function newComponents(logDir: string, spawnIn: OnNode['spawn']) {
  const list: Component[] = [];
  let stopping = false;
  const spawnLogged = (name: string, bin: string, args: string[]): ChildProcess => {
    const fd = openSync(join(logDir, `${name}.log`), 'a');
    const child = spawnIn(bin, args, { stdio: ['ignore', fd, fd] });
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

/** What the API server's arguments depend on. */
interface ApiServerSetup {
  dir: string;
  ports: Ports;
  pki: Pki;
  /** The address it binds and advertises. */
  bind: string;
  /** Serving a node: kubelets to reach by their InternalIP, and NodeRestriction. */
  node: boolean;
  auditLogMaxSizeMB: number | undefined;
}

function apiServerArgs({ dir, ports, pki, bind, node, auditLogMaxSizeMB = 200 }: ApiServerSetup): string[] {
  const forNode = [
    // The node's name is no host name this machine resolves (`kubectl logs` dials the kubelet).
    '--kubelet-preferred-address-types=InternalIP',
    `--kubelet-client-certificate=${pki.admin.cert}`,
    `--kubelet-client-key=${pki.admin.key}`,
    '--enable-admission-plugins=NodeRestriction',
  ];
  return [
    `--etcd-servers=http://127.0.0.1:${ports.etcd}`,
    `--bind-address=${bind}`,
    `--advertise-address=${bind}`,
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
    `--admission-control-config-file=${join(dir, ADMISSION_CONFIGURATION)}`,
    `--audit-log-path=${join(dir, 'logs', 'audit.log')}`,
    `--audit-log-maxsize=${auditLogMaxSizeMB}`,
    ...(node ? forNode : []),
  ];
}

function controllerManagerArgs(kubeconfigPath: string, pki: Pki, controllers: readonly string[]): string[] {
  return [
    `--kubeconfig=${kubeconfigPath}`,
    `--controllers=${controllers.join(',')}`,
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
 * @param where `inside`: the kubeconfig names the API server as processes inside a test node
 *   reach it (a kubelet, kube-proxy); default `host`.
 * @returns the kubeconfig path (`<dir>/users/<name>-<groups>.kubeconfig`).
 * @throws Error when `dir` holds no control plane (or, `inside`, none serving a node) or openssl fails.
 */
export async function userKubeConfig(
  dir: string,
  name: string,
  groups: readonly string[] = [],
  where: 'host' | 'inside' = 'host',
): Promise<string> {
  const { server, caPem } = readAdminKubeConfig(dir, where === 'inside' ? 'inside-admin.kubeconfig' : undefined);
  const clientCA = { cert: join(dir, 'pki', 'client-ca.crt'), key: join(dir, 'pki', 'client-ca.key') };
  const usersDir = join(dir, 'users');
  const base = `${name}-${groups.join('+')}-${randomBytes(3).toString('hex')}`.replace(/[^A-Za-z0-9_.+-]/g, '_');
  const cert = await createLeaf({ ca: clientCA, dir: usersDir, name: base, cn: name, orgs: groups, usage: 'client' });
  return writeKubeConfig(join(usersDir, `${base}.kubeconfig`), { server, caPem, user: name, cert });
}

/** Server URL and CA PEM from `<dir>/admin.kubeconfig`. @throws Error when absent. */
export function readAdminKubeConfig(
  dir: string,
  file = 'admin.kubeconfig',
): { server: string; caPem: string; kubeconfigPath: string } {
  const kubeconfigPath = join(resolve(dir), file);
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfigPath);
  const cluster = kc.getCurrentCluster();
  if (!cluster?.caData) throw new Error(`${kubeconfigPath} has no cluster with certificate-authority-data`);
  return { server: cluster.server, caPem: Buffer.from(cluster.caData, 'base64').toString('utf8'), kubeconfigPath };
}
