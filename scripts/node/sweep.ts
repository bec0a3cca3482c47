/**
 * Who owns a test node, and the sweep of what nodes nothing owns left behind.
 *
 * A node is known by the folder its processes carry in {@link NODE_MARKER} (its holder, its
 * programs, containerd and the shims it forks) and by its cgroup root in every hierarchy
 * (containers carry an environment of their own). It is owned while its holder lives (a marked
 * root process running the holder's program) or the process that started it lives (the
 * `owner` file: PID and start time, so a reused PID or a zombie does not count). Whatever a
 * node without an owner left, a sweep kills and removes.
 *
 * Sweeps and the part of a start that makes a node owned take one machine-wide lock, an
 * abstract Unix socket (the kernel frees it when its holder dies), so a sweep never sees a node
 * half-started, and never races another sweep.
 */
import {
  closeSync,
  constants,
  fstatSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  rmSync,
  statSync,
  writeSync,
} from 'node:fs';
import { createServer } from 'node:net';
import { isAbsolute, join } from 'node:path';
import { REPO_ROOT } from '../tools/build.ts';
import {
  CGROUP_FS,
  cgroupHierarchies,
  cgroupProcesses,
  cgroupRootOf,
  NODE_ROOT_PREFIX,
  removeCgroupsPatiently,
} from './cgroups.ts';

/** Environment variable marking every process started in a node: its folder. */
export const NODE_MARKER = 'CAPTF_NODE_DIR';

/** The holder's program (namespace.ts starts it as `unshare … node holder.ts`). */
export const HOLDER_SCRIPT = join(REPO_ROOT, 'scripts', 'node', 'holder.ts');

/** The file in a node's folder naming the process that started it, while it runs. */
const OWNER_FILE = 'owner';

/** The machine-wide lock of sweeps and of starts (an abstract socket of the host's network namespace). */
const SWEEP_LOCK = '\0captf-node-sweep';

/** How long a start or a sweep waits for the machine-wide lock, in ms. */
const LOCK_WAIT_MS = 300_000;

/**
 * Runs `fn` holding the machine-wide lock of sweeps and starts.
 * @throws Error when the lock stayed taken for {@link LOCK_WAIT_MS}, or `fn`'s error.
 */
export async function withSweepLock<T>(fn: () => Promise<T>): Promise<T> {
  const server = createServer();
  const deadline = Date.now() + LOCK_WAIT_MS;
  for (;;) {
    const err = await new Promise<NodeJS.ErrnoException | undefined>((resolve) => {
      server.once('error', resolve);
      server.listen({ path: SWEEP_LOCK }, () => {
        server.off('error', resolve);
        resolve(undefined);
      });
    });
    if (!err) break;
    if (err.code !== 'EADDRINUSE') throw err;
    if (Date.now() > deadline)
      throw new Error(`another test node's start or sweep held the machine-wide lock for ${LOCK_WAIT_MS / 1000} s`);
    await new Promise((r) => setTimeout(r, 100));
  }
  try {
    return await fn();
  } finally {
    await new Promise<void>((r) => server.close(() => r()));
  }
}

/** Records that this process owns the node from `dir` (call under {@link withSweepLock}, once its holder is ready). */
export function recordOwner(dir: string): void {
  const own = processState(process.pid);
  writeSmallFile(join(dir, OWNER_FILE), `${process.pid} ${own?.startTime ?? ''}\n`);
}

/** Forgets the owner of the node from `dir` (its stop). */
export function forgetOwner(dir: string): void {
  rmSync(join(dir, OWNER_FILE), { force: true });
}

/** Whether process `pid` carries `dir` in its {@link NODE_MARKER}. */
function markedWith(pid: number, dir: string): boolean {
  return markerOf(pid) === dir;
}

/**
 * PIDs of the processes (other than this one) of the node from `dir`: those started for it
 * (marked), and those in its cgroups (containers, which carry their own environment).
 */
export function markedProcesses(dir: string): number[] {
  const marked = pids().filter((pid) => markedWith(pid, dir));
  const contained = cgroupProcesses(cgroupRootOf(dir), cgroupHierarchies());
  return [...new Set([...marked, ...contained])].filter((pid) => pid !== process.pid);
}

/** The PID of the live holder of the node from `dir`, if there is one. */
export function holderOf(dir: string): number | undefined {
  return scanNodes().get(dir)?.holder;
}

/** Kills what a holder that was killed itself left of a node from `dir`, and removes its cgroups. */
export async function sweepNode(dir: string): Promise<void> {
  await sweepRoot(cgroupRootOf(dir), () => markedProcesses(dir));
}

/** What {@link sweepNodes} found. */
export interface SweepReport {
  /** Each node swept: its folder, or its cgroup root when no process named the folder any more. */
  swept: string[];
  /** The folders of nodes something still owns, left alone. */
  running: string[];
  /** What could not be removed, and why. */
  failed: string[];
}

/**
 * Sweeps what test nodes of any folder left on this machine once nothing owns them (see the
 * module's comment); a cgroup root that no process names a folder for is swept too. A node
 * still owned is left to its owner's stop or its holder's teardown; one whose holder was
 * killed while its owner lives waits for the owner's end or the next start from its folder.
 * Takes the machine-wide lock (`locked`: the caller holds it).
 */
export async function sweepNodes(locked = false): Promise<SweepReport> {
  if (!locked) return withSweepLock(() => sweepNodes(true));
  const hierarchies = cgroupHierarchies();
  const report: SweepReport = { swept: [], running: [], failed: [] };
  const sweep = async (what: string, run: () => Promise<void>) => {
    try {
      await run();
      report.swept.push(what);
    } catch (err) {
      report.failed.push(`${what}: ${(err as Error).message}`);
    }
  };
  const nodes = scanNodes();
  const owned = [...nodes].filter(([dir, n]) => n.holder !== undefined || ownerLives(dir)).map(([dir]) => dir);
  const ownedRoots = new Set(owned.map(cgroupRootOf));
  report.running.push(...owned);
  for (const dir of nodes.keys()) {
    if (owned.includes(dir)) continue;
    if (ownedRoots.has(cgroupRootOf(dir))) report.failed.push(`${dir}: its cgroup root is a running node's too`);
    else await sweep(dir, () => sweepNode(dir));
  }
  const named = new Set([...nodes.keys()].map(cgroupRootOf));
  for (const root of new Set(hierarchies.flatMap(nodeRoots)))
    if (!named.has(root)) await sweep(root, () => sweepRoot(root, () => cgroupProcesses(root, hierarchies)));
  return report;
}

/**
 * SIGKILLs the processes `find` names until none are left, then removes cgroup root `root`.
 * @throws Error naming the cgroup folders that could not be removed.
 */
async function sweepRoot(root: string, find: () => number[]): Promise<void> {
  // Again and again: what is killed may have forked meanwhile (a shim, a container's init).
  // A cgroup can only be removed once the processes in it have exited.
  for (let i = 0; i < 50; i++) {
    const left = find();
    if (!left.length) break;
    for (const pid of left) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // Gone meanwhile.
      }
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  const left = await removeCgroupsPatiently(root, cgroupHierarchies());
  if (left.length) throw new Error(`the test node's cgroups could not be removed: ${left.join(', ')}`);
}

/** Every node folder a live root process carries in its marker, with its holder's PID when the holder lives. */
function scanNodes(): Map<string, { holder?: number }> {
  const nodes = new Map<string, { holder?: number }>();
  for (const pid of pids()) {
    const dir = markerOf(pid);
    // Only root's processes: a user's own marker must not make root's sweep kill anything else.
    if (!dir || !isAbsolute(dir) || !ownedByRoot(pid)) continue;
    const node = nodes.get(dir) ?? {};
    if (isHolder(pid) && processState(pid)?.state !== 'Z') node.holder ??= pid;
    nodes.set(dir, node);
  }
  return nodes;
}

/** Whether the process recorded in `dir`'s owner file lives (the same PID and start time, not a zombie). */
function ownerLives(dir: string): boolean {
  const [pid, startTime] = (readSmallFile(join(dir, OWNER_FILE)) ?? '').trim().split(' ');
  const state = pid ? processState(Number(pid)) : undefined;
  return state !== undefined && state.state !== 'Z' && state.startTime === startTime;
}

/** The test nodes' cgroup roots at the top of `hierarchy`. */
function nodeRoots(hierarchy: string): string[] {
  try {
    return readdirSync(join(CGROUP_FS, hierarchy), { withFileTypes: true })
      .filter((d) => d.isDirectory() && d.name.startsWith(NODE_ROOT_PREFIX))
      .map((d) => d.name);
  } catch {
    return [];
  }
}

/** Every PID in /proc but this process's. */
const pids = (): number[] =>
  readdirSync('/proc')
    .map(Number)
    .filter((pid) => Number.isInteger(pid) && pid > 0 && pid !== process.pid);

/** The folder process `pid` carries in {@link NODE_MARKER}, if any. */
function markerOf(pid: number): string | undefined {
  try {
    const entry = readFileSync(`/proc/${pid}/environ`, 'utf8')
      .split('\0')
      .find((e) => e.startsWith(`${NODE_MARKER}=`));
    return entry?.slice(NODE_MARKER.length + 1);
  } catch {
    return undefined; // gone meanwhile, or not ours to read
  }
}

/** Whether process `pid` is a holder (the holder's program, or the `unshare` that forked it). */
function isHolder(pid: number): boolean {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').includes(HOLDER_SCRIPT);
  } catch {
    return false;
  }
}

/** Whether process `pid` runs as root. */
function ownedByRoot(pid: number): boolean {
  try {
    return statSync(`/proc/${pid}`).uid === 0;
  } catch {
    return false;
  }
}

/** Process `pid`'s state letter and start time (clock ticks after boot, as text), if it exists. */
function processState(pid: number): { state: string; startTime: string } | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // After the command's closing parenthesis: state is field 3, starttime field 22.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { state: fields[0]!, startTime: fields[19]! };
  } catch {
    return undefined;
  }
}

/** The longest owner file read, in bytes. */
const SMALL_FILE = 64;

/**
 * A small regular file's text, read without following a symlink or waiting on a FIFO (the
 * folder may be one a user can write to); undefined when it is missing or not such a file.
 */
function readSmallFile(file: string): string | undefined {
  let fd: number;
  try {
    fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch {
    return undefined;
  }
  try {
    if (!fstatSync(fd).isFile()) return undefined;
    const buf = Buffer.alloc(SMALL_FILE);
    return buf.subarray(0, readSync(fd, buf, 0, SMALL_FILE, 0)).toString('utf8');
  } finally {
    closeSync(fd);
  }
}

/** Writes `text` to `file`, replacing a file but never following a symlink there. */
function writeSmallFile(file: string, text: string): void {
  rmSync(file, { force: true });
  const fd = openSync(file, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o644);
  try {
    writeSync(fd, text);
  } finally {
    closeSync(fd);
  }
}
