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
 * folder in {@link NODE_MARKER}) and removes the folder's cgroups; every start, and `npm run
 * sweep`, also sweeps what nodes of other folders left once nothing owns them (./sweep.ts).
 * One node per folder at a time: a second start while the first runs is refused; nodes from
 * other folders run side by side (each namespace has its own copy of the same address).
 */
import { execFileSync, spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { mkdirSync, readdirSync, rmSync } from 'node:fs';
import type { AddressInfo, Server } from 'node:net';
import { join, resolve } from 'node:path';
import { tryLock } from '../lib/lock.ts';
import { onLines } from '../lib/process.ts';
import { cgroupHierarchies, cgroupRootOf } from './cgroups.ts';
import { NODE_NETWORK, NODE_RESOLV_CONF, type HolderConfig } from './config.ts';
import { hostForward, type Target } from './forward.ts';
import {
  forgetOwner,
  HOLDER_SCRIPT,
  holderOf,
  NODE_MARKER,
  recordOwner,
  sweepNode,
  sweepNodes,
  withSweepLock,
} from './sweep.ts';

export { cgroupHierarchies, cgroupRootOf } from './cgroups.ts';
export { holderOf, markedProcesses, NODE_MARKER, sweepNode, sweepNodes } from './sweep.ts';

/** Options of {@link startNodeNamespace}. */
export interface NodeNamespaceOptions {
  /** The node's folder (state, sockets, logs); one node per folder at a time. */
  dir: string;
  /** Ports of the node's address to reach from the host on 127.0.0.1. */
  forwards?: readonly number[];
  /** Grace between SIGTERM and SIGKILL for processes inside at stop (ms, default 10 s). */
  graceMs?: number;
  /** Where to say what the start swept of other folders' nodes (default: nowhere). */
  log?: (line: string) => void;
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
  /**
   * A new 127.0.0.1 port that reaches `target` inside (a pod's address, say); closed at stop.
   * @returns the port.
   */
  forward(target: Target): Promise<number>;
  /**
   * A 127.0.0.1 port P of this machine that reaches `host`:P inside the node: one name
   * (`localhost:P`) means the same server on both sides (a registry pushed to from here and
   * pulled from by the node's containerd).
   */
  forwardSamePort(host: string): Promise<number>;
  /** Spawns `cmd` inside the namespaces (marked with {@link NODE_MARKER}). */
  spawn(cmd: string, args: readonly string[], opts?: SpawnOptions): ChildProcess;
  /** Stops everything inside and ends the namespaces; resolves when the holder has exited. */
  stop(): Promise<void>;
}

/**
 * Starts the node's namespaces.
 * @throws Error naming the missing capability (a program, unshare, a bridge, a cgroup), or
 *   that a node from the same folder runs.
 */
export async function startNodeNamespace(opts: NodeNamespaceOptions): Promise<NodeNamespace> {
  // Absolute: a sweep from another working directory must find the same folder.
  const dir = resolve(opts.dir);
  checkNodeHost();
  mkdirSync(dir, { recursive: true });
  const socket = join(dir, 'forward.sock');
  if (Buffer.byteLength(socket) > MAX_SOCKET_PATH)
    throw new Error(`the test node's folder ${dir} is too long: its socket path must fit ${MAX_SOCKET_PATH} bytes`);
  // Under the machine-wide lock until the node is owned: a sweep never sees it half-started.
  const { holder, exited, ready } = await withSweepLock(async () => {
    const release = takeStartLock(dir);
    try {
      refuseSecond(dir);
      await sweepNode(dir);
      // What nodes of other folders left once nothing owns them: a stop cut short (a crash, a
      // second Ctrl-C) would otherwise stay until someone ran the sweep by hand.
      const others = await sweepNodes(true);
      if (others.swept.length) opts.log?.(`swept what earlier nodes left: ${others.swept.join(', ')}`);
      for (const failed of others.failed) opts.log?.(`could not sweep ${failed}`);
      // A fresh folder: what a stopped or swept node left (containerd's and the kubelet's state) is stale.
      for (const entry of readdirSync(dir)) if (entry !== START_LOCK) rmSync(join(dir, entry), { recursive: true });
      const config: HolderConfig = {
        ...NODE_NETWORK,
        cgroupRoot: cgroupRootOf(dir),
        cgroupHierarchies: cgroupHierarchies(),
        socket,
        graceMs: opts.graceMs ?? 10_000,
        resolvConf: NODE_RESOLV_CONF,
      };
      const holder = spawnHolder(config, dir);
      // Listened for at once: the holder may end (be killed) before stop() is called.
      const exited = new Promise<void>((r) => holder.once('exit', () => r()));
      const ready = await holderReady(holder);
      recordOwner(dir);
      return { holder, exited, ready };
    } finally {
      release();
    }
  });
  const servers: Server[] = [];
  const address = NODE_NETWORK.address.split('/')[0]!;
  const forward = forwarder(socket, servers);
  const forwarded = new Map<number, number>();
  for (const port of opts.forwards ?? []) forwarded.set(port, await forward({ host: address, port }));
  return {
    pid: ready.pid,
    address,
    cgroupRoot: cgroupRootOf(dir),
    forwarded,
    forward: (target) => forward(target),
    forwardSamePort: (host) => forward({ host, port: 0 }, true),
    spawn: (cmd, args, spawnOpts = {}) =>
      spawn('nsenter', ['-t', String(ready.pid), '-n', '-m', '--', cmd, ...args], {
        // A group of its own: a terminal's Ctrl-C reaches the starter, which stops the node in order.
        detached: true,
        ...spawnOpts,
        env: { ...nodeEnv(spawnOpts.env ?? process.env), [NODE_MARKER]: dir },
      }),
    async stop() {
      for (const s of servers) s.close();
      holder.stdin?.end();
      await exited;
      forgetOwner(dir);
    },
  };
}

/**
 * Opens forwards through the holder's `socket`, each server kept in `servers` (closed at the stop).
 * @returns a function that forwards a new 127.0.0.1 port to `target` (with `samePort`, to the
 *   target host's port of the same number: a forward reads its target per connection, so the
 *   port is filled in once it listens) and resolves to that port.
 */
function forwarder(socket: string, servers: Server[]): (target: Target, samePort?: boolean) => Promise<number> {
  return async (target, samePort = false) => {
    const to = { ...target };
    const server = hostForward(socket, to);
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as AddressInfo).port;
    if (samePort) to.port = port;
    return port;
  };
}

/**
 * An environment for a process on the node, without the `KUBERNETES_SERVICE_*` a pod (a CI
 * runner) would pass on: clients seeing them take in-cluster configuration (Traefik's
 * Knative provider does) and would reach for the outer cluster.
 */
function nodeEnv(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  return Object.fromEntries(Object.entries(env).filter(([k]) => !k.startsWith('KUBERNETES_SERVICE_')));
}

/** Starts the holder in new network and mount namespaces; it dies with this process's end of its stdin. */
function spawnHolder(config: HolderConfig, dir: string): ChildProcess {
  return spawn(
    'unshare',
    [
      '--net',
      '--mount',
      '--propagation',
      'private',
      '--fork',
      '--kill-child=SIGTERM',
      process.execPath,
      HOLDER_SCRIPT,
      JSON.stringify(config),
    ],
    // A group of its own, like the node's programs: it ends when its stdin does (the starter's stop or death).
    { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, [NODE_MARKER]: dir }, detached: true },
  );
}

/**
 * Checks what a node needs of this machine before anything is built or started.
 * @throws Error when this process is not root, or naming a program the node needs that is not on PATH.
 */
export function checkNodeHost(): void {
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

/** The lock file a start holds from its first look at the folder until its holder is ready. */
const START_LOCK = 'start.lock';

/** The longest Unix socket path Linux takes (`sun_path` is 108 bytes with its terminating NUL). */
const MAX_SOCKET_PATH = 107;

/**
 * Takes the folder's start lock (exclusive create, holding this process's PID); one left by a
 * process that is gone is taken over.
 * @returns its release.
 * @throws Error when a live process (this one too) is starting a node from `dir`.
 */
function takeStartLock(dir: string): () => void {
  for (let attempt = 0; attempt < 3; attempt++) {
    const lock = tryLock(join(dir, START_LOCK));
    if ('release' in lock) return lock.release;
    if (lock.holder)
      throw new Error(
        `a test node from ${dir} is being started (by PID ${lock.holder}); wait for it or use another folder`,
      );
  }
  throw new Error(`could not take the start lock of ${dir}`);
}

/** @throws Error when a node from `dir` still runs. */
function refuseSecond(dir: string): void {
  const pid = holderOf(dir);
  if (pid)
    throw new Error(`a test node from ${dir} is already running (holder PID ${pid}); stop it or use another folder`);
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
