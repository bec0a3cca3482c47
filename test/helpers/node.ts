/**
 * What the host shows of itself, for the test node's "nothing is left" checks
 * (test/integration/node-*.test.ts): interfaces, routes, nftables rules, mounts, kernel
 * settings, cgroup folders, and the processes of one node.
 */
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
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
