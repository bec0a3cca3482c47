/**
 * What the node's namespace holder (holder.ts) is told to set up, passed to it as one JSON
 * argument by namespace.ts. Pure: parsing and the defaults.
 */

/** The holder's configuration. */
export interface HolderConfig {
  /** The node's bridge inside the namespace. */
  bridge: string;
  /** The node's address with its prefix, on the bridge (e.g. `10.240.0.1/24`). */
  address: string;
  /** The Service CIDR, routed to the bridge so ClusterIPs are reachable before kube-proxy's DNAT. */
  serviceCidr: string;
  /** The node's cgroup root (unique per node), created and removed in every hierarchy listed. */
  cgroupRoot: string;
  /** cgroup hierarchies under /sys/fs/cgroup the root is made in (v1 controllers, `unified`). */
  cgroupHierarchies: string[];
  /** The Unix socket the holder serves the way in from the host on (./forward.ts). */
  socket: string;
  /** How long processes inside get between SIGTERM and SIGKILL at teardown (ms). */
  graceMs: number;
}

/** The node's network: one address on a bridge, and the Service CIDR routed to it. */
export const NODE_NETWORK = { bridge: 'node0', address: '10.240.0.1/24', serviceCidr: '10.0.0.0/24' } as const;

/**
 * Parses the holder's JSON argument.
 * @throws Error naming what is missing or malformed.
 */
export function parseHolderConfig(raw: string): HolderConfig {
  let c: Partial<HolderConfig>;
  try {
    c = JSON.parse(raw) as Partial<HolderConfig>;
  } catch {
    throw new Error('node holder: its argument must be its configuration as JSON');
  }
  const strings = ['bridge', 'address', 'serviceCidr', 'cgroupRoot', 'socket'] as const;
  for (const k of strings) if (typeof c[k] !== 'string' || !c[k]) throw new Error(`node holder: ${k} is missing`);
  if (!/^[a-z0-9][a-z0-9-]{0,62}$/.test(c.cgroupRoot!))
    throw new Error('node holder: cgroupRoot must be one path element');
  if (!Array.isArray(c.cgroupHierarchies)) throw new Error('node holder: cgroupHierarchies is missing');
  return { ...(c as HolderConfig), graceMs: typeof c.graceMs === 'number' ? c.graceMs : 10_000 };
}
