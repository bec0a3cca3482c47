/**
 * The test node's kubelet and its pod network: the kubelet registers Node {@link NODE_NAME}
 * with the node's address, runs pods through the node's containerd (./containerd.ts) in
 * cgroups under the node's root, and the CNI bridge gives each pod an address in
 * {@link POD_CIDR}. Everything it writes goes under the node's folder or the namespace's
 * private `/run`, `/var/log` and `/var/lib`.
 *
 * This machine's two departures from a kubelet's defaults: cgroup v1 (1.36 refuses it unless
 * `failCgroupV1: false`) and root without CAP_SYS_RESOURCE (the rlimit and oom-score warnings
 * it logs are harmless). Eviction thresholds are lowered so a full test disk does not evict
 * the functions mid-test.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, openSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { dumpYaml } from '@kubernetes/client-node';
import { CLUSTER_DNS } from './config.ts';
import type { NodeNamespace } from './namespace.ts';

/** The Node's name. */
export const NODE_NAME = 'captf-node';

/** The pods' addresses (one node, one range; the CNI bridge is their gateway). */
export const POD_CIDR = '10.244.0.0/24';

/**
 * Every line the kubelet logged so far for the pods of `deployment` in `namespace` (all
 * containers, all restarts; each line starts with the kubelet's RFC 3339 time), read from its
 * pod-log folder `podLogs` ({@link KubeletPaths}). A deleted pod's lines go when the kubelet
 * removes its folder.
 */
export function deploymentLog(podLogs: string, namespace: string, deployment: string): string[] {
  if (!existsSync(podLogs)) return [];
  return readdirSync(podLogs)
    .filter((pod) => pod.startsWith(`${namespace}_${deployment}-`))
    .flatMap((pod) =>
      readdirSync(join(podLogs, pod), { recursive: true, withFileTypes: true })
        .filter((f) => f.isFile())
        .flatMap((f) => readFileSync(join(f.parentPath, f.name), 'utf8').split('\n').filter(Boolean)),
    );
}

/** The kubelet's folders and files under the node's folder. */
export interface KubeletPaths {
  /** `--root-dir`: pods' volumes, plugins, its own certificate. */
  root: string;
  podLogs: string;
  /** The resolv.conf pods with `dnsPolicy: Default` get: nothing upstream here. */
  resolvConf: string;
  /** containerd's socket. */
  runtime: string;
  /** The client CA that signs the API server's (and users') client certificates. */
  clientCA: string;
}

/** The kubelet's configuration file (KubeletConfiguration v1beta1). Pure. */
export function kubeletConfig(o: { paths: KubeletPaths; address: string; cgroupRoot: string }): string {
  return dumpYaml({
    apiVersion: 'kubelet.config.k8s.io/v1beta1',
    kind: 'KubeletConfiguration',
    failCgroupV1: false,
    cgroupDriver: 'cgroupfs',
    cgroupRoot: `/${o.cgroupRoot}`,
    cgroupsPerQOS: true,
    containerRuntimeEndpoint: `unix://${o.paths.runtime}`,
    imageServiceEndpoint: `unix://${o.paths.runtime}`,
    address: o.address,
    port: 10250,
    readOnlyPort: 0,
    healthzBindAddress: '127.0.0.1',
    healthzPort: 10248,
    authentication: {
      anonymous: { enabled: false },
      webhook: { enabled: true },
      x509: { clientCAFile: o.paths.clientCA },
    },
    authorization: { mode: 'Webhook' },
    podLogsDir: o.paths.podLogs,
    resolvConf: o.paths.resolvConf,
    clusterDomain: CLUSTER_DNS.domain,
    clusterDNS: [CLUSTER_DNS.address],
    failSwapOn: false,
    // Check the kernel settings, never write them: they are the host's (./config.ts KUBELET_KERNEL_SETTINGS).
    protectKernelDefaults: true,
    evictionHard: {
      'memory.available': '100Mi',
      'nodefs.available': '2%',
      'imagefs.available': '2%',
      'nodefs.inodesFree': '2%',
    },
    imageGCHighThresholdPercent: 99,
    imageGCLowThresholdPercent: 98,
    serializeImagePulls: false,
    maxPods: 30,
    registerNode: true,
  });
}

/**
 * The pod network's CNI configuration list: one bridge `cni0` that is the pods' gateway
 * (hairpin, so a pod reaches itself through a Service), addresses from `host-local`. No
 * masquerade: nothing leaves the node. No `loopback` plugin in the chain: containerd brings
 * each pod's `lo` up itself. Pure.
 */
export function cniConflist(ipamDir: string): string {
  const gateway = POD_CIDR.replace(/0\/24$/, '1');
  return JSON.stringify(
    {
      cniVersion: '1.0.0',
      name: 'captf-node',
      plugins: [
        {
          type: 'bridge',
          bridge: 'cni0',
          isGateway: true,
          ipMasq: false,
          hairpinMode: true,
          ipam: {
            type: 'host-local',
            dataDir: ipamDir,
            ranges: [[{ subnet: POD_CIDR, gateway }]],
            routes: [{ dst: '0.0.0.0/0' }],
          },
        },
      ],
    },
    null,
    2,
  );
}

/** Options of {@link startKubelet}. */
export interface KubeletOptions {
  /** The node's folder; the kubelet's go under `kubelet/`. */
  dir: string;
  bin: string;
  /** Its kubeconfig: user `system:node:<name>` in `system:nodes` (the Node authorizer's rule). */
  kubeconfig: string;
  runtime: string;
  clientCA: string;
  /** Folder of containerd's CNI configuration. */
  cniConfDir: string;
}

/** Writes the kubelet's and the pod network's configuration and starts it inside `ns`. */
export function startKubelet(ns: NodeNamespace, o: KubeletOptions): ChildProcess {
  const base = join(o.dir, 'kubelet');
  const paths: KubeletPaths = {
    root: join(base, 'root'),
    podLogs: join(base, 'pod-logs'),
    resolvConf: join(base, 'resolv.conf'),
    runtime: o.runtime,
    clientCA: o.clientCA,
  };
  for (const d of [paths.root, paths.podLogs, o.cniConfDir]) mkdirSync(d, { recursive: true });
  writeFileSync(paths.resolvConf, 'nameserver 127.0.0.1\n');
  writeFileSync(join(o.cniConfDir, '10-captf-node.conflist'), cniConflist(join(base, 'cni-ipam')));
  const config = join(base, 'config.yaml');
  writeFileSync(config, kubeletConfig({ paths, address: ns.address, cgroupRoot: ns.cgroupRoot }));
  const log = openSync(join(base, 'kubelet.log'), 'a');
  return ns.spawn(
    o.bin,
    [
      `--config=${config}`,
      `--kubeconfig=${o.kubeconfig}`,
      `--root-dir=${paths.root}`,
      `--cert-dir=${join(paths.root, 'pki')}`,
      `--hostname-override=${NODE_NAME}`,
      `--node-ip=${ns.address}`,
      '--v=1',
    ],
    { stdio: ['ignore', log, log] },
  );
}
