/**
 * What the bench measures from outside the functions under test:
 * - API requests per user, from the API server's audit log (one line per request at stage
 *   ResponseComplete; every function runs as its own client-certificate user);
 * - bytes the API server sent for reads, from its `apiserver_response_sizes` histogram (the
 *   API server records it for GET and LIST only);
 * - peak RSS and open sockets of a process, sampled from /proc while a row runs;
 * - CPU time a process used over a window, from /proc/<pid>/stat.
 */
import { execFileSync } from 'node:child_process';
import {
  closeSync,
  openSync,
  readSync,
  readFileSync,
  readdirSync,
  readlinkSync,
  realpathSync,
  statSync,
} from 'node:fs';
import type { KubernetesObject } from '@kubernetes/client-node';
import { FUNCTION_NAMES, knativeContainer, type FunctionName } from '../system/functions.ts';
import type { BenchClient } from './client.ts';

/** Requests one user made in a window. */
export interface RequestCounts {
  requests: number;
  /** By verb (`get`, `list`, `create`, `update`, `patch`, `delete`, …). */
  verbs: Record<string, number>;
  /** Answers with HTTP 409 (resourceVersion conflicts, AlreadyExists). */
  conflicts: number;
  /**
   * The same by what was written: `secrets` (mirrors and any other Secret), `<plural>/status`
   * (condition writes), `events` (an Event another reconcile already recorded under its name).
   */
  conflictsOn: Record<string, number>;
  /** Writes (create/update/patch/delete) to Secrets named `captf-creds-…`. */
  mirrorWrites: number;
  /** DELETEs of Secrets. */
  secretDeletes: number;
  /** Answers ≥ 500 or 429. */
  serverErrors: number;
  /** TokenReviews and SubjectAccessReviews created (prepare's caller checks, admission's SARs). */
  reviews: number;
}

interface AuditLine {
  stage?: string;
  verb?: string;
  user?: { username?: string };
  objectRef?: { resource?: string; name?: string; subresource?: string };
  responseStatus?: { code?: number };
}

const emptyCounts = (): RequestCounts => ({
  requests: 0,
  verbs: {},
  conflicts: 0,
  conflictsOn: {},
  mirrorWrites: 0,
  secretDeletes: 0,
  serverErrors: 0,
  reviews: 0,
});
const WRITE_VERBS = new Set(['create', 'update', 'patch', 'delete']);
const REVIEWS = new Set(['tokenreviews', 'subjectaccessreviews']);

/**
 * Reads the API server's audit log (`--audit-log-path`, JSON lines) incrementally.
 * The bench starts its control plane with a rotation size large enough that the log never
 * rotates during a run.
 */
export class AuditLog {
  private readonly path: string;

  /** @param path the audit log file. */
  constructor(path: string) {
    this.path = path;
  }

  /** The current end of the log: a window starts or ends here. */
  mark(): number {
    try {
      return statSync(this.path).size;
    } catch {
      return 0;
    }
  }

  /**
   * Counts the requests logged between two marks, per username.
   * @param from a {@link mark}; @param to a later mark (default: now).
   * @returns counts by username (watches are not counted: they are streams, not requests).
   */
  count(from: number, to = this.mark()): Map<string, RequestCounts> {
    const out = new Map<string, RequestCounts>();
    for (const a of this.entries(from, to)) {
      if (a.stage !== 'ResponseComplete' || a.verb === 'watch') continue;
      const user = a.user?.username ?? '?';
      const c = out.get(user) ?? emptyCounts();
      out.set(user, c);
      countRequest(c, a);
    }
    return out;
  }

  /** The complete lines logged between two marks, parsed. */
  private entries(from: number, to: number): AuditLine[] {
    if (to <= from) return [];
    const buf = Buffer.alloc(to - from);
    const fd = openSync(this.path, 'r');
    try {
      readSync(fd, buf, 0, buf.length, from);
    } finally {
      closeSync(fd);
    }
    const text = buf.toString('utf8');
    const end = text.lastIndexOf('\n');
    return text
      .slice(0, end + 1)
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as AuditLine);
  }

  /** Counts of one user between two marks (zeros when it made none). */
  countFor(user: string, from: number, to?: number): RequestCounts {
    return this.count(from, to).get(user) ?? emptyCounts();
  }
}

/** Adds one request to `c`: its verb, its status, and whether it wrote a Secret. */
function countRequest(c: RequestCounts, a: AuditLine): void {
  const verb = a.verb ?? '?';
  c.requests++;
  c.verbs[verb] = (c.verbs[verb] ?? 0) + 1;
  const code = a.responseStatus?.code ?? 0;
  if (code === 409) countConflict(c, a);
  if (code >= 500 || code === 429) c.serverErrors++;
  c.reviews += isReview(a) ? 1 : 0;
  countSecretWrite(c, a);
}

/** Adds one 409 to `c`, in all and by what was written (`secrets`, `<plural>/status`, `events`). */
function countConflict(c: RequestCounts, a: AuditLine): void {
  c.conflicts++;
  const on = [a.objectRef?.resource ?? '?', a.objectRef?.subresource].filter(Boolean).join('/');
  c.conflictsOn[on] = (c.conflictsOn[on] ?? 0) + 1;
}

/** A TokenReview or SubjectAccessReview created. */
const isReview = (a: AuditLine): boolean => a.verb === 'create' && REVIEWS.has(a.objectRef?.resource ?? '');

/** Counts Secret deletes and writes of mirrors (`captf-creds-*`); subresources are not Secrets. */
function countSecretWrite(c: RequestCounts, a: AuditLine): void {
  if (a.objectRef?.resource !== 'secrets' || a.objectRef.subresource) return;
  if (a.verb === 'delete') c.secretDeletes++;
  if (WRITE_VERBS.has(a.verb ?? '') && a.objectRef.name?.startsWith('captf-creds-')) c.mirrorWrites++;
}

/**
 * Total bytes the API server has sent in answers to GET and LIST since it started: the sum
 * of every `apiserver_response_sizes_sum` series on `/metrics`.
 * @throws ApiError when `/metrics` is refused (the client must be allowed `get` on it).
 */
export async function responseBytes(admin: BenchClient): Promise<number> {
  const { status, body } = await admin.text('GET', '/metrics');
  if (status !== 200) throw new Error(`/metrics: HTTP ${status}`);
  let sum = 0;
  for (const line of body.split('\n')) {
    if (!line.startsWith('apiserver_response_sizes_sum{')) continue;
    sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sum;
}

/** Resident set size of a process in bytes (`VmRSS` of /proc/<pid>/status), or 0 when it is gone. */
export function rssBytes(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

/** Open sockets of a process (file descriptors that are sockets), or 0 when it is gone. */
export function socketCount(pid: number): number {
  try {
    let n = 0;
    for (const fd of readdirSync(`/proc/${pid}/fd`)) {
      try {
        if (readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith('socket:')) n++;
      } catch {
        // closed between readdir and readlink
      }
    }
    return n;
  } catch {
    return 0;
  }
}

/** Peak RSS and sockets of each sampled process over one window. */
export interface Peaks {
  /** Peak RSS in bytes, by process label. */
  rss: Record<string, number>;
  /** Peak open sockets, by process label. */
  sockets: Record<string, number>;
}

/**
 * Samples RSS and sockets of some processes every `everyMs` until stopped, so a row reports
 * its own peak (a process's lifetime high-water mark would carry over from earlier rows).
 * @param pids label → pid.
 * @returns `stop()`, which takes one last sample and returns the peaks.
 */
export function samplePeaks(pids: Record<string, number>, everyMs = 50): { stop(): Peaks } {
  const peaks: Peaks = { rss: {}, sockets: {} };
  const sample = () => {
    for (const [label, pid] of Object.entries(pids)) {
      peaks.rss[label] = Math.max(peaks.rss[label] ?? 0, rssBytes(pid));
      peaks.sockets[label] = Math.max(peaks.sockets[label] ?? 0, socketCount(pid));
    }
  };
  sample();
  const timer = setInterval(sample, everyMs);
  return {
    stop() {
      clearInterval(timer);
      sample();
      return peaks;
    },
  };
}

/** Clock ticks per second of /proc/<pid>/stat's times (`getconf CLK_TCK`; 100 on Linux unless told otherwise). */
const CLK_TCK = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** CPU time (user + system) a process has used so far, in ms; 0 when it is gone. */
export function cpuMs(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(f[11]) + Number(f[12])) * 1000) / CLK_TCK;
  } catch {
    return 0;
  }
}

/** Processes whose parent is `parent` and whose executable is one of `executables` (paths resolved). */
export function childrenRunning(parent: number, executables: readonly string[]): number[] {
  const wanted = new Set(executables.map((e) => realpathSync(e)));
  const out: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === parent && wanted.has(readlinkSync(`/proc/${entry}/exe`))) out.push(Number(entry));
    } catch {
      // gone meanwhile, or not ours to read
    }
  }
  return out;
}

/**
 * CPU time used by groups of processes over a window.
 * @param groups label → pids.
 * @returns `stop()`: ms of CPU each group used since the call (a process that exited meanwhile counts 0).
 */
export function measureCpu(groups: Record<string, readonly number[]>): { stop(): Record<string, number> } {
  const at = (pids: readonly number[]) => pids.map(cpuMs);
  const start = Object.fromEntries(Object.entries(groups).map(([k, pids]) => [k, at(pids)]));
  return {
    stop: () =>
      Object.fromEntries(
        Object.entries(groups).map(([k, pids]) => [
          k,
          at(pids).reduce((sum, t, i) => sum + Math.max(0, t - start[k]![i]!), 0),
        ]),
      ),
  };
}

/** Parses a Kubernetes memory quantity (`192Mi`, `1Gi`, `500M`) into bytes. */
export function quantityBytes(q: string): number {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|K|M|G)?$/.exec(q);
  if (!m) throw new Error(`unsupported quantity ${q}`);
  const mult: Record<string, number> = { Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, K: 1e3, M: 1e6, G: 1e9 };
  return Number(m[1]) * (m[2] ? mult[m[2]]! : 1);
}

/** Each function container's memory limit in the rendered Knative Services, in bytes. @throws Error when one sets none. */
export function memoryLimits(rendered: readonly KubernetesObject[]): Record<FunctionName, number> {
  const limits = {} as Record<FunctionName, number>;
  for (const fn of FUNCTION_NAMES) {
    const limit = knativeContainer(rendered, fn)?.resources?.limits?.memory;
    if (!limit) throw new Error(`the rendered Knative Service captf-${fn} sets no memory limit`);
    limits[fn] = quantityBytes(limit);
  }
  return limits;
}
