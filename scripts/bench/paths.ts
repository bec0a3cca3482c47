/**
 * The three ways an event reaches mirror-sync in the bench, all with Knative's own code, and
 * the switch between them; bench/README.md ("What runs") has the table and the reasons.
 * - `direct`: the ApiServerSource adapter sends to the function's {@link Front};
 * - `broker`: it sends to the Broker (scripts/eventing/dataplane.ts) with the channel's
 *   `messaging.knative.dev/async-handler` removed: serial, Knative's default;
 * - `broker-async`: the Broker as the manifests ship it, with the async handler: concurrent,
 *   unbounded.
 * The adapter's sink is fixed at start, so going to or from `direct` restarts it. The async
 * handler is set on the Broker and its channel, then the dispatcher is restarted: it reads
 * the annotation only when it builds a channel's handler (knative.dev/eventing v0.49.2
 * pkg/reconciler/inmemorychannel/dispatcher/inmemorychannel.go). After each switch a probe
 * held 400 ms at the front proves the path: the sender waits for it except on `broker-async`.
 */
import { createWriteStream, type WriteStream } from 'node:fs';
import { join } from 'node:path';
import type { KubeConfig, KubernetesObject } from '@kubernetes/client-node';
import { ensureEventingDataPlane } from '../eventing/build.ts';
import { ASYNC_HANDLER } from '../eventing/controllers.ts';
import { startEventingDataPlane, type EventingDataPlane } from '../eventing/dataplane.ts';
import {
  sourceConfigFor,
  startApiServerSourceAdapter,
  type ApiServerSourceSpec,
  type RunningAdapter,
  type SourceConfig,
} from '../eventing/adapter.ts';
import { knativeService } from '../system/functions.ts';
import { sleep } from '../lib/wait.ts';
import { BenchClient } from './client.ts';
import { CHECK_ID_PREFIX, Front, knativeRetries } from './front.ts';
import { childrenRunning } from './measure.ts';

/** The delivery paths, in the order the bench runs them. */
export const DELIVERY_PATHS = ['direct', 'broker', 'broker-async'] as const;
/** One of {@link DELIVERY_PATHS}. */
export type DeliveryPath = (typeof DELIVERY_PATHS)[number];

/** What each path is, for tables and logs. */
export const PATH_LABELS: Record<DeliveryPath, string> = {
  direct: 'adapter → function (no Broker)',
  broker: 'Broker, serial channel (annotation removed)',
  'broker-async': 'Broker as shipped, async-handler channel (concurrent)',
};

/** Row name of a figure measured on `path`: `fan-in N=200 [broker]`. */
export const onPath = (row: string, path: DeliveryPath): string => `${row} [${path}]`;

/** The path of a row name made by {@link onPath}, and the row without it. */
export function splitPath(row: string): { base: string; path: DeliveryPath | undefined } {
  const m = / \[([a-z-]+)\]$/.exec(row);
  const path = DELIVERY_PATHS.find((p) => p === m?.[1]);
  return path ? { base: row.slice(0, m!.index), path } : { base: row, path: undefined };
}

/** How long the function's front holds a probe event. */
const CHECK_HOLD_MS = 400;

/** The functions that receive events. */
export type EventTarget = 'mirror-sync' | 'identity-status';

/** What {@link EventPaths.start} needs. */
export interface EventPathsOptions {
  /** Its logs go to `<dir>/logs/`. */
  dir: string;
  kc: KubeConfig;
  /** Admin kubeconfig file (the data plane's processes, the probes and the Broker's annotations). */
  kubeconfigPath: string;
  /** Rendered manifests: the Broker and Triggers are applied (PingSources left out), the adapter configured from the ApiServerSource. */
  rendered: readonly KubernetesObject[];
  log: (line: string) => void;
  /** The `Authorization` header of a delivery to each function (system.ts `sign`): the fronts add it when the sender did not. */
  sign: (fn: EventTarget) => Promise<string>;
}

/** What {@link EventPaths.connect} needs once the functions run. */
export interface AdapterOptions {
  /** The event source's own kubeconfig file (the adapter). */
  kubeconfig: string;
  /** Each function's first instance (`url`). */
  functions: Record<EventTarget, { url: string }>;
}

/** The adapter, the Broker's data plane and the functions' fronts, and the path in use. */
export class EventPaths {
  path: DeliveryPath = 'direct';
  readonly fronts: Record<EventTarget, Front>;
  /** The Broker's dead-letter sink (`captf-dead-letters`): answers 200, counts by event id. */
  readonly deadLetters: Front;
  private readonly opts: EventPathsOptions;
  private adapterOpts: (AdapterOptions & { source: SourceConfig }) | undefined;
  private readonly admin: BenchClient;
  private readonly logs: Map<string, WriteStream> = new Map();
  private adapter: RunningAdapter | undefined;
  private dp: EventingDataPlane | undefined;
  private asyncHandler = false;
  private checks = 0;

  private constructor(opts: EventPathsOptions, fronts: Record<EventTarget, Front>, deadLetters: Front) {
    this.opts = opts;
    this.admin = new BenchClient(opts.kubeconfigPath, 1);
    this.fronts = fronts;
    this.deadLetters = deadLetters;
  }

  /**
   * Starts the fronts (mirror-sync's dropping) and the Broker's data plane (PingSources left
   * out: their ticks would land inside measured windows; the bench pings the functions itself).
   * {@link connect} starts the adapter once the functions run.
   * @throws Error when a part does not start; what started is stopped first.
   */
  static async start(opts: EventPathsOptions): Promise<EventPaths> {
    const fronts = { 'mirror-sync': await new Front().start(), 'identity-status': await new Front().start() };
    for (const t of ['mirror-sync', 'identity-status'] as const) fronts[t].sign = () => opts.sign(t);
    const paths = new EventPaths(opts, fronts, await new Front().start());
    try {
      opts.log('starting the Broker data plane (ingress, filter, InMemoryChannel dispatcher, mtping)');
      paths.dp = await startEventingDataPlane({
        kubeconfigPath: opts.kubeconfigPath,
        kc: opts.kc,
        objects: opts.rendered.filter((o) => o.kind !== 'PingSource'),
        sinks: {
          'captf-mirror-sync': fronts['mirror-sync'].url,
          'captf-identity-status': fronts['identity-status'].url,
          'captf-dead-letters': paths.deadLetters.url,
        },
        onLog: (c, line) => paths.logTo(`eventing-${c}`, line),
        onBuild: (line) => opts.log(`eventing build: ${line}`),
      });
      // As applied: the manifests ship the async handler (docs/deploy-knative.md, "The delivery default").
      paths.asyncHandler = paths.dp.applied.broker.metadata?.annotations?.[ASYNC_HANDLER] === 'true';
      return paths;
    } catch (err) {
      await paths.stop();
      throw err;
    }
  }

  /**
   * Sets each front's containerConcurrency (its rendered Knative Service's), points identity-status's front at its function and
   * starts the adapter on the `direct` path (mirror-sync's front still dropping until a row
   * says otherwise).
   * @throws Error when the adapter does not start or sends nothing within 60 s.
   */
  async connect(opts: AdapterOptions): Promise<void> {
    const source = this.opts.rendered.find((o) => o.kind === 'ApiServerSource' && o.metadata?.name === 'captf-objects');
    if (!source) throw new Error('the rendered manifests hold no ApiServerSource captf-objects');
    this.adapterOpts = {
      ...opts,
      source: await sourceConfigFor(this.opts.kc, source as unknown as ApiServerSourceSpec),
    };
    for (const t of ['mirror-sync', 'identity-status'] as const) {
      const svc = knativeService(this.opts.rendered, t) as {
        spec?: { template?: { spec?: { containerConcurrency?: number } } };
      };
      this.fronts[t].containerConcurrency = svc?.spec?.template?.spec?.containerConcurrency ?? 0;
    }
    this.fronts['identity-status'].mode = { kind: 'deliver', targets: [opts.functions['identity-status'].url] };
    await this.startAdapter();
  }

  /**
   * The Broker's processes on the event path (ingress, dispatcher, filter; not mtping, idle
   * here), found again each time: a path switch restarts the dispatcher.
   */
  async brokerPids(): Promise<number[]> {
    const bins = await ensureEventingDataPlane();
    return childrenRunning(process.pid, [bins.ingress, bins.dispatcher, bins.filter]);
  }

  /** The sink the adapter sends to on `path`. */
  private sinkOf(path: DeliveryPath): string {
    return path === 'direct' ? `${this.fronts['mirror-sync'].url}/` : this.dp!.brokerUrl;
  }

  private logTo(name: string, line: string): void {
    let s = this.logs.get(name);
    if (!s) this.logs.set(name, (s = createWriteStream(join(this.opts.dir, 'logs', `${name}.log`), { flags: 'a' })));
    s.write(line + '\n');
  }

  /** (Re)starts the adapter with the current path's sink and waits until its watches deliver. */
  private async startAdapter(): Promise<void> {
    await this.adapter?.stop();
    const opts = this.adapterOpts!;
    this.adapter = await startApiServerSourceAdapter({
      kubeconfigPath: opts.kubeconfig,
      sink: this.sinkOf(this.path),
      source: opts.source,
      name: 'captf-objects',
      onLog: (l) => this.logTo('adapter', l),
    });
    await this.adapterDelivering();
  }

  /**
   * Waits until the adapter's watches deliver: it is at-most-once and sends nothing for objects
   * that exist when its first list completes, so a row that changed objects before then would
   * wait for events that never come. Touches a probe namespace until mirror-sync's front
   * receives an event (dropped meanwhile).
   * @throws Error when no event arrives within 60 s.
   */
  private async adapterDelivering(): Promise<void> {
    const front = this.fronts['mirror-sync'];
    const mode = front.mode;
    front.mode = { kind: 'drop' };
    front.resetCounts();
    const deadline = Date.now() + 60_000;
    try {
      for (let i = 0; front.counts.requests === 0; i++) {
        if (Date.now() > deadline)
          throw new Error(`the ApiServerSource adapter sent no event within 60 s (${this.path})`);
        await touchProbeNamespace(this.admin, i);
        await sleep(250);
      }
      await this.settled(500, 60_000);
    } finally {
      front.mode = mode;
    }
  }

  /**
   * Switches to `path` (see the file comment) once nothing is in flight, and proves it.
   * @throws Error when a part does not restart, or the probe shows the sender waiting when it
   *   should not (or the reverse).
   */
  async use(path: DeliveryPath): Promise<void> {
    if (path === this.path) return;
    await this.settled(500, 120_000);
    const wantAsync = path === 'broker-async';
    if (path !== 'direct' && wantAsync !== this.asyncHandler) await this.setAsyncHandler(wantAsync);
    const restartAdapter = (path === 'direct') !== (this.path === 'direct');
    this.path = path;
    if (restartAdapter) await this.startAdapter();
    await this.checkPath();
    this.opts.log(`delivery path: ${PATH_LABELS[path]}`);
  }

  /** Annotates the Broker and its channel, then restarts the dispatcher so it builds the handler again. */
  private async setAsyncHandler(on: boolean): Promise<void> {
    const dp = this.dp!;
    const patch = { metadata: { annotations: { [ASYNC_HANDLER]: on ? 'true' : null } } };
    const { namespace, applied } = dp;
    for (const path of [
      `/apis/eventing.knative.dev/v1/namespaces/${namespace}/brokers/${applied.broker.metadata!.name}`,
      `/apis/messaging.knative.dev/v1/namespaces/${namespace}/inmemorychannels/${applied.channel.metadata!.name}`,
    ])
      await this.admin.call('PATCH', path, patch, 'application/merge-patch+json');
    await dp.restart('dispatcher');
    this.asyncHandler = on;
  }

  /**
   * Sends a probe event to the adapter's sink, held {@link CHECK_HOLD_MS} at mirror-sync's
   * front: the sender must wait for it on `direct` and `broker`, and not on `broker-async`.
   * @throws Error when it does not.
   */
  private async checkPath(): Promise<void> {
    const front = this.fronts['mirror-sync'];
    front.checkHoldMs = CHECK_HOLD_MS;
    const t0 = performance.now();
    const res = await fetch(this.sinkOf(this.path), {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'ce-specversion': '1.0',
        'ce-id': `${CHECK_ID_PREFIX}${process.pid}-${this.checks++}`,
        'ce-source': 'captf-bench/paths',
        'ce-type': 'dev.knative.apiserver.ref.update',
      },
      body: '{}',
      signal: AbortSignal.timeout(30_000),
    });
    await res.arrayBuffer();
    const waited = performance.now() - t0;
    const shouldWait = this.path !== 'broker-async';
    if (!res.ok || waited >= CHECK_HOLD_MS !== shouldWait)
      throw new Error(
        `delivery path ${this.path}: the sender ${waited >= CHECK_HOLD_MS ? 'waited' : 'did not wait'} for a delivery held ${CHECK_HOLD_MS} ms (answer ${res.status} after ${Math.round(waited)} ms)`,
      );
    // On broker-async the held delivery is still running: let it finish before a row counts.
    await sleep(CHECK_HOLD_MS);
  }

  /** Zeroes every front's counters (at the start of a measured window). */
  resetCounts(): void {
    for (const f of [...Object.values(this.fronts), this.deadLetters]) f.resetCounts();
  }

  /**
   * Resolves once no delivery is in flight or still to be retried (an event whose last answer
   * Knative retries and that did not reach the dead-letter sink; the adapter itself never
   * retries) and no request arrived for `quietMs`: the adapter sends the events our own writes
   * cause a little later.
   * @throws Error after `timeoutMs`.
   */
  async settled(quietMs: number, timeoutMs: number): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    const retries = this.path === 'direct' ? () => false : knativeRetries;
    const fronts = Object.values(this.fronts);
    for (;;) {
      const dead = this.deadLetters.ids();
      const inFlight = fronts.reduce((n, f) => n + f.inFlight, 0);
      const pending = fronts.reduce((n, f) => n + f.pending(retries, dead).length, 0);
      const last = Math.max(...fronts.map((f) => f.lastActivity), this.deadLetters.lastActivity);
      if (inFlight + pending === 0 && performance.now() - last >= quietMs) return;
      if (performance.now() > deadline)
        throw new Error(`deliveries not settled after ${timeoutMs} ms (${inFlight} in flight, ${pending} to retry)`);
      await sleep(100);
    }
  }

  /** Stops the adapter, the data plane and the fronts. Idempotent. */
  async stop(): Promise<void> {
    await this.adapter?.stop();
    await this.dp?.stop();
    for (const f of [...Object.values(this.fronts), this.deadLetters]) await f.stop();
    for (const s of this.logs.values()) s.end();
    this.admin.close();
  }
}

/** Creates the namespace `captf-bench-probe`, or changes its labels when it exists. */
async function touchProbeNamespace(admin: BenchClient, i: number): Promise<void> {
  const body = { metadata: { name: 'captf-bench-probe', labels: { 'captf-bench/touch': String(i) } } };
  const r = await admin.raw('POST', '/api/v1/namespaces', body);
  if (r.status === 409)
    await admin.call(
      'PATCH',
      '/api/v1/namespaces/captf-bench-probe',
      { metadata: { labels: body.metadata.labels } },
      'application/merge-patch+json',
    );
}
