/**
 * The process that owns the test node's network and mount namespaces (started by
 * namespace.ts as `unshare --net --mount --fork node holder.ts`, so it runs inside them).
 * It sets the namespaces up, says `ready` on stdout as one JSON line, serves the node's way in
 * from the host (./forward.ts: the host side of a forward cannot reach an address inside), and
 * tears everything down when its stdin ends: on `stop()`, and equally when the process that
 * started it dies however it dies (its end of the pipe closes with it).
 *
 * Teardown: every other process in these namespaces, and every process in the node's cgroups
 * (containers have namespaces of their own), gets SIGTERM, then SIGKILL after a grace period;
 * the cgroups under the node's root are removed in every hierarchy; then the holder exits, and
 * with the last process the namespaces and every mount made in them go away.
 */
import { execFileSync } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import type { Server } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { CGROUP_FS, cgroupProcesses, removeCgroupsPatiently } from './cgroups.ts';
import { KUBELET_KERNEL_SETTINGS, parseHolderConfig, type HolderConfig } from './config.ts';
import { holderForward } from './forward.ts';

const config: HolderConfig = parseHolderConfig(process.argv[2] ?? '');
const ownNet = readlinkSync('/proc/self/ns/net');
const ownMnt = readlinkSync('/proc/self/ns/mnt');
const servers: Server[] = [];

/** Runs a setup command; its failure names the command and what it printed. */
function sh(cmd: string, ...args: string[]): void {
  try {
    execFileSync(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  } catch (err) {
    const stderr = (err as { stderr?: Buffer }).stderr?.toString().trim() ?? '';
    throw new Error(`${cmd} ${args.join(' ')}: ${stderr || (err as Error).message}`, { cause: err });
  }
}

/** Mounts, loopback, the node's bridge and address, and the routes and sysctls a node needs. */
function setUp(): void {
  // Mounts stay here: containerd, runc and CNI write under /run, the kubelet under /var/log,
  // and under /var/lib paths no flag moves (the kubelet's device-plugins socket, CNI's cache).
  sh('mount', '--make-rprivate', '/');
  for (const dir of ['/run', '/var/log', '/var/lib']) sh('mount', '-t', 'tmpfs', '-o', 'mode=755', 'tmpfs', dir);
  // Host-wide kernel settings the kubelet checks: it reads these copies and never writes the host's.
  const kernel = '/run/captf-node-kernel';
  mkdirSync(kernel);
  for (const [name, value] of Object.entries(KUBELET_KERNEL_SETTINGS)) {
    const file = join(kernel, name.replaceAll('/', '.'));
    writeFileSync(file, `${value}\n`, { mode: 0o444 });
    sh('mount', '--bind', '-o', 'ro', file, join('/proc/sys', name));
  }
  useClusterDns(config.resolvConf);
  sh('ip', 'link', 'set', 'lo', 'up');
  sh('ip', 'link', 'add', config.bridge, 'type', 'bridge');
  sh('ip', 'addr', 'add', config.address, 'dev', config.bridge);
  sh('ip', 'link', 'set', config.bridge, 'up');
  // Without a default route, connecting to a ClusterIP fails before kube-proxy's DNAT runs.
  sh('ip', 'route', 'add', config.serviceCidr, 'dev', config.bridge);
  // Both per network namespace: the node routes for its pods, and bridged pod-to-pod replies
  // pass kube-proxy's conntrack (a Service's endpoint on the same bridge answers unNATed otherwise).
  sh('sysctl', '-qw', 'net.ipv4.ip_forward=1');
  sh('sysctl', '-qw', 'net.bridge.bridge-nf-call-iptables=1');
  for (const h of config.cgroupHierarchies) sh('mkdir', '-p', join(CGROUP_FS, h, config.cgroupRoot));
  // A new v1 cpuset cgroup has no CPUs or memory nodes: nothing could run in it (the kubelet's pods).
  const cpuset = join(CGROUP_FS, 'cpuset');
  if (config.cgroupHierarchies.includes('cpuset'))
    for (const f of ['cpuset.cpus', 'cpuset.mems'])
      writeFileSync(join(cpuset, config.cgroupRoot, f), readFileSync(join(cpuset, f)));
}

/**
 * Cluster DNS for the node's own processes, in this mount namespace only; the host's file is
 * untouched. `/etc/resolv.conf` may be a symlink (systemd-resolved's points into `/run`): it is
 * followed, and a target under `/run` (now this namespace's empty tmpfs) is written there;
 * any other target is bind-mounted over. A missing target outside `/run` is refused: creating
 * it would write on the host.
 * @throws Error naming the path when it cannot be used.
 */
function useClusterDns(text: string): void {
  let path = '/etc/resolv.conf';
  const isLink = (p: string) => lstatSync(p, { throwIfNoEntry: false })?.isSymbolicLink() ?? false;
  for (let i = 0; i < 10 && isLink(path); i++) path = resolve(dirname(path), readlinkSync(path));
  if (path === '/run' || path.startsWith('/run/')) {
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, text, { mode: 0o444 });
    return;
  }
  if (!existsSync(path) || !lstatSync(path).isFile())
    throw new Error(`node holder: /etc/resolv.conf resolves to ${path}, which is not a file to mount cluster DNS over`);
  writeFileSync('/run/captf-node-resolv.conf', text, { mode: 0o444 });
  sh('mount', '--bind', '-o', 'ro', '/run/captf-node-resolv.conf', path);
}

/**
 * Serves the way in from the host on the Unix socket `socketPath`, which only root may use
 * (it reaches everything inside, etcd's plain port too).
 * @throws Error when it cannot listen there.
 */
async function serveForwards(socketPath: string): Promise<void> {
  rmSync(socketPath, { force: true });
  const server = holderForward();
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err) => reject(new Error(`listening on ${socketPath}: ${err.message}`)));
    server.listen(socketPath, resolve);
  });
  chmodSync(socketPath, 0o600);
  servers.push(server);
}

/** PIDs of every other process whose network or mount namespace is this one's, or in the node's cgroups. */
function processesInside(): number[] {
  const pids: number[] = cgroupProcesses(config.cgroupRoot, config.cgroupHierarchies).filter(
    (pid) => pid !== process.pid,
  );
  for (const entry of readdirSync('/proc')) {
    const pid = Number(entry);
    // The holder, and the unshare that forked it (it waits for the holder and goes with it).
    if (!Number.isInteger(pid) || pid === process.pid || pid === process.ppid) continue;
    try {
      const net = readlinkSync(`/proc/${pid}/ns/net`);
      const mnt = readlinkSync(`/proc/${pid}/ns/mnt`);
      if ((net === ownNet || mnt === ownMnt) && !pids.includes(pid)) pids.push(pid);
    } catch {
      // Gone meanwhile, or a kernel thread.
    }
  }
  return pids;
}

const signal = (pids: readonly number[], sig: NodeJS.Signals) => {
  for (const pid of pids) {
    try {
      process.kill(pid, sig);
    } catch {
      // Already gone.
    }
  }
};

let tearing: Promise<void> | undefined;

/** Stops everything inside, waiting `graceMs` for SIGTERM before SIGKILL, then removes the cgroups. */
async function tearDown(): Promise<void> {
  for (const s of servers) s.close();
  signal(processesInside(), 'SIGTERM');
  const deadline = Date.now() + config.graceMs;
  while (processesInside().length && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  for (let i = 0; i < 50 && processesInside().length; i++) {
    signal(processesInside(), 'SIGKILL');
    await new Promise((r) => setTimeout(r, 100));
  }
  const left = await removeCgroupsPatiently(config.cgroupRoot, config.cgroupHierarchies);
  if (left.length) process.stderr.write(`node holder: cgroups left: ${left.join(', ')}\n`);
}

try {
  setUp();
  await serveForwards(config.socket);
  process.stdout.write(`${JSON.stringify({ ready: true, pid: process.pid, net: ownNet })}\n`);
} catch (err) {
  process.stdout.write(`${JSON.stringify({ ready: false, error: (err as Error).message })}\n`);
  await tearDown();
  process.exit(1);
}

// The parent's end of stdin closes when it asks to stop or when it dies.
process.stdin.resume();
const finish = () => void (tearing ??= tearDown()).then(() => process.exit(0));
process.stdin.on('end', finish);
process.on('SIGTERM', finish);
