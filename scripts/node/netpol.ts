/**
 * NetworkPolicy on the test node, for the files that test a policy's effect: kube-router's
 * firewall (`--run-firewall` only; its router and service proxy stay off, the node's bridge and
 * kube-proxy do that work) inside the node's network namespace, as its own user with the
 * permissions upstream's DaemonSet gives it. It turns each policy into iptables rules and
 * ipsets there (iptables-nft beside kube-proxy's nftables table; both must accept a packet).
 *
 * Why kube-router: kind's kube-network-policies queues each new connection through nftables'
 * `queue`, which kernels built without `CONFIG_NFT_QUEUE` (this project's CI kernel) lack;
 * kube-router needs only xtables matches. Upstream always admits traffic from the node's own
 * addresses to its pods (the kubelet's probes), so what a policy decides is seen from pods.
 */
import { execFileSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, openSync } from 'node:fs';
import { join } from 'node:path';
import type { KubeConfig, KubernetesObject } from '@kubernetes/client-node';
import { userKubeConfig } from '../controlplane/controlplane.ts';
import { serverSideApply } from '../lib/kube.ts';
import { eventually, firstLine } from '../lib/wait.ts';
import { ensureTool } from '../tools/build.ts';
import { NODE_NETWORK } from './config.ts';
import { NODE_NAME } from './kubelet.ts';
import type { NodeNamespace } from './namespace.ts';

/** The user kube-router runs as (a client certificate of the control plane's CA). */
export const KUBE_ROUTER_USER = 'captf-node:kube-router';
/** kube-router's health port inside the node (its default). */
const HEALTH_PORT = 20244;
/** How long its first sync may take, in ms (generous: informers, then every policy and pod). */
const HEALTHY_TIMEOUT_MS = 60_000;

/**
 * What kube-router reads, as upstream's DaemonSet grants it (cloudnativelabs/kube-router
 * `daemonset/generic-kuberouter.yaml`, read-only): it starts informers for all of these even
 * when only its firewall runs.
 */
export const KUBE_ROUTER_RBAC: KubernetesObject[] = [
  {
    apiVersion: 'rbac.authorization.k8s.io/v1',
    kind: 'ClusterRole',
    metadata: { name: 'captf-node:kube-router' },
    rules: [
      {
        apiGroups: [''],
        resources: ['namespaces', 'pods', 'services', 'nodes', 'endpoints'],
        verbs: ['get', 'list', 'watch'],
      },
      { apiGroups: ['networking.k8s.io'], resources: ['networkpolicies'], verbs: ['get', 'list', 'watch'] },
      { apiGroups: ['discovery.k8s.io'], resources: ['endpointslices'], verbs: ['get', 'list', 'watch'] },
    ],
  } as KubernetesObject,
  {
    apiVersion: 'rbac.authorization.k8s.io/v1',
    kind: 'ClusterRoleBinding',
    metadata: { name: 'captf-node:kube-router' },
    roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'captf-node:kube-router' },
    subjects: [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: KUBE_ROUTER_USER }],
  } as KubernetesObject,
];

/** @throws Error naming the Debian package when `iptables` or `ipset` (kube-router runs both) is missing. */
export function checkNetworkPolicyHost(): void {
  for (const [program, pkg] of [
    ['iptables', 'iptables'],
    ['ipset', 'ipset'],
  ] as const) {
    try {
      execFileSync(program, ['--version'], { stdio: 'ignore' });
    } catch {
      throw new Error(`a test node that enforces NetworkPolicy needs ${program} (Debian package ${pkg})`);
    }
  }
}

/**
 * Starts kube-router's firewall inside `ns` (its log: `<dir>/kube-router/kube-router.log`) and
 * resolves once it answers its health check, i.e. has synced and written its rules.
 * @param o.admin a kubeconfig that may create the RBAC above.
 * @param o.controlPlaneDir where the control plane keeps its CA (for kube-router's user).
 * @throws Error when the build, the RBAC or the start fails (the process is stopped first).
 */
export async function startNetworkPolicies(
  ns: NodeNamespace,
  o: { dir: string; admin: KubeConfig; controlPlaneDir: string; log: (line: string) => void },
): Promise<ChildProcess> {
  const bin = await ensureTool('netpol', 'kube-router', o.log);
  for (const x of KUBE_ROUTER_RBAC) await serverSideApply(o.admin, x, 'captf-node');
  const kubeconfig = await userKubeConfig(o.controlPlaneDir, KUBE_ROUTER_USER, [], 'inside');
  const base = join(o.dir, 'kube-router');
  mkdirSync(base, { recursive: true });
  const log = openSync(join(base, 'kube-router.log'), 'a');
  const child = ns.spawn(
    bin,
    [
      `--kubeconfig=${kubeconfig}`,
      `--hostname-override=${NODE_NAME}`,
      '--run-firewall=true',
      '--run-router=false',
      '--run-service-proxy=false',
      `--service-cluster-ip-range=${NODE_NETWORK.serviceCidr}`,
      `--health-port=${HEALTH_PORT}`,
      '--metrics-port=0',
      '--v=1',
    ],
    { stdio: ['ignore', log, log] },
  );
  const local = await ns.forward({ host: '127.0.0.1', port: HEALTH_PORT });
  await eventually(
    `kube-router to be healthy (its log: ${join(base, 'kube-router.log')})`,
    async () => {
      if (child.exitCode !== null) throw new Error(`kube-router exited (${child.exitCode}); its log: ${base}`);
      const r = await fetch(`http://127.0.0.1:${local}/healthz`).catch((e: unknown) => {
        throw new Error(firstLine(e));
      });
      return r.status === 200;
    },
    HEALTHY_TIMEOUT_MS,
    500,
  ).catch((err: unknown) => {
    child.kill('SIGKILL');
    throw err;
  });
  return child;
}
