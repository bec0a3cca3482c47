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
  /**
   * `/etc/resolv.conf` as the node's own processes see it (bind-mounted in its mount namespace
   * only): cluster DNS, as a pod's, so a process run on the node (the Eventing data plane,
   * the API server resolving an ExternalName Service) finds `*.svc.cluster.local`.
   */
  resolvConf: string;
}

/**
 * The kernel settings the kubelet wants (v1.36 `pkg/kubelet/cm/container_manager_linux.go`
 * `setupKernelTunables`), under /proc/sys. They are host-wide, not per namespace: left to
 * itself the kubelet would write them on the host (`kernel.panic` 10, panic on every oops,
 * overcommit always). The holder bind-mounts files holding exactly these values over them in
 * the node's mount namespace, and the kubelet runs with `protectKernelDefaults`, so it only
 * reads them and would refuse to start, not write, if one were missing.
 */
export const KUBELET_KERNEL_SETTINGS: Readonly<Record<string, number>> = {
  'vm/overcommit_memory': 1,
  'vm/panic_on_oom': 0,
  'kernel/panic': 10,
  'kernel/panic_on_oops': 1,
  'kernel/keys/root_maxkeys': 1_000_000,
  'kernel/keys/root_maxbytes': 25_000_000,
};

/** The node's network: one address on a bridge, and the Service CIDR routed to it. */
export const NODE_NETWORK = { bridge: 'node0', address: '10.240.0.1/24', serviceCidr: '10.0.0.0/24' } as const;

/** Cluster DNS: CoreDNS binds the node's address (./services.ts); the kubelet gives it to pods. */
export const CLUSTER_DNS = { address: '10.240.0.1', domain: 'cluster.local' } as const;

/**
 * The node's own `/etc/resolv.conf`: cluster DNS with the cluster-wide part of a pod's search
 * list and a pod's ndots, and nothing upstream (no name outside the cluster resolves).
 */
export const NODE_RESOLV_CONF =
  `nameserver ${CLUSTER_DNS.address}\n` +
  `search svc.${CLUSTER_DNS.domain} ${CLUSTER_DNS.domain}\n` +
  'options ndots:5\n';

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
  const strings = ['bridge', 'address', 'serviceCidr', 'cgroupRoot', 'socket', 'resolvConf'] as const;
  for (const k of strings) if (typeof c[k] !== 'string' || !c[k]) throw new Error(`node holder: ${k} is missing`);
  if (!/^[a-z0-9][a-z0-9-]{0,62}$/.test(c.cgroupRoot!))
    throw new Error('node holder: cgroupRoot must be one path element');
  if (!Array.isArray(c.cgroupHierarchies)) throw new Error('node holder: cgroupHierarchies is missing');
  return { ...(c as HolderConfig), graceMs: typeof c.graceMs === 'number' ? c.graceMs : 10_000 };
}
