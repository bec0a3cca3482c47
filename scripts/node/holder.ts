/**
 * The process that owns the test node's network and mount namespaces (started by
 * namespace.ts as `unshare --net --mount --fork node holder.ts`, so it runs inside them).
 * It sets the namespaces up, says `ready` on stdout as one JSON line, forwards the Unix
 * sockets it is asked to (the host side of a forward cannot reach an address inside), and
 * tears everything down when its stdin ends: on `stop()`, and equally when the process that
 * started it dies however it dies (its end of the pipe closes with it).
 *
 * Teardown: every other process in these namespaces gets SIGTERM, then SIGKILL after a grace
 * period; the cgroups under the node's root are removed in every hierarchy; then the holder
 * exits, and with the last process the namespaces and every mount made in them go away.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readlinkSync, rmdirSync, rmSync } from 'node:fs';
import type { Server } from 'node:net';
import { join } from 'node:path';
import { parseHolderConfig, type HolderConfig } from './config.ts';
import { forwardingServer } from './forward.ts';

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
  // Mounts stay here: containerd, runc and CNI write under /run, the kubelet under /var/log.
  sh('mount', '--make-rprivate', '/');
  sh('mount', '-t', 'tmpfs', '-o', 'mode=755', 'tmpfs', '/run');
  sh('mount', '-t', 'tmpfs', '-o', 'mode=755', 'tmpfs', '/var/log');
  sh('ip', 'link', 'set', 'lo', 'up');
  sh('ip', 'link', 'add', config.bridge, 'type', 'bridge');
  sh('ip', 'addr', 'add', config.address, 'dev', config.bridge);
  sh('ip', 'link', 'set', config.bridge, 'up');
  // Without a default route, connecting to a ClusterIP fails before kube-proxy's DNAT runs.
  sh('ip', 'route', 'add', config.serviceCidr, 'dev', config.bridge);
  sh('sysctl', '-qw', 'net.ipv4.ip_forward=1');
  for (const h of config.cgroupHierarchies) sh('mkdir', '-p', join('/sys/fs/cgroup', h, config.cgroupRoot));
}

/** Forwards each connection on a Unix socket to an address inside (the host's side pipes into it). */
function forward(socketPath: string, target: { host: string; port: number }): void {
  rmSync(socketPath, { force: true });
  const server = forwardingServer(target);
  server.listen(socketPath);
  servers.push(server);
}

/** PIDs of every other process whose network or mount namespace is this one's. */
function processesInside(): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    const pid = Number(entry);
    // The holder, and the unshare that forked it (it waits for the holder and goes with it).
    if (!Number.isInteger(pid) || pid === process.pid || pid === process.ppid) continue;
    try {
      const net = readlinkSync(`/proc/${pid}/ns/net`);
      const mnt = readlinkSync(`/proc/${pid}/ns/mnt`);
      if (net === ownNet || mnt === ownMnt) pids.push(pid);
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

/** Removes the node's cgroup tree in every hierarchy, deepest first (only empty ones can go). */
function removeCgroups(): string[] {
  const left: string[] = [];
  for (const h of config.cgroupHierarchies) {
    const root = join('/sys/fs/cgroup', h, config.cgroupRoot);
    if (!existsSync(root)) continue;
    const dirs = [
      root,
      ...readdirSync(root, { recursive: true, withFileTypes: true })
        .filter((d) => d.isDirectory())
        .map((d) => join(d.parentPath, d.name)),
    ];
    for (const d of dirs.sort((a, b) => b.length - a.length)) {
      try {
        rmdirSync(d);
      } catch {
        left.push(d);
      }
    }
  }
  return left;
}

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
  const left = removeCgroups();
  if (left.length) process.stderr.write(`node holder: cgroups left: ${left.join(', ')}\n`);
}

try {
  setUp();
  for (const f of config.forwards) forward(f.socket, { host: config.address.split('/')[0]!, port: f.port });
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
