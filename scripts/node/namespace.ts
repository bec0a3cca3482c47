/**
 * The test node's network and mount namespaces, owned by a holder process (holder.ts): nothing
 * on the host's interfaces, routes, firewall, `/run`, `/var/log` or sysctls changes; processes
 * started with {@link NodeNamespace.spawn} run inside (`nsenter`), and ports of the node's
 * address are reachable from the host on 127.0.0.1 through Unix-socket forwards, so the test
 * runner, kubectl or a shell never need to enter the namespace.
 *
 * Stop and crash: `stop()` closes the holder's stdin, and so does the death of this process,
 * however it dies; either way the holder stops every process inside, removes the node's
 * cgroups and exits, and the namespaces with their mounts go with it. If the holder itself
 * was killed, the next start from the same folder kills what is left (processes carrying the
 * folder in {@link NODE_MARKER}) and removes the folder's cgroups. One node per folder at a
 * time: a second start while the first runs is refused; nodes from other folders run side by
 * side (each namespace has its own copy of the same address).
 */
import { execFileSync, spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import type { Server } from 'node:net';
import { join } from 'node:path';
import { onLines } from '../lib/process.ts';
import { REPO_ROOT } from '../tools/build.ts';
import { NODE_NETWORK, type HolderConfig } from './config.ts';
import { forwardingServer } from './forward.ts';

/** Environment variable marking every process started in a node: its folder. */
export const NODE_MARKER = 'CAPTF_NODE_DIR';

const HOLDER = join(REPO_ROOT, 'scripts', 'node', 'holder.ts');
const CGROUP_FS = '/sys/fs/cgroup';

/** Options of {@link startNodeNamespace}. */
export interface NodeNamespaceOptions {
  /** The node's folder (state, sockets, logs); one node per folder at a time. */
  dir: string;
  /** Ports of the node's address to reach from the host on 127.0.0.1. */
  forwards?: readonly number[];
  /** Grace between SIGTERM and SIGKILL for processes inside at stop (ms, default 10 s). */
  graceMs?: number;
}

/** A running node namespace. */
export interface NodeNamespace {
  /** The holder's PID (processes enter its namespaces). */
  pid: number;
  /** The node's address, without prefix (e.g. `10.240.0.1`). */
  address: string;
  /** The node's cgroup root under every hierarchy. */
  cgroupRoot: string;
  /** For each forwarded port of the node's address, the 127.0.0.1 port that reaches it. */
  forwarded: ReadonlyMap<number, number>;
  /** Spawns `cmd` inside the namespaces (marked with {@link NODE_MARKER}). */
  spawn(cmd: string, args: readonly string[], opts?: SpawnOptions): ChildProcess;
  /** Stops everything inside and ends the namespaces; resolves when the holder has exited. */
  stop(): Promise<void>;
}

/** The cgroup hierarchies to make the node's root in: every v1 controller mount and the unified one. */
export function cgroupHierarchies(): string[] {
  if (existsSync(join(CGROUP_FS, 'cgroup.controllers'))) return ['']; // cgroup v2 only
  return readdirSync(CGROUP_FS, { withFileTypes: true })
    .filter((d) => d.isDirectory())
    .map((d) => d.name)
    .sort();
}

/** The node's cgroup root, one per folder. */
export const cgroupRootOf = (dir: string): string =>
  `captf-node-${createHash('sha256').update(dir).digest('hex').slice(0, 10)}`;

/**
 * Starts the node's namespaces.
 * @throws Error naming the missing capability (a program, unshare, a bridge, a cgroup), or
 *   that a node from the same folder runs.
 */
export async function startNodeNamespace(opts: NodeNamespaceOptions): Promise<NodeNamespace> {
  const { dir } = opts;
  checkPrograms();
  mkdirSync(dir, { recursive: true });
  refuseSecond(dir);
  await sweepNode(dir);
  const config: HolderConfig = {
    ...NODE_NETWORK,
    cgroupRoot: cgroupRootOf(dir),
    cgroupHierarchies: cgroupHierarchies(),
    forwards: (opts.forwards ?? []).map((port) => ({ socket: join(dir, `forward-${port}.sock`), port })),
    graceMs: opts.graceMs ?? 10_000,
  };
  const holder = spawn(
    'unshare',
    [
      '--net',
      '--mount',
      '--propagation',
      'private',
      '--fork',
      '--kill-child=SIGTERM',
      process.execPath,
      HOLDER,
      JSON.stringify(config),
    ],
    { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, [NODE_MARKER]: dir } },
  );
  const ready = await holderReady(holder);
  writeFileSync(join(dir, 'holder.pid'), `${ready.pid}\n`);
  const forwarded = new Map<number, number>();
  const servers: Server[] = [];
  for (const f of config.forwards) {
    const server = await forwardFromHost(f.socket);
    servers.push(server);
    forwarded.set(f.port, (server.address() as { port: number }).port);
  }
  const exited = new Promise<void>((r) => holder.once('exit', () => r()));
  return {
    pid: ready.pid,
    address: NODE_NETWORK.address.split('/')[0]!,
    cgroupRoot: config.cgroupRoot,
    forwarded,
    spawn: (cmd, args, spawnOpts = {}) =>
      spawn('nsenter', ['-t', String(ready.pid), '-n', '-m', '--', cmd, ...args], {
        ...spawnOpts,
        env: { ...(spawnOpts.env ?? process.env), [NODE_MARKER]: dir },
      }),
    async stop() {
      for (const s of servers) s.close();
      holder.stdin?.end();
      await exited;
      rmSync(join(dir, 'holder.pid'), { force: true });
    },
  };
}

/** @throws Error when this process is not root, or naming a program the node needs that is not on PATH. */
function checkPrograms(): void {
  if (process.getuid?.() !== 0)
    throw new Error(
      'the test node needs root: it makes network and mount namespaces and cgroups (run the tests as root)',
    );
  for (const [program, from] of [
    ['unshare', 'util-linux'],
    ['nsenter', 'util-linux'],
    ['ip', 'iproute2'],
    ['mount', 'mount'],
    ['sysctl', 'procps'],
  ] as const) {
    try {
      execFileSync('sh', ['-c', `command -v ${program}`], { stdio: 'ignore' });
    } catch {
      throw new Error(`the test node needs ${program} (Debian package ${from})`);
    }
  }
}

/** @throws Error when a node from `dir` still runs. */
function refuseSecond(dir: string): void {
  const file = join(dir, 'holder.pid');
  if (!existsSync(file)) return;
  const pid = Number(readFileSync(file, 'utf8').trim());
  if (Number.isInteger(pid) && pid > 0 && existsSync(`/proc/${pid}`) && markedWith(pid, dir))
    throw new Error(`a test node from ${dir} is already running (holder PID ${pid}); stop it or use another folder`);
}

/** Whether process `pid` carries `dir` in its {@link NODE_MARKER}. */
function markedWith(pid: number, dir: string): boolean {
  try {
    return readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0').includes(`${NODE_MARKER}=${dir}`);
  } catch {
    return false;
  }
}

/** PIDs of the processes (other than this one) started for the node from `dir`. */
export function markedProcesses(dir: string): number[] {
  return readdirSync('/proc')
    .map(Number)
    .filter((pid) => Number.isInteger(pid) && pid !== process.pid && markedWith(pid, dir));
}

/** Kills what a holder that was killed itself left of a node from `dir`, and removes its cgroups. */
export async function sweepNode(dir: string): Promise<void> {
  for (const pid of markedProcesses(dir)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // Gone meanwhile.
    }
  }
  // A cgroup can only be removed once the processes in it have exited.
  for (let i = 0; i < 50 && markedProcesses(dir).length; i++) await new Promise((r) => setTimeout(r, 100));
  const root = cgroupRootOf(dir);
  for (const h of cgroupHierarchies()) {
    const top = join(CGROUP_FS, h, root);
    if (!existsSync(top) || !statSync(top).isDirectory()) continue;
    const dirs = readdirSync(top, { recursive: true, withFileTypes: true })
      .filter((d) => d.isDirectory())
      .map((d) => join(d.parentPath, d.name));
    for (const d of [...dirs.sort((a, b) => b.length - a.length), top]) rmdirSync(d);
  }
}

/** Waits for the holder's first line: ready with its PID, or the setup step that failed. */
function holderReady(holder: ChildProcess): Promise<{ pid: number }> {
  return new Promise((resolve, reject) => {
    let stderr = '';
    holder.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    let answered = false;
    onLines(holder.stdout!, (line) => {
      if (answered) return;
      answered = true;
      try {
        const r = JSON.parse(line) as { ready: boolean; pid?: number; error?: string };
        if (r.ready && typeof r.pid === 'number') resolve({ pid: r.pid });
        else reject(new Error(`the test node's namespace could not be set up: ${r.error ?? line}`));
      } catch {
        reject(new Error(`the test node's holder said: ${line}`));
      }
    });
    holder.once('exit', (code, signal) => {
      if (!answered)
        reject(
          new Error(
            `the test node's holder exited (${code ?? signal}) before it was ready; unshare needs root ` +
              `(CAP_SYS_ADMIN) and network namespaces: ${stderr.trim().split('\n').slice(-3).join(' | ')}`,
          ),
        );
    });
  });
}

/** A 127.0.0.1 listener whose connections the holder's Unix socket `socket` carries inside. */
async function forwardFromHost(socket: string): Promise<Server> {
  const server = forwardingServer({ path: socket });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return server;
}
