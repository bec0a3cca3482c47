/**
 * The test node's cgroups: one root folder per node (named from its folder) in every hierarchy
 * this machine mounts, v1 controllers and the unified one alike. The kubelet puts every pod
 * under it (its `cgroupRoot`) and runc mirrors each container into the unified hierarchy too,
 * so the tree is what finds a container's processes (they have their own namespaces) and what
 * must be gone after a stop. Used by the holder (inside) and by the sweep (from the host).
 */
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';

/** Where the cgroup file systems are mounted. */
export const CGROUP_FS = '/sys/fs/cgroup';

/** The cgroup hierarchies to make the node's root in: every v1 controller mount and the unified one. */
export function cgroupHierarchies(): string[] {
  if (existsSync(join(CGROUP_FS, 'cgroup.controllers'))) return ['']; // cgroup v2 only
  return readdirSync(CGROUP_FS, { withFileTypes: true })
    .filter((d) => d.isDirectory())
    .map((d) => d.name)
    .sort();
}

/** How every node's cgroup root is named at the top of a hierarchy. */
export const NODE_ROOT_PREFIX = 'captf-node-';

/** The node's cgroup root, one per folder. */
export const cgroupRootOf = (dir: string): string =>
  `${NODE_ROOT_PREFIX}${createHash('sha256').update(dir).digest('hex').slice(0, 10)}`;

/**
 * The node's root folder and every folder under it in one hierarchy, deepest first ([] when
 * absent). Folders may vanish during the walk (runc removes a container's cgroup when its shim
 * deletes it): those are left out, not an error.
 */
function tree(hierarchy: string, root: string): string[] {
  const out: string[] = [];
  const walk = (dir: string) => {
    let entries;
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch {
      return; // gone meanwhile (or never there)
    }
    for (const e of entries) if (e.isDirectory()) walk(join(dir, e.name));
    out.push(dir);
  };
  walk(join(CGROUP_FS, hierarchy, root));
  return out;
}

/** PIDs of every process in the node's cgroups, in any hierarchy. */
export function cgroupProcesses(root: string, hierarchies: readonly string[]): number[] {
  const pids = new Set<number>();
  for (const h of hierarchies)
    for (const d of tree(h, root)) {
      try {
        for (const l of readFileSync(join(d, 'cgroup.procs'), 'utf8').split('\n')) if (l) pids.add(Number(l));
      } catch {
        // Removed meanwhile.
      }
    }
  return [...pids];
}

/**
 * Removes the node's cgroup tree in every hierarchy, deepest first (only an empty cgroup can go).
 * @returns the folders that could not be removed (a process still in them).
 */
export function removeCgroups(root: string, hierarchies: readonly string[]): string[] {
  const left: string[] = [];
  for (const h of hierarchies)
    for (const d of tree(h, root)) {
      try {
        rmdirSync(d);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') left.push(d);
      }
    }
  return left;
}

/**
 * {@link removeCgroups}, retried for up to 5 s while some are left: a killed task keeps its
 * cgroup busy for a moment after it is gone from /proc.
 * @returns the folders still left.
 */
export async function removeCgroupsPatiently(root: string, hierarchies: readonly string[]): Promise<string[]> {
  let left = removeCgroups(root, hierarchies);
  for (let i = 0; i < 50 && left.length; i++) {
    await new Promise((r) => setTimeout(r, 100));
    left = removeCgroups(root, hierarchies);
  }
  return left;
}

/**
 * The cgroup folder of container `id` (its containerd ID) in one hierarchy, found under the
 * node's root (the kubelet nests it under `kubepods/<QoS class>/pod<uid>/`).
 * @throws Error when it has none there.
 */
export function containerCgroup(root: string, hierarchy: string, id: string): string {
  const found = tree(hierarchy, root).find((d) => d.endsWith(`/${id}`));
  if (!found) throw new Error(`container ${id} has no cgroup under ${join(CGROUP_FS, hierarchy, root)}`);
  return found;
}
