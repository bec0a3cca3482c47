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
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { afterEach } from 'node:test';
import { BatchV1Api, CoreV1Api, CustomObjectsApi, type V1Pod, type V1Secret } from '@kubernetes/client-node';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { startSystem, type RunningSystem, type SystemOptions } from '../../scripts/system/system.ts';
import { jobWithCredentials } from '../../functions/lib/delivery.ts';
import { tryLock } from '../../scripts/lib/lock.ts';
import { sleep } from '../../scripts/lib/wait.ts';
import { eventually } from './cluster.ts';
import * as fx from './fixtures.ts';
import { scanLater } from './leaks.ts';
import { operatorSource } from './mirror-sync.ts';
import type { Condition, Consumer } from '../../functions/lib/api.ts';
import { CGROUP_FS, cgroupHierarchies, cgroupRootOf } from '../../scripts/node/cgroups.ts';
import { KUBELET_KERNEL_SETTINGS } from '../../scripts/node/config.ts';
import { holderOf, markedProcesses } from '../../scripts/node/namespace.ts';
import { loadKubeConfig } from '../../functions/lib/kube.ts';
import { UNSIGNED_EVENTS } from './events.ts';

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
 * nodes other than the one from `dir` (files running beside this one start their own, and a
 * folder removed while it is walked is simply not there).
 */
export function cgroupFolders(dir: string): string[] {
  const own = cgroupRootOf(dir);
  const walk = (top: string, path: string): string[] => {
    let entries;
    try {
      entries = readdirSync(join(top, path), { withFileTypes: true });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
      throw err;
    }
    return entries
      .filter((d) => d.isDirectory())
      .map((d) => (path ? `${path}/${d.name}` : d.name))
      .filter((p) => !p.startsWith('captf-node-') || p.startsWith(own))
      .flatMap((p) => [p, ...walk(top, p)]);
  };
  return cgroupHierarchies().flatMap((h) => walk(`${CGROUP_FS}/${h}`, '').map((p) => `${h}/${p}`));
}

/**
 * The cgroup folders of `after` that `before` did not have and that a node could have left:
 * not those inside a group the host already had at the top of a hierarchy (other than a node's
 * own `captf-node-*`), where the machine's own agents come and go while a test runs.
 */
export function cgroupsLeft(before: readonly string[], after: readonly string[]): string[] {
  const had = new Set(before);
  const hostGroup = (c: string) => {
    const [hierarchy, top, ...rest] = c.split('/');
    return rest.length > 0 && !top!.startsWith('captf-node-') && had.has(`${hierarchy}/${top}`);
  };
  return after.filter((c) => !had.has(c) && !hostGroup(c));
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
 * Runs one pod from the product image (`image`, imported on the node) on the node whose
 * control plane `kubeconfigPath` names, and waits until it runs: a container, a shim and pod
 * cgroups for a teardown check to find.
 */
export async function runProductPod(kubeconfigPath: string, image: string, name: string): Promise<void> {
  const core = loadKubeConfig(kubeconfigPath).makeApiClient(CoreV1Api);
  await core.createNamespacedPod({
    namespace: 'default',
    body: {
      metadata: { name },
      spec: {
        securityContext: { runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532 },
        containers: [
          {
            name: 'mirror-sync',
            image,
            imagePullPolicy: 'Never',
            args: ['mirror-sync'],
            // No event comes: without this it would not start (the sender check needs its Triggers).
            env: Object.entries(UNSIGNED_EVENTS).map(([name, value]) => ({ name, value })),
          },
        ],
      },
    },
  });
  await eventually(
    'the pod to run',
    async () => (await core.readNamespacedPod({ namespace: 'default', name })).status?.phase === 'Running',
    180_000,
    500,
  );
}

/**
 * Asserts the node from `nodeDir` runs its programs and a pod's container, and that its pod
 * cgroups exist: what a "nothing is left" check must see before, so that it could see it after.
 * @returns its holder's PID (for {@link assertNodeGone}).
 */
export function assertNodeRunsAPod(nodeDir: string): number {
  const programs = nodeProcesses(nodeDir).map((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    } catch {
      return [];
    }
  });
  for (const program of ['kubelet', 'containerd', 'containerd-shim-runc-v2', 'kube-proxy', 'coredns'])
    assert.ok(
      programs.some((argv) => argv[0]?.endsWith(`/${program}`)),
      `${program} runs`,
    );
  assert.ok(
    programs.some((argv) => argv.includes('/app/dist/main.mjs')),
    "the pod's container (a namespace of its own) is among the node's processes",
  );
  assert.ok(
    cgroupFolders(nodeDir).some((c) => c.startsWith(`memory/${cgroupRootOf(nodeDir)}/kubepods/`)),
    "the pod's cgroups are among the folders compared",
  );
  const holder = holderOf(nodeDir);
  assert.ok(holder, 'the node has a live holder');
  return holder;
}

/**
 * Waits until the node's holder (`holder`, its PID) has exited, then until nothing of the node
 * from `nodeDir` is left, and compares the host with `before` ({@link hostState}; cgroups by
 * {@link cgroupsLeft}: none added that a node could have made). The second wait is short: what
 * the holder's teardown left would otherwise be swept by the next node start of a file running
 * beside this one, and a broken teardown would pass.
 */
export async function assertNodeGone(
  nodeDir: string,
  before: ReturnType<typeof hostState>,
  holder: number,
): Promise<void> {
  await eventually(
    'the holder to have torn the node down and exited',
    async () => !existsSync(`/proc/${holder}`),
    120_000,
    250,
  );
  await eventually(
    'nothing of the node to be left once its holder has exited',
    async () =>
      nodeProcesses(nodeDir).length === 0 && !cgroupFolders(nodeDir).some((c) => c.includes(cgroupRootOf(nodeDir))),
    5_000,
    100,
  );
  const after = hostState(nodeDir);
  assert.deepEqual({ ...after, cgroups: cgroupsLeft(before.cgroups, after.cgroups) }, { ...before, cgroups: [] });
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

/** A test file's system with a node, and its world on that node's control plane. */
export interface NodeWorld {
  system: RunningSystem;
  w: fx.World;
  /** The system's state folder (the node's logs are under it). */
  work: string;
  /** The system's progress lines so far. */
  progress: string[];
  /**
   * `wait`, or its failure with a short {@link nodeReport} in the message: a failed test's
   * message is what CI's summary at the end of the output keeps.
   */
  explained<T>(wait: Promise<T>): Promise<T>;
  /**
   * Waits (explained) up to `timeoutMs` for identity `id`'s mirror in `namespace` to carry an
   * owner reference to `consumer`, as the events' path on the node makes it; the mirror.
   */
  mirrorOwnedBy(namespace: string, id: string, consumer: Consumer, timeoutMs: number): Promise<V1Secret>;
}

/**
 * Starts `options`' system with a node in a fresh temporary folder (`captf-<prefix>-…`), points
 * the file's world at the node's control plane (`CAPTF_TEST_CONTROLPLANE`), scans the node's
 * logs for planted values after the file, and stops the system (checking it left nothing) as
 * the world's first cleanup, so its last, after the leak scan.
 */
export async function nodeWorld(prefix: string, options: Omit<SystemOptions, 'dir' | 'progress'>): Promise<NodeWorld> {
  const release = options.serving ? await oneServingNodeAtATime() : () => {};
  const work = mkdtempSync(join(tmpdir(), `captf-${prefix}-`));
  const progress: string[] = [];
  const system = await startSystem({ ...options, dir: work, progress: (l) => progress.push(l) }).catch((err) => {
    release();
    throw err;
  });
  process.env.CAPTF_TEST_CONTROLPLANE = system.controlPlane!.dir;
  const w = options.events === 'knative' ? watchedNamespaces(fx.world(prefix), system, work) : fx.world(prefix);
  w.onCleanup(() => stopNodeSystem(system, work, progress).finally(release));
  scanNodeLogs(work);
  // The folder goes with the file: a failed test prints what the node looked like (CI keeps only output).
  afterEach(async (t) => {
    // `passed` is on Node 24's TestContext; @types/node does not list it yet.
    if ((t as { passed?: boolean }).passed !== false) return;
    const report = await nodeReport(system, work).catch((err: unknown) => `no report: ${String(err)}`);
    console.error(`--- the node after "${t.name}" failed\n${report}\n--- end of the node's report`);
  });
  const explained = <T>(wait: Promise<T>): Promise<T> =>
    wait.catch(async (err: unknown) => {
      const report = await nodeReport(system, work, BRIEF).catch((e: unknown) => `no report: ${String(e)}`);
      if (err instanceof Error) {
        // The runner prints the stack, which holds the message as it was when made.
        const said = err.message;
        err.message = `${said}\n--- the node now\n${report}`;
        if (err.stack) err.stack = err.stack.replace(said, err.message);
      }
      throw err;
    });
  const core = system.kc.makeApiClient(CoreV1Api);
  const mirrorOwnedBy = (namespace: string, id: string, consumer: Consumer, timeoutMs: number) =>
    explained(
      eventually(
        `mirror ${namespace}/${mirrorName(id)} owned by the consumer`,
        async () => {
          const s = await core.readNamespacedSecret({ namespace, name: mirrorName(id) }).catch(() => undefined);
          return s?.metadata?.ownerReferences?.some((o) => o.uid === consumer.metadata.uid) && s;
        },
        timeoutMs,
        500,
      ),
    );
  return { system, w, work, progress, explained, mirrorOwnedBy };
}

/**
 * `w` whose new namespaces are watched before they are used. Knative's ApiServerSource lists
 * the namespaces its selector matches in its adapter's configuration (knative/eventing
 * `pkg/reconciler/apiserversource`, v0.49.2, even for the empty selector that means all), so
 * each new namespace rolls the adapter's Deployment out again, and an object created before
 * the new adapter's first list sends no event (the next resync finds it). A test that creates
 * a namespace and then objects in it waits for that rollout first, as it waits for anything
 * else it starts from. Until an ApiServerSource exists there is nothing to wait for.
 */
function watchedNamespaces(w: fx.World, system: RunningSystem, work: string): fx.World {
  return {
    ...w,
    namespace: async (...mods) => {
      const ns = await w.namespace(...mods);
      await adapterWatches(system, work, ns);
      return ns;
    },
  };
}

/** The adapter's log line once its configuration is read; its watches start right after (scripts/system/broker.ts). */
const ADAPTER_STARTED = /Starting in (resilient|fail-fast) mode/;

/**
 * Waits until every ApiServerSource's adapter runs as one pod whose configuration names
 * `namespace`, has logged its start, and had a second for its first list and watch.
 */
async function adapterWatches(system: RunningSystem, work: string, namespace: string): Promise<void> {
  const custom = system.kc.makeApiClient(CustomObjectsApi);
  const core = system.kc.makeApiClient(CoreV1Api);
  const sources = (
    (await custom.listClusterCustomObject({
      group: 'sources.knative.dev',
      version: 'v1',
      plural: 'apiserversources',
    })) as {
      items: { metadata: { name: string; namespace: string } }[];
    }
  ).items;
  for (const src of sources)
    await eventually(
      `ApiServerSource ${src.metadata.name}'s adapter to watch namespace ${namespace}`,
      async () => {
        const pods = (
          await core.listNamespacedPod({
            namespace: src.metadata.namespace,
            // The labels Knative's ApiServerSource reconciler puts on its adapter (resources/labels.go).
            labelSelector: `eventing.knative.dev/sourceName=${src.metadata.name}`,
          })
        ).items;
        const [pod] = pods;
        const config = pod?.spec?.containers[0]?.env?.find((e) => e.name === 'K_SOURCE_CONFIG')?.value ?? '';
        return (
          pods.length === 1 &&
          !pod!.metadata?.deletionTimestamp &&
          config.includes(JSON.stringify(namespace)) &&
          ADAPTER_STARTED.test(podLog(work, pod!))
        );
      },
      180_000,
      250,
    );
  if (sources.length) await sleep(1000);
}

/** What {@link NodeWorld.explained} shows of each pod's log: its last warnings and errors. */
const BRIEF = { logLines: 4, only: /error|fail|warn|refused|timeout|killed|5\d\d\b/i };

/** The Knative kinds whose Ready condition {@link nodeReport} shows, as `group/version/plural`. */
const KNATIVE_KINDS = [
  'serving.knative.dev/v1/services',
  'eventing.knative.dev/v1/brokers',
  'eventing.knative.dev/v1/triggers',
  'sources.knative.dev/v1/apiserversources',
  'sources.knative.dev/v1/pingsources',
];

/** Namespaces whose pods' last log lines {@link nodeReport} shows. */
const REPORTED_LOGS = ['captf-system', 'knative-eventing', 'knative-serving'];
/** How many of a pod's last log lines are shown. */
const LOG_LINES = 15;

/** How many of a stuck pod's Warning Events, and of the kubelet's lines about it, {@link nodeReport} shows (the last ones). */
const WARNINGS_PER_POD = 4;
/** How far back {@link nodeReport}'s `only` looks in a pod's log, in lines. */
const SEARCHED_LINES = 2000;

/**
 * What a node system looks like now, for a failed test's output: every pod (phase, readiness,
 * restarts, why a container waits or ended), each Knative object that is not Ready with its
 * reason, and the last lines of the product's and Eventing's pods (`opts.logLines` of them,
 * default 15; with `opts.only`, of those that match, pods with none left out). Logs are this node's own
 * (the file's leak scan reads the same output).
 */
export async function nodeReport(
  system: RunningSystem,
  work: string,
  opts: { logLines?: number; only?: RegExp } = {},
): Promise<string> {
  const core = system.kc.makeApiClient(CoreV1Api);
  const custom = system.kc.makeApiClient(CustomObjectsApi);
  const out: string[] = [];
  const pods = (await core.listPodForAllNamespaces()).items;
  if (pods.length === 0) out.push('no pods');
  out.push(...pods.map(podLine));
  out.push(...(await stuckPodWarnings(core, pods, work)));
  for (const kind of KNATIVE_KINDS) {
    const [group, version, plural] = kind.split('/') as [string, string, string];
    const items = (
      (await custom.listClusterCustomObject({ group, version, plural }).catch(() => ({ items: [] }))) as {
        items: { metadata: { namespace: string; name: string }; status?: { conditions?: Condition[] } }[];
      }
    ).items;
    for (const o of items) {
      const ready = o.status?.conditions?.find((c) => c.type === 'Ready');
      if (ready?.status !== 'True')
        out.push(
          `${plural} ${o.metadata.namespace}/${o.metadata.name} not Ready: ${ready?.reason ?? '-'} ${ready?.message ?? ''}`,
        );
    }
  }
  for (const p of pods.filter((p) => REPORTED_LOGS.includes(p.metadata!.namespace!)))
    out.push(...logExcerpt(work, p, opts));
  return out.join('\n');
}

/**
 * Why pods not all ready (or terminating) are stuck: their last Warning Events (the kubelet's
 * FailedMount, FailedCreatePodSandBox, BackOff…) and the kubelet's last error and warning lines
 * naming them, a few of each per pod.
 */
async function stuckPodWarnings(core: CoreV1Api, pods: V1Pod[], work: string): Promise<string[]> {
  const stuck = pods.filter(
    (p) => p.metadata?.deletionTimestamp || !(p.status?.containerStatuses ?? [{ ready: false }]).every((c) => c.ready),
  );
  const kubelet = stuck.length ? readTree(join(work, 'node/kubelet/kubelet.log')).split('\n') : [];
  const out: string[] = [];
  for (const p of stuck) {
    const { namespace, name } = p.metadata as { namespace: string; name: string };
    const events = (
      await core
        .listNamespacedEvent({ namespace, fieldSelector: `involvedObject.name=${name},type=Warning` })
        .catch(() => ({ items: [] }))
    ).items;
    for (const e of events.slice(-WARNINGS_PER_POD))
      out.push(`  warning ${name}: ${e.reason} ×${e.count ?? 1}: ${(e.message ?? '').slice(0, 300)}`);
    const said = kubelet.filter((l) => /^[EW]\d{4} /.test(l) && l.includes(`${namespace}/${name}`));
    for (const l of said.slice(-WARNINGS_PER_POD)) out.push(`  kubelet ${name}: ${l.slice(0, 400)}`);
  }
  return out;
}

/** One pod as {@link nodeReport} shows it: phase, readiness, restarts, why a container waits or ended. */
function podLine(p: V1Pod): string {
  const statuses = p.status?.containerStatuses ?? [];
  const why = statuses
    .map((c) => c.state?.waiting?.reason ?? c.state?.terminated?.reason)
    .filter(Boolean)
    .join(',');
  const ready = statuses.filter((c) => c.ready).length;
  const restarts = statuses.reduce((n, c) => n + c.restartCount, 0);
  return `pod ${p.metadata!.namespace}/${p.metadata!.name} ${p.status?.phase} ${ready}/${statuses.length} ready, ${restarts} restarts${why ? ` (${why})` : ''}${p.metadata?.deletionTimestamp ? ' terminating' : ''}`;
}

/** A pod's last log lines (of those matching `opts.only`, if given: none at all when none match). */
function logExcerpt(work: string, p: V1Pod, opts: { logLines?: number; only?: RegExp }): string[] {
  const all = podLog(work, p).trimEnd().split('\n');
  const picked = opts.only ? all.slice(-SEARCHED_LINES).filter((l) => opts.only!.test(l)) : all;
  const lines = picked.slice(-(opts.logLines ?? LOG_LINES));
  if (lines.length === 0 && opts.only) return [];
  const of = opts.only
    ? ` (${picked.length} lines like ${opts.only.source.slice(0, 12)}…, the last ${lines.length})`
    : '';
  return [`log of ${p.metadata!.namespace}/${p.metadata!.name}${of}:`, ...lines.map((l) => `  ${l.slice(0, 400)}`)];
}

/**
 * Waits until no other file of this test run (the run's folder, `CAPTF_TEST_CONTROLPLANE`)
 * holds a Serving node, then holds the run's one slot: two Serving nodes with Eventing at once
 * on two cores slowed both past their waits (a full run's install and serving files met so). A
 * slot whose holder is gone is taken over. Outside a test run there is nothing to share.
 * @returns the slot's release (idempotent).
 */
async function oneServingNodeAtATime(): Promise<() => void> {
  const dir = process.env.CAPTF_TEST_CONTROLPLANE;
  if (!dir) return () => {};
  let said = false;
  for (;;) {
    const lock = tryLock(join(dir, 'serving-node.lock'));
    if ('release' in lock) return lock.release;
    if (!lock.holder) continue;
    if (!said) console.error(`waiting for the Serving node of PID ${lock.holder}: one Serving node per test run`);
    said = true;
    await sleep(2000);
  }
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
 * cgroup or process of the node (a container, a shim) and failed at nothing (`progress` holds the system's progress lines); the
 * folder goes in any case.
 */
export async function stopNodeSystem(system: { stop(): Promise<void> }, work: string, progress: readonly string[]) {
  try {
    await system.stop();
    const nodeDir = join(work, 'node');
    const root = cgroupRootOf(nodeDir);
    const left = cgroupFolders(nodeDir).filter((f) => f.split('/')[1] === root);
    const failed = progress.filter((l) => l.startsWith('while stopping'));
    const processes = nodeProcesses(nodeDir);
    assert.deepEqual(
      { left, failed, processes },
      { left: [], failed: [], processes: [] },
      'the stop removed every cgroup and process of the node and failed at nothing',
    );
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

/**
 * A stand-in `terraform` for the Job (a ConfigMap script run by the image's node): prints one
 * JSON line with its uid and groups, the names of its environment variables, and the mode, group
 * and readability of each file of the credentials mount.
 */
const TERRAFORM_STAND_IN = `#!/usr/local/bin/node
const fs = require('node:fs');
const dir = '/var/run/captf/credentials';
const files = Object.fromEntries(fs.readdirSync(dir).filter((f) => !f.startsWith('..')).map((f) => {
  const st = fs.statSync(dir + '/' + f);
  let readable = true;
  try { fs.readFileSync(dir + '/' + f); } catch { readable = false; }
  return [f, { mode: (st.mode & 0o777).toString(8), gid: st.gid, readable }];
}));
console.log(JSON.stringify({ uid: process.getuid(), groups: process.getgroups(), env: Object.keys(process.env).sort(), files }));
`;

/**
 * Source Secret data for {@link assertTerraformSaw}: cloud keys, two keys the runner strips
 * from the environment, and one of its three exceptions.
 */
export const TERRAFORM_KEYS = {
  AWS_ACCESS_KEY_ID: 'AKIA-job',
  AWS_SECRET_ACCESS_KEY: 'secret-job',
  TF_VAR_token: 'tf-token',
  KUBE_TOKEN: 'kube-token',
  TF_IN_AUTOMATION: 'from-secret',
} as const;

/**
 * A consumer whose identity names a source Secret of {@link TERRAFORM_KEYS} (in a namespace of its
 * own) and allows the consumer's fresh namespace: what a Terraform Job of {@link runTerraformJob} needs.
 */
export async function terraformConsumer(
  w: fx.World,
  name: string,
): Promise<{ ns: string; id: string; consumer: Consumer }> {
  const source = await operatorSource(w, fx.data(TERRAFORM_KEYS));
  const ns = await w.namespace();
  const id = await source.newIdentity(fx.allowList(ns));
  const consumer = await w.create(fx.consumer(name, fx.inNamespace(ns), fx.identityRef(id)));
  return { ns, id, consumer };
}

/** What the stand-in terraform of {@link runTerraformJob} saw, and its pod. */
export interface TerraformRun {
  uid: number;
  groups: number[];
  env: string[];
  files: Record<string, { mode: string; gid: number; readable: boolean }>;
  /** The pod's fsGroup (the group the credential files must have). */
  fsGroup: number;
  /** The pod's whole log. */
  log: string;
}

/**
 * Runs the provider's Terraform Job on a node as SPEC §11 builds it (fx.terraformJob with the
 * delivery fragment for `identity`), from `image` (its `captf-runner` bundle and node) with the
 * stand-in terraform, in `namespace`, and waits for it to end.
 * @param work the node system's state folder (the kubelet writes pod logs under it).
 * @throws AssertionError with the pod's log when the Job does not succeed.
 */
export async function runTerraformJob(
  w: fx.World,
  work: string,
  o: { namespace: string; identity: string; image: string; pull: 'Never' | 'IfNotPresent' },
): Promise<TerraformRun> {
  const { namespace } = o;
  const batch = w.clients.kc.makeApiClient(BatchV1Api);
  await w.clients.core.createNamespacedConfigMap({
    namespace,
    body: { metadata: { name: 'terraform' }, data: { terraform: TERRAFORM_STAND_IN } },
  });
  const job = jobWithCredentials(fx.terraformJob('tf-apply', 'apply', fx.inNamespace(namespace)), o.identity);
  const pod = job.spec!.template.spec!;
  const c = pod.containers[0]!;
  c.image = o.image;
  c.imagePullPolicy = o.pull;
  c.command = ['node', '/app/dist/captf-runner.mjs', '--', 'terraform', 'apply'];
  c.env = [...(c.env ?? []), { name: 'PATH', value: '/opt/terraform:/usr/local/bin:/usr/bin:/bin' }];
  c.volumeMounts = [...(c.volumeMounts ?? []), { name: 'terraform', mountPath: '/opt/terraform' }];
  pod.volumes = [...(pod.volumes ?? []), { name: 'terraform', configMap: { name: 'terraform', defaultMode: 0o555 } }];
  await batch.createNamespacedJob({ namespace, body: job });
  const done = await eventually(
    'the Job to finish',
    async () => {
      const j = await batch.readNamespacedJob({ namespace, name: 'tf-apply' });
      return j.status?.succeeded || j.status?.failed ? j : undefined;
    },
    180_000,
    500,
  );
  const [ran] = (await w.clients.core.listNamespacedPod({ namespace, labelSelector: 'job-name=tf-apply' })).items;
  const log = podLog(work, ran!);
  assert.equal(done.status?.succeeded, 1, log);
  const out = log
    .split('\n')
    .map((l) => /^\S+ stdout [FP] (.*)$/.exec(l)?.[1])
    .find((l) => l?.startsWith('{'));
  assert.ok(out, `the stand-in terraform printed what it saw:\n${log}`);
  return {
    ...(JSON.parse(out) as Omit<TerraformRun, 'fsGroup' | 'log'>),
    fsGroup: ran!.spec!.securityContext!.fsGroup!,
    log,
  };
}

/**
 * Asserts SPEC §11 on what the Job's terraform saw: it ran as 65532 in the fsGroup; the cloud
 * keys and the runner's three exceptions reached it by envFrom, `TF_VAR_token` and `KUBE_TOKEN`
 * were stripped; every key of `files` is a 0440 file of the fsGroup it can read; the runner said
 * it filtered.
 */
export function assertTerraformSaw(ran: TerraformRun, files: readonly string[]): void {
  assert.equal(ran.uid, 65532);
  assert.ok(ran.groups.includes(ran.fsGroup), 'the runner is in the fsGroup');
  for (const k of ['AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY', 'TF_IN_AUTOMATION', 'TF_INPUT', 'KUBE_NAMESPACE'])
    assert.ok(ran.env.includes(k), `${k} reaches terraform`);
  for (const k of ['TF_VAR_token', 'KUBE_TOKEN']) assert.ok(!ran.env.includes(k), `${k} is stripped`);
  for (const k of files) assert.deepEqual(ran.files[k], { mode: '440', gid: ran.fsGroup, readable: true }, k);
  assert.match(ran.log, /"message":"environment filtered"/);
}
