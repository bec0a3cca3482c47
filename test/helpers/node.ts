/**
 * What the host shows of itself, for the test node's "nothing is left" checks
 * (test/integration/node-*.test.ts): interfaces, routes, nftables rules, mounts, kernel
 * settings, cgroup folders, and the processes of one node; and the node's logs, scanned for
 * planted Secret values.
 */
import { execFileSync } from 'node:child_process';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { V1Pod } from '@kubernetes/client-node';
import { scanLater } from './leaks.ts';
import { CGROUP_FS, cgroupHierarchies, cgroupRootOf } from '../../scripts/node/cgroups.ts';
import { KUBELET_KERNEL_SETTINGS } from '../../scripts/node/config.ts';
import { markedProcesses } from '../../scripts/node/namespace.ts';

/**
 * Processes of the node from `dir`: those marked for it or in its cgroups, and those that name
 * its folder on their command line (containerd's shims do).
 */
export function nodeProcesses(dir: string): number[] {
  const naming = readdirSync('/proc')
    .map(Number)
    .filter((pid) => Number.isInteger(pid) && pid !== process.pid)
    .filter((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(dir);
      } catch {
        return false;
      }
    });
  return [...new Set([...naming, ...markedProcesses(dir)])].sort();
}

/**
 * Every cgroup folder in every hierarchy (`<hierarchy>/<path>`), leaving out the trees of test
 * nodes other than the one from `dir` (files running beside this one start their own).
 */
export function cgroupFolders(dir: string): string[] {
  const own = cgroupRootOf(dir);
  return cgroupHierarchies().flatMap((h) => {
    const top = `${CGROUP_FS}/${h}`;
    return readdirSync(top, { recursive: true, withFileTypes: true })
      .filter((d) => d.isDirectory())
      .map((d) => `${d.parentPath}/${d.name}`.slice(top.length + 1))
      .filter((p) => !p.startsWith('captf-node-') || p.startsWith(own))
      .map((p) => `${h}/${p}`);
  });
}

/**
 * What any node could change on the host: its interfaces, routes, nftables rules, mounts, and
 * the host-wide kernel settings the kubelet checks.
 */
export function hostShared(): { links: string; routes: string; nftables: string; mounts: string; kernel: string[] } {
  const run = (cmd: string, ...args: string[]) => execFileSync(cmd, args, { encoding: 'utf8' });
  return {
    links: run('ip', '-o', 'link', 'show').replace(/\s+link\/.*$/gm, ''),
    routes: run('ip', 'route', 'show', 'table', 'all'),
    nftables: run('nft', 'list', 'ruleset'),
    mounts: readFileSync('/proc/self/mountinfo', 'utf8'),
    kernel: Object.keys(KUBELET_KERNEL_SETTINGS).map((k) => `${k}=${readFileSync(`/proc/sys/${k}`, 'utf8').trim()}`),
  };
}

/** {@link hostShared}, and what the node from `dir` has in cgroups and processes. */
export function hostState(dir: string) {
  return { ...hostShared(), cgroups: cgroupFolders(dir), processes: nodeProcesses(dir) };
}

/**
 * Every log of a node started by the system starter in `work` and of its control plane (pods,
 * kubelet, containerd, kube-proxy, CoreDNS, Traefik, the API server and its audit log); not the
 * kubelet's volumes, where a mounted Secret's files hold planted values by design.
 */
const NODE_LOGS = [
  'node/kubelet/kubelet.log',
  'node/kubelet/pod-logs',
  'node/containerd/containerd.log',
  'node/kube-proxy',
  'node/coredns',
  'node/traefik',
  'controlplane/logs',
];

/** The file at `path`, or every file under it, concatenated ('' when absent). */
function readTree(path: string): string {
  if (!existsSync(path)) return '';
  if (!statSync(path).isDirectory()) return readFileSync(path, 'utf8');
  return readdirSync(path, { recursive: true, withFileTypes: true })
    .filter((d) => d.isFile())
    .map((d) => readFileSync(join(d.parentPath, d.name), 'utf8'))
    .join('\n');
}

/** Scans every log of the node in `work` for planted values after the file (./leaks.ts). */
export function scanNodeLogs(work: string): void {
  scanLater('node logs', () => NODE_LOGS.map((p) => readTree(join(work, p))).join('\n'));
}

/** A pod's log as the node's kubelet wrote it (all containers, all restarts). */
export const podLog = (work: string, pod: V1Pod): string =>
  readTree(
    join(work, 'node', 'kubelet', 'pod-logs', `${pod.metadata!.namespace}_${pod.metadata!.name}_${pod.metadata!.uid}`),
  );

/**
 * Stops a system started with a node in `work` (its state folder) and checks the stop left no
 * cgroup of the node and failed at nothing (`progress` holds the system's progress lines); the
 * folder goes in any case.
 */
export async function stopNodeSystem(system: { stop(): Promise<void> }, work: string, progress: readonly string[]) {
  try {
    await system.stop();
    const root = cgroupRootOf(join(work, 'node'));
    const left = cgroupFolders(join(work, 'node')).filter((f) => f.split('/')[1] === root);
    const failed = progress.filter((l) => l.startsWith('while stopping'));
    assert.deepEqual({ left, failed }, { left: [], failed: [] }, 'the stop removed every cgroup and failed at nothing');
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
