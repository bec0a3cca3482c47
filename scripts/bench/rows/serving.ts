/**
 * Rows on Knative Serving on a real node (a system of its own, `startSystem({ serving: true,
 * events: 'knative' })`), with the shipped manifests, the shipped Broker on Knative Eventing's
 * own installation (the ApiServerSource adapter, the Broker's ingress and filter and the
 * in-memory channel's dispatcher are pods) and Knative's autoscaling: no stand-in front (the
 * process rows keep theirs).
 * - "serving cold start": from zero through Traefik and the activator: a new consumer's event
 *   until its mirror is written (adapter → Broker → Trigger → Knative Service), a prepare
 *   until its answer, and an identity create (dry run) until the API server's answer, the
 *   webhook reached through Traefik over cluster-local TLS. Each cold sample starts only once the Knative Service has no pod, Running
 *   or Terminating (the row counts those starts). Baselines: the same right after, pod warm; and
 *   a bare Node Knative Service from the same image with Knative's defaults (`captf-bare`), a
 *   request from zero through the same Traefik and activator until its answer.
 * - "serving fan-in N": N consumers of one identity in one namespace, created at the bench's
 *   client concurrency: time until every one is mirrored (`CredentialsMirrored=True`) and an
 *   owner of the mirror (baseline: N Secret creates),
 *   mirror-sync's API requests per consumer and conflicts (audit log, counted once its requests
 *   have stopped for 3 s: the echoes of its own status writes included), its pods over time
 *   (sampled each second, Running or Terminating) and the most at once, dead letters (pods
 *   of the dead-letter sink), and deliveries answered non-2xx or not at all (broker-filter's log).
 * Without root the rows fail saying so (the node needs namespaces and cgroups).
 */
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { CoreV1Api, type KubeConfig } from '@kubernetes/client-node';
import { setGlobalDispatcher, getGlobalDispatcher } from 'undici';
import { loadKubeConfig } from '../../../functions/lib/kube.ts';
import { DEFAULT_PREPARE_AUDIENCE } from '../../../functions/mirror-sync/authorize.ts';
import { SERVICE_LABEL } from '../../local/scale.ts';
import { prepareCaller } from '../../lib/serviceaccount.ts';
import { eventually, sleep } from '../../lib/wait.ts';
import { Service, type IService } from '@kubernetes-models/knative/serving.knative.dev/v1/Service';
import { revisionReady, withRevisionAnnotations } from '../../serving/revision.ts';
import { failedDeliveries } from '../../system/broker.ts';
import { clusterLocalDispatcher } from '../../system/serving.ts';
import { startSystem, type RunningSystem } from '../../system/system.ts';
import { REPO_ROOT } from '../../tools/build.ts';
import { secretCreates } from '../baselines.ts';
import { BenchClient, CLIENT_CONCURRENCY } from '../client.ts';
import {
  consumerBody,
  consumersPath,
  createConsumers,
  createIdentity,
  createNamespaces,
  GROUP_VERSION,
  hasTrue,
  IDENTITIES,
  identityBody,
  mirrorOf,
  putSourceSecret,
  type Consumer,
  type Mirror,
} from '../fixtures.ts';
import { AuditLog, type RequestCounts } from '../measure.ts';
import type { Figure } from '../report.ts';

/** What the Serving rows need from the bench. */
export interface ServingRowOptions {
  /** Cold samples per kind (event, prepare). */
  runs: number;
  /** Consumers per fan-in burst. */
  fanIn: readonly number[];
  timeoutMs: number;
  log: (line: string) => void;
}

const NAMESPACE = 'captf-system';
const MIRROR_SYNC = 'captf-mirror-sync';
const ADMISSION = 'captf-admission';
const IDENTITY = 'bench-serving';
const MIRROR_SYNC_USER = `system:serviceaccount:${NAMESPACE}:captf-mirror-sync`;
const DEAD_LETTERS = 'captf-dead-letters';

/** The bench's view of the Serving system. */
interface Served {
  system: RunningSystem;
  admin: BenchClient;
  kc: KubeConfig;
  audit: AuditLog;
  opts: ServingRowOptions;
  n: number;
}

/**
 * Starts a node with Serving, measures, stops it.
 * @throws Error when the node or Serving cannot start, or a sample does not complete in time.
 */
export async function servingRows(o: ServingRowOptions): Promise<Figure[]> {
  const dir = join(REPO_ROOT, '.local', `bench-serving-${process.pid}`);
  const system = await startSystem({
    dir,
    progress: o.log,
    serving: true,
    events: 'knative',
    auditLogMaxSizeMB: 100_000,
  });
  const before = getGlobalDispatcher();
  setGlobalDispatcher(clusterLocalDispatcher(system.serving!.gateway, system.serving!.caPem));
  const kc = loadKubeConfig(system.kubeconfigPath);
  const s: Served = {
    system,
    admin: new BenchClient(system.kubeconfigPath, CLIENT_CONCURRENCY),
    kc,
    audit: new AuditLog(join(system.controlPlane!.dir, 'logs', 'audit.log')),
    opts: o,
    n: 0,
  };
  try {
    await putSourceSecret(s.admin, 'bench-serving-creds', { token: 'bench' });
    await createIdentity(s.admin, {
      name: IDENTITY,
      secret: 'bench-serving-creds',
      allowedNamespaces: { selector: { matchLabels: { 'captf-bench/serving': 'true' } } },
    });
    // Made first: their first pods have long scaled to zero when the rows need them.
    await deployFloor(s, FLOOR);
    await deployFloor(s, BARE);
    const figures = [...(await coldStarts(s))];
    for (const n of o.fanIn) figures.push(...(await fanInRow(s, n)));
    return figures;
  } finally {
    setGlobalDispatcher(before);
    s.admin.close();
    await system.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Pods of a Knative Service, Running or Terminating. */
const podCount = async (kc: KubeConfig, service: string): Promise<number> =>
  (
    await kc
      .makeApiClient(CoreV1Api)
      .listNamespacedPod({ namespace: NAMESPACE, labelSelector: `${SERVICE_LABEL}=${service}` })
  ).items.length;

/** Waits until `service` has no pod; scale to zero takes the autoscaler's windows plus the pods' drain. */
const atZero = (s: Served, service: string) =>
  eventually(`${service} to have no pod`, async () => (await podCount(s.kc, service)) === 0, s.opts.timeoutMs, 500);

/** A new namespace the identity allows, with a name no other sample uses. */
async function newNamespace(s: Served): Promise<string> {
  const ns = `bench-serving-${s.n++}`;
  await createNamespaces(s.admin, [ns], { 'captf-bench/serving': 'true' });
  return ns;
}

/** A consumer created, then the time until the mirror names it as an owner. */
async function eventToMirror(s: Served, ns: string, name: string): Promise<number> {
  const t0 = performance.now();
  const created = await s.admin.call<{ metadata: { uid: string } }>(
    'POST',
    consumersPath('terraformclusters', ns),
    consumerBody('terraformclusters', name, IDENTITY),
  );
  await eventually(
    `the mirror in ${ns} to name ${name} as an owner`,
    async () => {
      const m = await s.admin
        .call<Mirror>('GET', `/api/v1/namespaces/${ns}/secrets/${mirrorOf(IDENTITY)}`)
        .catch(() => undefined);
      return m?.metadata.ownerReferences?.some((r) => r.uid === created.metadata.uid);
    },
    s.opts.timeoutMs,
    20,
  );
  return performance.now() - t0;
}

/** One prepare through Traefik, timed. @throws Error unless it answers 200. */
async function timedPrepare(s: Served, ns: string, name: string, token: string): Promise<number> {
  const t0 = performance.now();
  const res = await fetch(`${s.system.serving!.urls[MIRROR_SYNC]}/prepare`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: JSON.stringify({ apiVersion: GROUP_VERSION, kind: 'TerraformCluster', namespace: ns, name }),
  });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`prepare answered ${res.status}: ${text.slice(0, 200)}`);
  return performance.now() - t0;
}

/** One GET of a Knative Service's address through Traefik, timed. @throws Error unless it answers 200. */
async function timedGet(s: Served, service: string): Promise<number> {
  const t0 = performance.now();
  const res = await fetch(`https://${service}.${NAMESPACE}.svc.cluster.local/`);
  await res.arrayBuffer();
  if (res.status !== 200) throw new Error(`${service} answered ${res.status}`);
  return performance.now() - t0;
}

/**
 * An identity create as the admin, a dry run (reviewed by the webhook, nothing stored), timed
 * until the API server answers.
 * @throws Error unless it is admitted.
 */
async function timedReview(s: Served): Promise<number> {
  const t0 = performance.now();
  await s.admin.call(
    'POST',
    `${IDENTITIES}?dryRun=All`,
    identityBody({ name: 'bench-review', secret: 'bench-serving-creds', allowedNamespaces: { list: ['bench'] } }),
  );
  return performance.now() - t0;
}

/** The cold-start figures: event → mirror and prepare, from zero and warm. */
async function coldStarts(s: Served): Promise<Figure[]> {
  const caller = await prepareCaller(s.kc, {
    namespace: NAMESPACE,
    name: 'bench-serving-manager',
    suffix: 'bench-serving',
    audience: DEFAULT_PREPARE_AUDIENCE,
  });
  const cold: ColdSamples = { event: [], prepare: [], review: [], bare: [] };
  const warm: ColdSamples = { event: [], prepare: [], review: [], bare: [] };
  let empty = 0;
  try {
    for (let i = 0; i < s.opts.runs; i++) {
      const ns = await newNamespace(s);
      await atZero(s, MIRROR_SYNC);
      empty += (await podCount(s.kc, MIRROR_SYNC)) === 0 ? 1 : 0;
      cold.event.push(await eventToMirror(s, ns, 'c-0'));
      warm.event.push(await eventToMirror(s, ns, 'c-1'));
      await atZero(s, MIRROR_SYNC);
      empty += (await podCount(s.kc, MIRROR_SYNC)) === 0 ? 1 : 0;
      cold.prepare.push(await timedPrepare(s, ns, 'c-0', caller.token));
      warm.prepare.push(await timedPrepare(s, ns, 'c-1', caller.token));
      await atZero(s, ADMISSION);
      empty += (await podCount(s.kc, ADMISSION)) === 0 ? 1 : 0;
      cold.review.push(await timedReview(s));
      warm.review.push(await timedReview(s));
      await atZero(s, BARE);
      empty += (await podCount(s.kc, BARE)) === 0 ? 1 : 0;
      cold.bare.push(await timedGet(s, BARE));
      warm.bare.push(await timedGet(s, BARE));
      s.opts.log(
        `serving cold start ${i + 1}/${s.opts.runs}: event ${Math.round(cold.event.at(-1)!)} ms, prepare ${Math.round(cold.prepare.at(-1)!)} ms, review ${Math.round(cold.review.at(-1)!)} ms, bare Node Service ${Math.round(cold.bare.at(-1)!)} ms`,
      );
    }
  } finally {
    await caller.cleanup();
  }
  return coldStartFigures(cold, warm, empty, s.opts.runs);
}

/** Cold samples per kind (ms), from zero or warm. */
interface ColdSamples {
  event: number[];
  prepare: number[];
  review: number[];
  bare: number[];
}

/** The cold-start row's figures from its samples; `empty` of the `4 × runs` cold samples started with no pod. */
function coldStartFigures(cold: ColdSamples, warm: ColdSamples, empty: number, runs: number): Figure[] {
  const row = 'serving cold start';
  const fromZero = (what: string, kind: keyof typeof warm): Figure => ({
    row,
    what,
    unit: 'ms',
    samples: cold[kind],
    baseline: { what: 'the same, pod warm', samples: warm[kind] },
  });
  const besideBare = (what: string, kind: keyof typeof warm): Figure => ({
    row,
    what,
    unit: 'ms',
    samples: cold[kind],
    baseline: {
      what: 'a bare Node Knative Service from the same image, from zero: request → answer (Traefik, activator)',
      samples: cold.bare,
    },
  });
  return [
    fromZero('mirror-sync from zero: new consumer → mirror (adapter, Broker, Traefik, activator)', 'event'),
    fromZero('mirror-sync from zero: prepare → answer (Traefik, activator)', 'prepare'),
    fromZero(
      "admission from zero: identity create → the API server's answer (webhook through Traefik over TLS, activator)",
      'review',
    ),
    fromZero('a bare Node Knative Service from zero: request → answer (Traefik, activator)', 'bare'),
    besideBare('mirror-sync from zero: new consumer → mirror, beside a bare Node Service from zero', 'event'),
    besideBare('mirror-sync from zero: prepare → answer, beside a bare Node Service from zero', 'prepare'),
    besideBare(
      "admission from zero: identity create → the API server's answer, beside a bare Node Service from zero",
      'review',
    ),
    {
      row,
      what: 'cold samples with no pod (Running or Terminating) when the request was sent, of all',
      unit: 'count',
      samples: [empty],
      baseline: { what: 'cold samples', samples: [4 * runs] },
    },
  ];
}

/** Samples every second how many pods `services` have, until `stop()`. */
function podsOverTime(kc: KubeConfig, services: readonly string[]) {
  const series = Object.fromEntries(services.map((x) => [x, [] as number[]]));
  let running = true;
  const done = (async () => {
    while (running) {
      for (const x of services) series[x]!.push(await podCount(kc, x).catch(() => -1));
      await sleep(1000);
    }
  })();
  return {
    series,
    stop: async () => {
      running = false;
      await done;
    },
  };
}

/** Waits until mirror-sync has made no API request for `quietMs` (bounded by the row's timeout). */
async function quietFor(s: Served, from: number, quietMs: number): Promise<void> {
  const deadline = Date.now() + s.opts.timeoutMs;
  let last = -1;
  let since = Date.now();
  while (Date.now() < deadline) {
    const now = s.audit.countFor(MIRROR_SYNC_USER, from).requests;
    if (now !== last) [last, since] = [now, Date.now()];
    else if (Date.now() - since >= quietMs) return;
    await sleep(500);
  }
}

/** What one fan-in burst measured. */
interface Burst {
  /** Create of the first consumer → every consumer mirrored (or, for the floor, delivered). */
  ms: number;
  /** mirror-sync's requests (audit log) once it was quiet. */
  counts: RequestCounts;
  /** mirror-sync pods each second (Running or Terminating). */
  pods: number[];
  /** The most dead-letter sink pods at once (a dead letter starts one). */
  deadLetterPods: number;
  /** Deliveries the Broker's filter saw fail (answered non-2xx, or no answer), to either function, during the burst. */
  failedDeliveries: number;
}

/**
 * One fan-in burst of `n` consumers on real autoscaling, from zero: time until every one is
 * mirrored and an owner of the mirror, then mirror-sync's bill once it is quiet.
 */
async function fanIn(s: Served, n: number): Promise<Burst> {
  const ns = await newNamespace(s);
  await atZero(s, MIRROR_SYNC);
  const pods = podsOverTime(s.kc, [MIRROR_SYNC, DEAD_LETTERS]);
  const from = s.audit.mark();
  // Read afresh at each access (the kubelet's log of broker-filter's pods).
  const filterFrom = s.system.broker!.logs.filter.length;
  const t0 = performance.now();
  let ms: number;
  try {
    await createConsumers(s.admin, { plural: 'terraformclusters', items: burstOf(ns, n), identity: IDENTITY });
    await eventually(
      `${n} consumers in ${ns} mirrored, each an owner of the mirror`,
      async () => {
        const m = await s.admin
          .call<Mirror>('GET', `/api/v1/namespaces/${ns}/secrets/${mirrorOf(IDENTITY)}`)
          .catch(() => undefined);
        if ((m?.metadata.ownerReferences?.length ?? 0) !== n) return false;
        const list = await s.admin.call<{ items: Consumer[] }>('GET', consumersPath('terraformclusters', ns));
        return list.items.length === n && list.items.every((c) => hasTrue(c, 'CredentialsMirrored'));
      },
      s.opts.timeoutMs,
      100,
    );
    ms = performance.now() - t0;
    // The echoes of mirror-sync's own status writes come after: count once its requests stop.
    await quietFor(s, from, 3000);
  } finally {
    await pods.stop();
  }
  return {
    ms,
    counts: s.audit.countFor(MIRROR_SYNC_USER, from),
    pods: pods.series[MIRROR_SYNC]!,
    deadLetterPods: Math.max(0, ...pods.series[DEAD_LETTERS]!),
    failedDeliveries: failedDeliveries(s.system.broker!.logs.filter.slice(filterFrom)).count,
  };
}

/** The consumers of a burst: `f-0` … `f-<n-1>` in `ns`. */
const burstOf = (ns: string, n: number) => Array.from({ length: n }, (_, i) => ({ namespace: ns, name: `f-${i}` }));

/**
 * The fan-in row: the burst as shipped (autoscaled), the same burst with mirror-sync pinned to one
 * pod (`max-scale: 1`), the data plane's own floor (the same events through the same ApiServerSource,
 * Broker, Trigger and activator to a no-op Knative Service from the same image), and N Secret creates.
 */
async function fanInRow(s: Served, n: number): Promise<Figure[]> {
  const scaled = await fanIn(s, n);
  const pinned = await withRevisionAnnotations(
    s.kc,
    { namespace: NAMESPACE, service: MIRROR_SYNC, timeoutMs: s.opts.timeoutMs },
    { 'autoscaling.knative.dev/max-scale': '1' },
    () => fanIn(s, n),
  );
  const floor = await dataPlaneFloor(s, n);
  const secrets = await secretCreates(s.admin, await newNamespace(s), n, 'floor');
  const row = `serving fan-in N=${n}`;
  const onWrites = (c: RequestCounts) =>
    (c.conflictsOn.secrets ?? 0) + (c.conflictsOn['terraformclusters/status'] ?? 0);
  const time = (what: string, base: { what: string; ms: number }): Figure => ({
    row,
    what,
    unit: 'ms',
    samples: [scaled.ms],
    baseline: { what: base.what, samples: [base.ms] },
  });
  const count = (what: string, v: number): Figure => ({ row, what, unit: 'count', samples: [v] });
  return [
    time('time until all mirrored', { what: `${n} Secret creates`, ms: secrets }),
    time('time until all mirrored, beside the data plane floor', {
      what: `the same ${n} events to a no-op Knative Service from the same image`,
      ms: floor,
    }),
    time('time until all mirrored, autoscaled, beside the same burst pinned to one pod', {
      what: 'mirror-sync at max-scale 1',
      ms: pinned.ms,
    }),
    count('mirror-sync API requests per consumer', scaled.counts.requests / n),
    count('409 conflicts', scaled.counts.conflicts),
    count('409 conflicts on the mirror and on status', onWrites(scaled.counts)),
    count('mirror-sync pods, most at once', Math.max(...scaled.pods)),
    { row, what: 'mirror-sync pods over time (one sample a second)', unit: 'count' as const, samples: scaled.pods },
    count('dead-letter sink pods (a dead letter starts one)', scaled.deadLetterPods),
    count('deliveries answered non-2xx or not at all (broker-filter), either function', scaled.failedDeliveries),
    count('pinned to one pod: mirror-sync API requests per consumer', pinned.counts.requests / n),
    count('pinned to one pod: 409 conflicts on the mirror and on status', onWrites(pinned.counts)),
    count('pinned to one pod: dead-letter sink pods', pinned.deadLetterPods),
    count('pinned to one pod: deliveries answered non-2xx or not at all', pinned.failedDeliveries),
  ];
}

/** The no-op sink of the floor row: a Knative Service from the product image. */
const FLOOR = 'captf-floor';

/**
 * A server that answers every request 200 at once and prints one line per delivery: the CloudEvent
 * id and the first bytes of its data (an ApiServerSource ref names the object); it exits at SIGTERM,
 * as the product does when Knative scales in. Run by the image's own `node`, so the floor pays what
 * the product's process pays to start and to be reached.
 */
const FLOOR_SERVER = [
  "require('http').createServer((q, s) => {",
  "  let b = ''; q.on('data', (c) => { if (b.length < 512) b += c; });",
  "  q.on('end', () => { console.log(JSON.stringify({ id: q.headers['ce-id'], data: b.slice(0, 512) })); s.end(); });",
  '}).listen(Number(process.env.PORT) || 8080);',
  // PID 1 in its container: no signal has a default action, so SIGTERM must be handled.
  "process.on('SIGTERM', () => process.exit(0));",
].join('\n');

/**
 * The data plane's own floor: the same `n` consumer creates, their events through the same
 * ApiServerSource, Broker and Trigger (mirror-sync's `ref.add` Trigger, pointed at the floor for
 * the burst) and the activator to {@link FLOOR}, a Knative Service from the same image and with
 * mirror-sync's autoscaling, from zero, that answers 200 at once. Nothing writes conditions, so
 * there are no echoes: this is what the data plane costs for the consumers' own events.
 * @returns ms from the first create until the floor had received every consumer's event (its pods' logs).
 */
async function dataPlaneFloor(s: Served, n: number): Promise<number> {
  const ns = await newNamespace(s);
  await atZero(s, FLOOR);
  const restore = await pointTrigger(s, 'captf-mirror-sync-ref-add', FLOOR);
  try {
    const seen = new Set<string>();
    const t0 = performance.now();
    await createConsumers(s.admin, { plural: 'terraformclusters', items: burstOf(ns, n), identity: IDENTITY });
    await eventually(
      `the floor to receive the events of ${n} consumers in ${ns}`,
      async () => {
        for (const name of await deliveredTo(s, ns)) seen.add(name);
        return seen.size >= n;
      },
      s.opts.timeoutMs,
      250,
    );
    return performance.now() - t0;
  } finally {
    await restore();
  }
}

/**
 * The cold starts' baseline: a Knative Service from the product image whose node server answers
 * 200 at once ({@link FLOOR_SERVER}), with mirror-sync's resources but Knative's own defaults for
 * everything else (no probes of its own, no autoscaling annotations): what a pod from this image
 * costs to start and reach through the activator.
 */
const BARE = 'captf-bare';

/**
 * Creates a no-op Knative Service from mirror-sync's own revision template (image, resources;
 * for {@link FLOOR} also its autoscaling and probes, for {@link BARE} Knative's defaults) and
 * waits until Ready.
 */
async function deployFloor(s: Served, name: typeof FLOOR | typeof BARE): Promise<void> {
  const base = `/apis/serving.knative.dev/v1/namespaces/${NAMESPACE}/services`;
  const ms = await s.admin.call<IService>('GET', `${base}/${MIRROR_SYNC}`);
  const template = structuredClone(ms.spec!.template!);
  const [container] = template.spec!.containers;
  const bare = name === BARE;
  template.metadata = { annotations: bare ? {} : (template.metadata?.annotations ?? {}) };
  const { readinessProbe, livenessProbe, env, ...rest } = container!;
  const own = bare ? {} : { readinessProbe, livenessProbe, env };
  template.spec!.containers = [{ ...rest, ...own, command: ['node'], args: ['-e', FLOOR_SERVER] }];
  if (bare) delete template.spec!.containerConcurrency;
  const floor = new Service({
    metadata: { name, namespace: NAMESPACE, labels: { 'networking.knative.dev/visibility': 'cluster-local' } },
    spec: { template },
  });
  const created = await s.admin.call<IService>('POST', base, floor.toJSON());
  await revisionReady(
    s.kc,
    { namespace: NAMESPACE, service: name },
    created.metadata?.generation ?? 1,
    s.opts.timeoutMs,
  );
}

/**
 * Points a Trigger's delivery at another Knative Service of the same namespace: its
 * `status.subscriberUri`, which Knative's broker filter delivers to (the stand-in for Eventing's
 * controllers writes it once, at start). @returns a function that puts the old address back.
 */
async function pointTrigger(s: Served, trigger: string, service: string): Promise<() => Promise<void>> {
  const path = `/apis/eventing.knative.dev/v1/namespaces/${NAMESPACE}/triggers/${trigger}/status`;
  const t = await s.admin.call<{ status: { subscriberUri: string } }>('GET', path);
  const was = t.status.subscriberUri;
  const set = async (uri: string) => {
    await s.admin.call('PATCH', path, { status: { subscriberUri: uri } }, 'application/merge-patch+json');
    // The filter follows Triggers through an informer: give it a moment to see the change.
    await sleep(2000);
  };
  await set(was.replace(`//${MIRROR_SYNC}.`, `//${service}.`));
  return () => set(was);
}

/** Names of the consumers in `ns` whose events {@link FLOOR}'s pods have printed so far. */
async function deliveredTo(s: Served, ns: string): Promise<string[]> {
  const core = s.kc.makeApiClient(CoreV1Api);
  const pods = await core.listNamespacedPod({ namespace: NAMESPACE, labelSelector: `${SERVICE_LABEL}=${FLOOR}` });
  const names: string[] = [];
  for (const p of pods.items) {
    const container = p.spec?.containers.find((c) => c.name !== 'queue-proxy')?.name;
    const log = await core
      .readNamespacedPodLog({ namespace: NAMESPACE, name: p.metadata!.name!, container })
      .catch(() => '');
    for (const line of String(log).split('\n')) {
      const ref = refOf(line);
      if (ref?.namespace === ns && ref.name) names.push(ref.name);
    }
  }
  return names;
}

/** The object an ApiServerSource event names (ref mode: the data; resource mode: its metadata), from one floor log line. */
function refOf(line: string): { namespace?: string; name?: string } | undefined {
  try {
    const data = JSON.parse(String((JSON.parse(line) as { data?: unknown }).data)) as {
      namespace?: string;
      name?: string;
      metadata?: { namespace?: string; name?: string };
    };
    return data.metadata ?? data;
  } catch {
    return undefined;
  }
}
