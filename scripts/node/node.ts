/**
 * A real one-node cluster on this machine, for the tests that run the product as pods: the
 * node's namespaces (./namespace.ts), a control plane inside them that binds the node's
 * address (scripts/controlplane, with the controllers and scheduler a node needs), containerd
 * with the product and pause images imported (./containerd.ts), the kubelet and the pod
 * network (./kubelet.ts), kube-proxy and CoreDNS (./services.ts), and on request a NetworkPolicy
 * firewall (./netpol.ts). The host reaches the API
 * server on 127.0.0.1 through the node's forward, so tests, kubectl and a shell never enter
 * the namespace; {@link TestNode.forward} reaches a pod the same way.
 *
 * {@link startNode} reads as its list of named steps (scripts/lib/steps.ts, as the world's
 * start), each leaving its undo; a failed start and the stop run them in reverse. The node's own stop (the holder's teardown) is what ends every process,
 * container and cgroup, also when this process dies.
 */
import { execFileSync, type ChildProcess } from 'node:child_process';
import { join, resolve } from 'node:path';
import { CoreV1Api, KubeConfig } from '@kubernetes/client-node';
import { startControlPlane, userKubeConfig, type ControlPlane } from '../controlplane/controlplane.ts';
import { buildImage, type BuiltImage } from '../image/build.ts';
import { stopProcess } from '../lib/process.ts';
import { Steps } from '../lib/steps.ts';
import { eventually, firstLine } from '../lib/wait.ts';
import { nodeBinaries } from './binaries.ts';
import { startContainerd, type Containerd } from './containerd.ts';
import { NODE_NAME, startKubelet } from './kubelet.ts';
import { checkNodeHost, startNodeNamespace, sweepNode, type NodeNamespace } from './namespace.ts';
import { checkNetworkPolicyHost, startNetworkPolicies } from './netpol.ts';
import { HEALTH_PORTS, startCoreDNS, startKubeProxy } from './services.ts';

/** Options of {@link startNode}. */
export interface NodeOptions {
  /** State folder: `controlplane/` and `node/` (each wiped on start). */
  dir: string;
  /** Progress lines (builds, steps). */
  log: (line: string) => void;
  /** Size at which the control plane's audit log rotates, in MB. */
  auditLogMaxSizeMB?: number;
  /** Enforce NetworkPolicy (kube-router's firewall, ./netpol.ts); off by default, as a plain bridge. */
  networkPolicies?: boolean;
}

/** A running test node. */
export interface TestNode {
  controlPlane: ControlPlane;
  namespace: NodeNamespace;
  containerd: Containerd;
  /** The product image as imported (pods name `image.ref`, `imagePullPolicy: Never`). */
  image: BuiltImage;
  /** A 127.0.0.1 port reaching `target` inside the node (a pod's IP and port). */
  forward(target: { host: string; port: number }): Promise<number>;
  /**
   * Fault injection: stops one of the node's agents (SIGTERM, then SIGKILL after 10 s) and
   * starts it again with the same configuration and state, as a service manager restarts it.
   * Running containers stay (their shims outlive containerd); resolves once containerd's
   * socket is back, or at once for the kubelet (its Node's readiness is the caller's to wait for).
   */
  restart(agent: NodeAgent): Promise<void>;
  /** Stops every process, container, mount and cgroup of the node and its control plane. */
  stop(): Promise<void>;
}

/** The node's agents {@link TestNode.restart} restarts. */
export type NodeAgent = 'kubelet' | 'containerd';

/** How long the node may take to become Ready once its kubelet starts, in ms (generous). */
const READY_TIMEOUT_MS = 120_000;

/**
 * Starts the node: builds what is missing, then the namespaces, the control plane, containerd
 * with the images, the kubelet, kube-proxy and CoreDNS; resolves once the Node is Ready and
 * untainted and kube-proxy and CoreDNS answer their health checks.
 * @throws Error naming the missing capability (root, a program, nftables, a bridge, a cgroup),
 *   the component that failed with where its log is, or a node already running from `dir`;
 *   whatever was started is stopped first.
 */
export async function startNode(opts: NodeOptions): Promise<TestNode> {
  const dir = resolve(opts.dir);
  const nodeDir = join(dir, 'node');
  // Before any build: a user without root or nft learns it now, not after minutes of compiling.
  checkNodeHost();
  checkNftables();
  if (opts.networkPolicies) checkNetworkPolicyHost();
  opts.log('[node] programs and images (built when missing; the images are staged again each time, about 10 s)');
  const [bin, image, pause] = [
    await nodeBinaries(opts.log),
    await buildImage('captf-credentials', { log: opts.log }),
    await buildImage('pause', { log: opts.log }),
  ];
  const steps = new Steps({ progress: opts.log, prefix: '[node] ' });
  const run = steps.run.bind(steps);
  const stop = () => steps.stop();
  return steps.attempt(async () => {
    const ns = await run('namespaces', () => startNodeNamespace({ dir: nodeDir, log: (l) => opts.log(`[node] ${l}`) }));
    steps.defer(async () => {
      await ns.stop();
      await sweepNode(nodeDir);
    });
    const controlPlane = await run('control plane', () =>
      startControlPlane({
        dir: join(dir, 'controlplane'),
        log: opts.log,
        node: { spawn: ns.spawn, forward: ns.forward, address: ns.address, scheduler: bin['kube-scheduler']! },
        ...(opts.auditLogMaxSizeMB !== undefined ? { auditLogMaxSizeMB: opts.auditLogMaxSizeMB } : {}),
      }),
    );
    // Stopped before the namespace's teardown, in order (scheduler, controller-manager, API
    // server, etcd): all at once, etcd would wait on the API server's connections until SIGKILL.
    steps.defer(() => controlPlane.stop());
    const runtime = () => startContainerd(ns, { dir: nodeDir, bin, sandboxImage: pause.ref });
    const containerd = await run('containerd, images', async () => {
      const c = await runtime();
      for (const i of [pause, image]) await c.ctr(['images', 'import', i.path]);
      return c;
    });
    const agents = await run('kubelet, kube-proxy, CoreDNS', () =>
      startNodeAgents(ns, { dir: nodeDir, bin, controlPlane, containerd }),
    );
    // First at stop: while their watches are open the API server takes its full grace to exit.
    steps.defer(async () => {
      for (const agent of agents.processes) await stopProcess(agent);
    });
    await run('Ready', () => nodeReady(ns, { kubeconfigPath: controlPlane.kubeconfigPath, dir: nodeDir }));
    if (opts.networkPolicies) {
      const firewall = await run('NetworkPolicy (kube-router)', () =>
        startNetworkPolicies(ns, {
          dir: nodeDir,
          admin: adminOf(controlPlane),
          controlPlaneDir: controlPlane.dir,
          log: opts.log,
        }),
      );
      steps.defer(() => stopProcess(firewall));
    }
    opts.log(`[node] ${NODE_NAME} is Ready at ${ns.address}; API server ${controlPlane.server}`);
    const restart = restarter(agents, runtime, containerd);
    return { controlPlane, namespace: ns, containerd, image, forward: ns.forward, restart, stop };
  });
}

/**
 * {@link TestNode.restart}: the kubelet (the first of `agents`' processes) or containerd,
 * stopped and started again in place, so the node's stop ends the new process.
 */
function restarter(
  agents: { processes: ChildProcess[]; startKubelet: () => ChildProcess },
  startAgain: () => Promise<Containerd>,
  containerd: Containerd,
): (agent: NodeAgent) => Promise<void> {
  return async (agent) => {
    if (agent === 'kubelet') {
      await stopProcess(agents.processes[0]!);
      agents.processes[0] = agents.startKubelet();
      return;
    }
    await stopProcess(containerd.process);
    containerd.process = (await startAgain()).process;
  };
}

/** The control plane's admin, as the host reaches it. */
function adminOf(controlPlane: ControlPlane): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromFile(controlPlane.kubeconfigPath);
  return kc;
}

/** @throws Error when `nft` (kube-proxy's nftables mode runs it) is missing. */
function checkNftables(): void {
  try {
    execFileSync('nft', ['--version'], { stdio: 'ignore' });
  } catch {
    throw new Error("the test node needs nft for kube-proxy's nftables mode (Debian package nftables)");
  }
}

/**
 * The kubelet, kube-proxy and CoreDNS, each as its own user (the roles a cluster gives them);
 * returns their processes (the kubelet's first) and how to start the kubelet again.
 */
async function startNodeAgents(
  ns: NodeNamespace,
  o: { dir: string; bin: Record<string, string>; controlPlane: ControlPlane; containerd: Containerd },
): Promise<{ processes: ChildProcess[]; startKubelet: () => ChildProcess }> {
  const cpDir = o.controlPlane.dir;
  // The Node authorizer and NodeRestriction know a kubelet by this name and group.
  const kubeletUser = await userKubeConfig(cpDir, `system:node:${NODE_NAME}`, ['system:nodes'], 'inside');
  // Bound to system:node-proxier by the API server's bootstrap policy.
  const proxyUser = await userKubeConfig(cpDir, 'system:kube-proxy', [], 'inside');
  const kubelet = () =>
    startKubelet(ns, {
      dir: o.dir,
      bin: o.bin.kubelet!,
      kubeconfig: kubeletUser,
      runtime: o.containerd.socket,
      clientCA: join(cpDir, 'pki', 'client-ca.crt'),
      cniConfDir: o.containerd.cniConfDir,
    });
  const proxy = startKubeProxy(ns, { dir: o.dir, bin: o.bin['kube-proxy']!, kubeconfig: proxyUser });
  const dns = startCoreDNS(ns, {
    dir: o.dir,
    bin: o.bin.coredns!,
    kubeconfig: o.controlPlane.insideKubeconfigPath,
    context: 'admin@captf-local',
  });
  return { processes: [kubelet(), proxy, dns], startKubelet: kubelet };
}

/** Waits for the Node to be Ready without taints, and kube-proxy and CoreDNS to be healthy. */
async function nodeReady(ns: NodeNamespace, o: { kubeconfigPath: string; dir: string }): Promise<void> {
  const kc = new KubeConfig();
  kc.loadFromFile(o.kubeconfigPath);
  const core = kc.makeApiClient(CoreV1Api);
  await eventually(
    `Node ${NODE_NAME} to be Ready and untainted (the kubelet's log: ${join(o.dir, 'kubelet', 'kubelet.log')})`,
    async () => {
      const node = await core.readNode({ name: NODE_NAME });
      const ready = node.status?.conditions?.find((c) => c.type === 'Ready')?.status === 'True';
      return ready && !node.spec?.taints?.length;
    },
    READY_TIMEOUT_MS,
    500,
  );
  for (const [what, port, path] of [
    ['kube-proxy', HEALTH_PORTS.kubeProxy, '/healthz'],
    ['CoreDNS', HEALTH_PORTS.dnsReady, '/ready'],
  ] as const) {
    const local = await ns.forward({ host: '127.0.0.1', port });
    await eventually(`${what} to be healthy`, async () => {
      const r = await fetch(`http://127.0.0.1:${local}${path}`).catch((e: unknown) => {
        throw new Error(firstLine(e));
      });
      return r.status === 200;
    });
  }
}
