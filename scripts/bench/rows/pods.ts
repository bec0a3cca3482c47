/**
 * Rows on a real node (scripts/node/node.ts, a system of its own beside the bench's):
 * - "cold start": each function as a pod from the image (its rendered Knative Service's pod
 *   spec, scripts/node/pods.ts): create → Ready → first real answer (the same requests as the
 *   process cold-start row, sent through the node's forward to the pod's address). Baseline: a
 *   bare Node HTTP server pod from the same image with the same readiness probe.
 * - "memory": each function's container (its memory cgroup's peak, what the kubelet's limit
 *   holds) after its first answer, beside the manifest's limit.
 * - "node footprint": the RSS of the node's own programs (kubelet, containerd and its shims,
 *   kube-proxy, CoreDNS), beside the control plane's (etcd, kube-apiserver, controller-manager,
 *   scheduler) on the same node.
 * Without root the row fails saying so (the node needs namespaces and cgroups).
 */
import { readFileSync, rmSync } from 'node:fs';
import { basename, join } from 'node:path';
import { CoreV1Api, type KubeConfig, type KubernetesObject, type V1Pod } from '@kubernetes/client-node';
import { containerCgroup } from '../../node/cgroups.ts';
import { markedProcesses } from '../../node/namespace.ts';
import type { TestNode } from '../../node/node.ts';
import { applyFunctionRbac, functionPod, runPod } from '../../node/pods.ts';
import { shippedSender, type EventFunction } from '../../system/senders.ts';
import { loadKubeConfig } from '../../../functions/lib/kube.ts';
import { eventually } from '../../lib/wait.ts';
import { FUNCTION_NAMES, startSystem, type FunctionName } from '../../system/system.ts';
import { KNATIVE_LAYOUT, render } from '../../tools/kustomize.ts';
import { REPO_ROOT } from '../../tools/build.ts';
import { BenchClient } from '../client.ts';
import {
  consumerBody,
  consumerEvent,
  consumersPath,
  createIdentity,
  createNamespaces,
  hasTrue,
  pingEvent,
  postEvent,
  signedWith,
  putSourceSecret,
  type Consumer,
  type EventRequest,
} from '../fixtures.ts';
import { memoryLimits, rssBytes } from '../measure.ts';
import type { Figure } from '../report.ts';
import { COLD_START_REVIEW } from './cold-start.ts';

/** The bare server the baseline pod runs (the image's Node, nothing of the product). */
const BARE_SERVER = "require('node:http').createServer((q, s) => s.end('ok')).listen(8080)";

/** The identity of the pods row's consumer. */
const POD_IDENTITY = 'bench-pods';

/** What a pod row needs from the bench. */
export interface PodRowOptions {
  /** Pods started per function (and of the bare server). */
  runs: number;
  log: (line: string) => void;
}

/**
 * Starts a node, measures, stops it.
 * @throws Error when the node cannot start (e.g. without root) or a pod's first answer is not 2xx.
 */
export async function podRows(o: PodRowOptions): Promise<Figure[]> {
  const dir = join(REPO_ROOT, '.local', `bench-node-${process.pid}`);
  const system = await startSystem({ dir, progress: (l) => o.log(l), node: true });
  try {
    const rendered = (await render(KNATIVE_LAYOUT)) as KubernetesObject[];
    await applyFunctionRbac(system.kc, rendered);
    const node = system.node!;
    // The pods check their senders as shipped: each event is signed as Knative would sign it.
    const signed = {
      'mirror-sync': await shippedSender(system.kc, rendered, 'mirror-sync'),
      'identity-status': await shippedSender(system.kc, rendered, 'identity-status'),
      'dead-letters': await shippedSender(system.kc, rendered, 'dead-letters'),
    };
    const answers = (ns: string) => firstAnswers(ns, signed);
    const ns = await mirroredConsumer(node, rendered, answers);
    const first = answers(ns);
    const bare: number[] = [];
    for (let i = 0; i < o.runs; i++)
      bare.push(
        (await coldPod(node, barePod(rendered, node.image.ref, i), async (url) => (await fetch(url)).status)).ms,
      );
    const figures: Figure[] = [];
    const limits = memoryLimits(rendered);
    for (const fn of FUNCTION_NAMES) {
      const runs: { ms: number; peak: number }[] = [];
      for (let i = 0; i < o.runs; i++) {
        const pod = functionPod(rendered, fn, { image: node.image.ref });
        pod.metadata!.name = `${pod.metadata!.name}-${i}`;
        runs.push(await coldPod(node, pod, first[fn]));
      }
      figures.push(...fnFigures(fn, runs, { bare, limit: limits[fn] }));
    }
    figures.push(await footprintWithFunctions(system.kc, node, rendered, join(dir, 'node')));
    return figures;
  } finally {
    await system.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** One function's cold-start and memory figures. */
function fnFigures(
  fn: FunctionName,
  runs: readonly { ms: number; peak: number }[],
  o: { bare: number[]; limit: number },
): Figure[] {
  return [
    {
      row: 'cold start',
      what: `${fn}: pod from the image, create → Ready → first answer`,
      unit: 'ms',
      samples: runs.map((r) => r.ms),
      baseline: { what: 'bare Node HTTP server pod, same image', samples: o.bare },
    },
    {
      row: 'memory',
      what: `${fn} container peak (cgroup) after its first answer`,
      unit: 'bytes',
      samples: runs.map((r) => r.peak),
      baseline: { what: 'manifest memory limit', samples: [o.limit] },
    },
  ];
}

/**
 * A pod's cold start: create → Ready → `first` answered 2xx, then its container's peak memory;
 * the pod is deleted (at once) before the next sample.
 */
async function coldPod(
  node: TestNode,
  pod: V1Pod,
  first: (url: string) => Promise<number>,
): Promise<{ ms: number; peak: number }> {
  const kc = loadKubeConfig(node.controlPlane.kubeconfigPath);
  const t0 = performance.now();
  const ready = await runPod(kc, pod, { intervalMs: 50 });
  const url = `http://127.0.0.1:${await node.forward({ host: ready.status!.podIP!, port: 8080 })}`;
  const status = await first(url);
  const ms = performance.now() - t0;
  if (status < 200 || status > 299) throw new Error(`${pod.metadata!.name}'s first request answered ${status}`);
  const id = ready.status!.containerStatuses![0]!.containerID!.replace(/^containerd:\/\//, '');
  const memory = containerCgroup(node.namespace.cgroupRoot, 'memory', id);
  const peak = Number(readFileSync(join(memory, 'memory.max_usage_in_bytes'), 'utf8'));
  const core = kc.makeApiClient(CoreV1Api);
  const at = { namespace: pod.metadata!.namespace!, name: pod.metadata!.name! };
  await core.deleteNamespacedPod({ ...at, gracePeriodSeconds: 0 });
  await eventually(`${at.name} to be gone`, async () => !(await core.readNamespacedPod(at).catch(() => undefined)));
  return { ms, peak };
}

/** The bare server's pod: the image's Node, the functions' security context and readiness probe. */
function barePod(rendered: readonly KubernetesObject[], image: string, i: number): V1Pod {
  const pod = functionPod(rendered, 'identity-status', { image });
  const c = pod.spec!.containers[0]!;
  pod.metadata = { name: `bare-node-${i}`, namespace: pod.metadata!.namespace! };
  pod.spec!.serviceAccountName = 'default';
  pod.spec!.containers = [{ ...c, name: 'bare', command: ['node', '-e', BARE_SERVER], args: [], env: [] }];
  return pod;
}

/**
 * A namespace with consumer `m-0` of an identity whose source exists, mirrored once by an
 * unmeasured mirror-sync pod, so every measured first event is the same reconcile.
 * @returns the namespace.
 */
async function mirroredConsumer(
  node: TestNode,
  rendered: readonly KubernetesObject[],
  first: (ns: string) => Record<FunctionName, (url: string) => Promise<number>>,
): Promise<string> {
  const admin = new BenchClient(node.controlPlane.kubeconfigPath, 1);
  try {
    const ns = 'bench-pods';
    await createNamespaces(admin, [ns]);
    await putSourceSecret(admin, 'bench-pods-creds', { token: 'bench' });
    await createIdentity(admin, { name: POD_IDENTITY, secret: 'bench-pods-creds', allowedNamespaces: { list: [ns] } });
    await admin.call(
      'POST',
      consumersPath('terraformmachines', ns),
      consumerBody('terraformmachines', 'm-0', POD_IDENTITY),
    );
    const warm = functionPod(rendered, 'mirror-sync', { image: node.image.ref });
    warm.metadata!.name = `${warm.metadata!.name}-warm`;
    await coldPod(node, warm, first(ns)['mirror-sync']);
    const mirrored = await admin.call<Consumer>('GET', `${consumersPath('terraformmachines', ns)}/m-0`);
    if (!hasTrue(mirrored, 'CredentialsMirrored')) throw new Error("the pods row's consumer was not mirrored");
    return ns;
  } finally {
    admin.close();
  }
}

/** The node's footprint while the functions' pods run (so their shims count), then the pods go. */
async function footprintWithFunctions(
  kc: KubeConfig,
  node: TestNode,
  rendered: readonly KubernetesObject[],
  nodeDir: string,
): Promise<Figure> {
  const pods = await Promise.all(
    FUNCTION_NAMES.map((fn) => runPod(kc, functionPod(rendered, fn, { image: node.image.ref }))),
  );
  const figure = footprint(nodeDir);
  const core = kc.makeApiClient(CoreV1Api);
  for (const p of pods)
    await core.deleteNamespacedPod({
      namespace: p.metadata!.namespace!,
      name: p.metadata!.name!,
      gracePeriodSeconds: 0,
    });
  return figure;
}

/** The RSS of the node's own programs, beside its control plane's. */
function footprint(nodeDir: string): Figure {
  const groups = { node: 0, controlPlane: 0 };
  for (const pid of markedProcesses(nodeDir)) {
    const program = programOf(pid);
    if (NODE_PROGRAMS.includes(program)) groups.node += rssBytes(pid);
    else if (CONTROL_PLANE_PROGRAMS.includes(program)) groups.controlPlane += rssBytes(pid);
  }
  return {
    row: 'node footprint',
    what: "kubelet, containerd and 3 pods' shims, kube-proxy, CoreDNS: RSS",
    unit: 'bytes',
    samples: [groups.node],
    baseline: {
      what: 'its control plane: etcd, kube-apiserver, controller-manager, scheduler',
      samples: [groups.controlPlane],
    },
  };
}

/** The program a process runs (the base name of its first argument), or '' when it is gone. */
function programOf(pid: number): string {
  try {
    return basename(readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0]!);
  } catch {
    return '';
  }
}

/** The node's own programs, by executable name. */
const NODE_PROGRAMS = ['kubelet', 'containerd', 'containerd-shim-runc-v2', 'kube-proxy', 'coredns'];
/** The control plane's programs on the node. */
const CONTROL_PLANE_PROGRAMS = ['etcd', 'kube-apiserver', 'kube-controller-manager', 'kube-scheduler'];

/**
 * Each function's first real request, as the process cold-start row sends it; events carry
 * `signed`'s `Authorization` (so the first request includes the sender's TokenReview).
 */
function firstAnswers(
  ns: string,
  signed: Record<EventFunction, string>,
): Record<FunctionName, (url: string) => Promise<number>> {
  const as = (fn: keyof typeof signed, ev: EventRequest): EventRequest => signedWith(signed[fn], ev);
  return {
    admission: async (url) =>
      (
        await fetch(`${url}/validate`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: COLD_START_REVIEW,
        })
      ).status,
    'mirror-sync': async (url) =>
      (await postEvent(`${url}/`, as('mirror-sync', consumerEvent('terraformmachines', ns, 'm-0')))).status,
    'identity-status': async (url) =>
      (await postEvent(`${url}/`, as('identity-status', pingEvent('captf-identity-status')))).status,
    'dead-letters': async (url) => (await postEvent(`${url}/`, as('dead-letters', pingEvent('captf-resync')))).status,
  };
}
