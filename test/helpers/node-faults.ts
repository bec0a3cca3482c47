/**
 * Faults on the Serving node (test/integration/serving-faults.test.ts; `npm run soak -- --serving`
 * at larger sizes): a burst of consumer changes over several identities and namespaces with an
 * identity narrowing and a source rotation in its middle, faults fired at points of it, a
 * provider polling prepare for the namespace the narrowing revokes, and the time until the
 * mirror invariant holds again.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { V1Pod } from '@kubernetes/client-node';
import type { Consumer, TerraformClusterIdentity } from '../../functions/lib/api.ts';
import { identities } from '../../functions/lib/objects.ts';
import { CGROUP_FS } from '../../scripts/node/cgroups.ts';
import type { PrepareCaller } from '../../scripts/lib/serviceaccount.ts';
import { sleep } from '../../scripts/lib/wait.ts';
import { refusal, type WebhookUsers } from './admission.ts';
import { eventually } from './cluster.ts';
import * as fx from './fixtures.ts';
import { invariantViolations } from './invariant.ts';
import { alternatingKinds } from './mirror-sync.ts';
import { postPrepare, prepareTarget } from './prepare.ts';

/** What one burst works on. */
export interface BurstWorld {
  /** The four consumer namespaces. */
  namespaces: string[];
  /** The (namespace, identity) pairs consumers are made for, in turn. */
  keys: [string, string][];
  /** The identity that allows all four and is narrowed to the first three mid-burst. */
  narrowed: string;
  /** The namespace the narrowing revokes. */
  revoked: string;
  /** A consumer of {@link narrowed} in {@link revoked}, made before the burst: what the provider prepares. */
  watcher: Consumer;
  /**
   * The middle of a burst: the narrowing, then a rotation of another identity's source;
   * `narrowed` is called as soon as the narrowing is stored.
   */
  middle(narrowed: () => void): Promise<void>;
}

/**
 * Makes a burst's world in `w`: a source namespace with three Secrets, four consumer
 * namespaces (made at once: each new namespace rolls the ApiServerSource adapter out again),
 * identity `narrowed` allowing all four, `rotated` the first two, `other` the last two.
 */
export async function burstWorld(w: fx.World): Promise<BurstWorld> {
  const [sources, ...namespaces] = await Promise.all([0, 1, 2, 3, 4].map(() => w.namespace()));
  const [n0, n1, n2, n3] = namespaces as [string, string, string, string];
  // Retried like the burst's writes: the webhook may still be coming back from the last fault.
  for (const name of ['creds-a', 'creds-b', 'creds-c'])
    await createdOnce(w, fx.sourceSecret(name, fx.inNamespace(sources!), fx.data({ key: `${name}-1` })));
  const ref = (name: string) => fx.secretRef(sources!, name);
  const identity = async (...mods: fx.Modifier<TerraformClusterIdentity>[]) =>
    (await createdOnce(w, fx.identity(w.name('id'), ...mods))).metadata.name!;
  const narrowed = await identity(ref('creds-a'), fx.allowList(n0, n1, n2, n3));
  const rotated = await identity(ref('creds-b'), fx.allowList(n0, n1));
  const other = await identity(ref('creds-c'), fx.allowList(n2, n3));
  const watcher = await createdOnce(w, fx.consumer('watch', fx.inNamespace(n3), fx.identityRef(narrowed)));
  const middle = async (onNarrowed: () => void) => {
    await retried('the narrowing', () => w.put(fx.identity(narrowed, ref('creds-a'), fx.allowList(n0, n1, n2))));
    onNarrowed();
    await retried('the rotation', async () => {
      const s = await w.clients.core.readNamespacedSecret({ namespace: sources!, name: 'creds-b' });
      s.data = { key: Buffer.from('creds-b-2').toString('base64') };
      await w.clients.core.replaceNamespacedSecret({ namespace: sources!, name: 'creds-b', body: s });
    });
  };
  const keys: [string, string][] = [
    ...namespaces.map((n): [string, string] => [n, narrowed]),
    [n0, rotated],
    [n1, rotated],
    [n2, other],
    [n3, other],
  ];
  return { namespaces, keys, narrowed, revoked: n3, watcher, middle };
}

/** The HTTP status of a failed API call (the client's ApiException), if any. */
const statusOf = (err: unknown): number | undefined => (err as { code?: number }).code;

/**
 * Runs `write` until it succeeds (an API server restarting, a webhook cold-starting or killed
 * refuse writes for a while): within 3 minutes. @throws Error with the last error after that.
 */
export async function retried(what: string, write: () => Promise<unknown>): Promise<void> {
  await eventually(what, () => write().then(() => true), 180_000, 500);
}

/** A point of the burst: after `at` (0–1) of its changes, `run` starts; a `blocking` one holds the burst until it ends. */
export interface BurstPoint {
  at: number;
  run: () => Promise<unknown>;
  blocking?: boolean;
}

/** When the burst ended, and when each point's run ended (in the order given). */
export interface BurstTimes {
  endedAt: number;
  points: number[];
}

/**
 * `changes` consumer changes in `b`'s namespaces, `parallel` at a time: four of five create a
 * consumer for the next key in turn (TerraformClusters and TerraformMachines), the fifth deletes
 * the one made four changes before. Each write is {@link retried}. `points` (the middle, the
 * faults) start where they say; while a blocking one runs, no worker takes a new change (the
 * changes already sent go on). A failed change stops the burst.
 * @returns when the last change and each point ended (a point's failure fails the burst).
 */
export async function runBurst(
  w: fx.World,
  b: BurstWorld,
  o: { changes: number; parallel: number; points: readonly BurstPoint[] },
): Promise<BurstTimes> {
  const { points } = o;
  const started: Promise<number>[] = [];
  // Registered when a change is taken, so the delete of one not yet made waits for it.
  const made = new Map<number, PromiseWithResolvers<Consumer>>();
  const change = async (j: number) => {
    if (j % 5 === 4) {
      const gone = await made.get(j - 4)!.promise;
      return retried(`deleting ${gone.metadata.name}`, () => w.delete(gone));
    }
    const [ns, id] = b.keys[j % b.keys.length]!;
    const c = fx.consumer(`b-${j}`, fx.inNamespace(ns), fx.identityRef(id), fx.ofKind(alternatingKinds(j)));
    const entry = made.get(j)!;
    createdOnce(w, c).then(entry.resolve, entry.reject);
    await entry.promise;
  };
  let next = 0;
  let gate: Promise<unknown> = Promise.resolve();
  let failed = false;
  const start = (p: BurstPoint) => {
    const ended = p.run().then(() => Date.now());
    ended.catch(() => undefined); // awaited with the rest at the end
    started[points.indexOf(p)] = ended;
    if (p.blocking) gate = ended;
  };
  const worker = async () => {
    for (;;) {
      await gate;
      const j = next++;
      if (j >= o.changes || failed) return;
      if (j % 5 !== 4) made.set(j, Promise.withResolvers<Consumer>());
      points.filter((p) => Math.floor(p.at * o.changes) === j).forEach(start);
      await gate;
      await change(j).catch((err: unknown) => {
        failed = true;
        throw err;
      });
    }
  };
  await Promise.all(Array.from({ length: o.parallel }, worker));
  const endedAt = Date.now();
  return { endedAt, points: await Promise.all(points.map((_, i) => started[i] ?? endedAt)) };
}

/** Creates `c` through the world, retried; an AlreadyExists after a lost answer is the create that went through. */
function createdOnce<T extends Parameters<fx.World['create']>[0]>(w: fx.World, c: T): Promise<T> {
  return eventually(
    `creating ${[c.metadata?.namespace, c.metadata?.name].filter(Boolean).join('/')}`,
    () =>
      w.create(c).catch(async (err: unknown) => {
        if (statusOf(err) === 409) return w.read(c);
        throw err;
      }),
    180_000,
    500,
  );
}

/** The prepare answers a provider polling {@link pollPrepare} got, by status (0: no answer in time). */
export interface PrepareLog {
  /** Answers to requests sent before the narrowing was stored (200s show the poller works). */
  beforeNarrowing: Record<number, number>;
  /** Answers to requests sent after it. */
  afterNarrowing: Record<number, number>;
  /** How many requests in all. */
  sent: number;
}

/** How long a polled prepare may take before it counts as unanswered: SPEC §5's bound. */
const PREPARE_TIMEOUT_MS = 30_000;
/** Most polled prepares in flight at once. */
const PREPARES_IN_FLIGHT = 8;

/**
 * The provider asking prepare for `b.watcher` (in the namespace the narrowing revokes) every
 * 500 ms (a slow answer does not hold the next ask back), from now until `stop`; `narrowed()`
 * marks the moment the narrowing was stored, after which no request sent may be answered 200.
 */
export function pollPrepare(url: string, caller: PrepareCaller, b: BurstWorld) {
  const log: PrepareLog = { beforeNarrowing: {}, afterNarrowing: {}, sent: 0 };
  const inFlight = new Set<Promise<void>>();
  let narrowedAt = Infinity;
  const ask = async () => {
    const sentAt = Date.now();
    log.sent++;
    const status = await postPrepare(url, prepareTarget(b.watcher), caller, AbortSignal.timeout(PREPARE_TIMEOUT_MS))
      .then((r) => r.status)
      .catch(() => 0);
    const tally = sentAt > narrowedAt ? log.afterNarrowing : log.beforeNarrowing;
    tally[status] = (tally[status] ?? 0) + 1;
  };
  const timer = setInterval(() => {
    if (inFlight.size >= PREPARES_IN_FLIGHT) return;
    const p = ask().finally(() => inFlight.delete(p));
    inFlight.add(p);
  }, 500);
  return {
    /** The answers so far (live). */
    log,
    narrowed: () => (narrowedAt = Date.now()),
    stop: async (): Promise<PrepareLog> => {
      clearInterval(timer);
      await Promise.all(inFlight);
      return log;
    },
  };
}

/** How long the invariant must go on holding once it holds, in ms. */
const HOLD_MS = 5000;

/**
 * Waits until the mirror invariant (./invariant.ts: one owner reference per consumer, conditions
 * true to the state, no mirror where its identity does not allow it, data current) holds in
 * `namespaces` and still holds {@link HOLD_MS} later, checking every 2 s.
 * @returns milliseconds from `since` until it held (the first of the two checks).
 * @throws Error after `timeoutMs` with the first violations.
 */
export async function convergence(
  w: fx.World,
  namespaces: readonly string[],
  since: number,
  timeoutMs: number,
): Promise<number> {
  let last: string[] = [];
  let heldAt = 0;
  try {
    await eventually(
      'the mirror invariant to hold',
      async () => {
        last = await invariantViolations(w.clients, namespaces);
        if (last.length) return false;
        heldAt = Date.now();
        // And still, a moment later: no late write undid it.
        await sleep(HOLD_MS);
        last = await invariantViolations(w.clients, namespaces);
        return last.length === 0;
      },
      timeoutMs,
      2000,
    );
  } catch (err) {
    throw new Error(`${(err as Error).message}: ${last.length} violations, first: ${last.slice(0, 8).join('; ')}`, {
      cause: err,
    });
  }
  return heldAt - since;
}

/** The host PIDs of every process in the containers of `pod` but its sandbox's (`/pause`). */
export function podProcesses(pod: V1Pod): number[] {
  const mark = `pod${pod.metadata!.uid}`;
  return readdirSync('/proc')
    .map(Number)
    .filter((pid) => Number.isInteger(pid))
    .filter((pid) => {
      try {
        const argv0 = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0] ?? '';
        return readFileSync(`/proc/${pid}/cgroup`, 'utf8').includes(mark) && !argv0.endsWith('/pause');
      } catch {
        return false; // gone meanwhile
      }
    });
}

/**
 * SIGKILLs every process of the containers of `pods` (the kubelet then restarts them, as after
 * a crash). @returns how many were killed.
 */
export function sigkillPods(pods: readonly V1Pod[]): number {
  let n = 0;
  for (const pid of pods.flatMap(podProcesses)) {
    try {
      process.kill(pid, 'SIGKILL');
      n++;
    } catch {
      // gone meanwhile
    }
  }
  return n;
}

/** A container's memory (its cgroup v1 `memory` controller), in MiB. */
export interface ContainerMemory {
  /** Anonymous memory (`total_rss`): what the kernel cannot reclaim but by killing. */
  rssMiB: number;
  /** The most it has charged, page cache included (`max_usage_in_bytes`). */
  peakMiB: number;
  limitMiB: number;
}

/** The memory of the container process `pid` runs in; undefined when it is gone or unreadable. */
export function memoryOf(pid: number): ContainerMemory | undefined {
  try {
    const line = readFileSync(`/proc/${pid}/cgroup`, 'utf8')
      .split('\n')
      .find((l) => /^\d+:[^:]*\bmemory\b[^:]*:/.test(l));
    if (!line) return undefined;
    const dir = join(CGROUP_FS, 'memory', line.slice(line.lastIndexOf(':') + 1));
    const mib = (bytes: number) => Math.round(bytes / 2 ** 20);
    const read = (file: string) => Number(readFileSync(join(dir, file), 'utf8'));
    const rss = /^total_rss (\d+)$/m.exec(readFileSync(join(dir, 'memory.stat'), 'utf8'))?.[1];
    return {
      rssMiB: mib(Number(rss)),
      peakMiB: mib(read('memory.max_usage_in_bytes')),
      limitMiB: mib(read('memory.limit_in_bytes')),
    };
  } catch {
    return undefined;
  }
}

/** What {@link reviewsWhileKilled} saw. */
export interface KilledReviews {
  /** The creates of the user who may not get the source: refused by the webhook, failed closed (it could not be called), otherwise. */
  refused: { byWebhook: number; failedClosed: number; otherwise: string[] };
  /** Those of that user's identities that exist now (must be none). */
  wronglyAdmitted: string[];
  /** The creates of the user who may: admitted, and failed closed while admission was down. */
  allowed: number;
  failedClosed: number;
  /** How each review that was sent before the kill and answered after it ended (`denied`, `admitted`, `failed`). */
  inFlight: string[];
}

/** How the API server says it could not call a webhook whose failure policy is Fail. */
const WEBHOOK_FAILED = /failed calling webhook/;

/**
 * Identity creates through the webhook by `u.reader` (who may get the source Secret) and
 * `u.nobody` (who may not), four at a time for `forMs`, with `kill` run a quarter of the way
 * in (it calls back with the moment it killed); then every identity `nobody` asked for is
 * looked up (as admin). The allowed ones are deleted.
 */
export async function reviewsWhileKilled(
  w: fx.World,
  u: WebhookUsers,
  kill: (killed: (at: number) => void) => Promise<unknown>,
  forMs: number,
): Promise<KilledReviews> {
  const out: KilledReviews = {
    refused: { byWebhook: 0, failedClosed: 0, otherwise: [] },
    wronglyAdmitted: [],
    allowed: 0,
    failedClosed: 0,
    inFlight: [],
  };
  let killedAt = Infinity;
  const spans: { from: number; to: number; how: string }[] = [];
  const asked: string[] = [];
  const made: string[] = [];
  const until = Date.now() + forMs;
  const create = (as: typeof u.reader, name: string) =>
    identities(as).create(fx.identity(name, fx.secretRef(u.secretsNs, 'creds'), fx.allowList(u.consumerNs)));
  const review = async (i: number) => {
    while (Date.now() < until) {
      const name = w.name(`rv${i}`);
      const from = Date.now();
      let how: string;
      if (i % 2) {
        asked.push(name);
        const said = (await refusal(create(u.nobody, name))).message;
        how = u.mayNot.test(said) ? 'denied' : 'failed';
        if (how === 'denied') out.refused.byWebhook++;
        else if (WEBHOOK_FAILED.test(said)) out.refused.failedClosed++;
        else out.refused.otherwise.push(said.slice(0, 200));
      } else {
        const ok = await create(u.reader, name).then(
          () => made.push(name),
          () => undefined,
        );
        how = ok ? 'admitted' : 'failed';
        if (ok) out.allowed++;
        else out.failedClosed++;
      }
      spans.push({ from, to: Date.now(), how });
    }
  };
  const killing = sleep(forMs / 4).then(() => kill((at) => (killedAt = at)));
  await Promise.all([...[0, 1, 2, 3].map(review), killing]);
  out.inFlight = spans.filter((r) => r.from < killedAt && r.to > killedAt).map((r) => r.how);
  for (const name of asked) if (await w.read(fx.identity(name))) out.wronglyAdmitted.push(name);
  for (const name of made) await identities(w.clients).delete({ name });
  return out;
}
