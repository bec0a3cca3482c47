/**
 * The one scheduler of mirror-sync's work (SPEC §4, §7, §12): every piece of work has a name — a
 * mirror key, an identity's pass, a namespace's pass, the resync — and goes through one queue of
 * names (queue.ts: one run per name at a time, requests arriving meanwhile folded into one
 * follow-up) to one worker function, {@link Scheduler.process}. The HTTP handler (handler.ts) and
 * `prepare` (prepare.ts) only ask it for work and wait for the result.
 */
import pLimit from 'p-limit';
import type { ConsumerKind } from '../lib/api.ts';
import type { Clients } from '../lib/kube.ts';
import { telemetry, watchQueueDepth, type SpanAttributes } from '../lib/telemetry.ts';
import { contextOf, type ConsumerResult, type KeyOutcome, type ReconcileDeps } from './act.ts';
import { keyString, type MirrorKey } from './decide.ts';
import { listsForIdentity, listsForNamespace, type KeyWork } from './keys.ts';
import type { Seed } from './observe.ts';
import { reconcilePass, settleKeyless, type Lists } from './pass.ts';
import { WorkQueue, type Run, type Scope } from './queue.ts';
import { reconcileKey, reconcileResult, type KeyResult } from './reconcile.ts';
import { resync, type ResyncSummary } from './resync.ts';

/** What a pass did: its keys' results, and the consumers without a key it settled. */
export interface PassDone {
  results: KeyResult[];
  direct: ConsumerResult[];
}

/** The work a name stands for. */
type Target =
  | { kind: 'key'; key: MirrorKey }
  | { kind: 'identity'; name: string }
  | { kind: 'namespace'; name: string }
  | { kind: 'resync' };

type Done = KeyResult | PassDone | ResyncSummary;

/** How the scheduler runs work (from the environment, index.ts). */
export interface SchedulerConfig {
  /** Keys worked on at once within one request or pass. */
  concurrency: number;
  /** `K_SINK`: the resync fans out one event per key to it instead of reconciling in-process. */
  sink?: string | undefined;
  /** The token file whose contents sign each event to `sink`, when it exists ({@link SINK_TOKEN_FILE}). */
  sinkTokenFile?: string | undefined;
}

/** The span of each kind of run. */
const SPAN_NAMES: Record<Target['kind'], string> = {
  key: 'reconcile key',
  identity: 'identity pass',
  namespace: 'namespace pass',
  resync: 'resync',
};

/** What a run's span names: its key, identity or namespace. */
function targetAttributes(target: Target): SpanAttributes {
  switch (target.kind) {
    case 'key':
      return { 'k8s.namespace.name': target.key.namespace, 'captf.identity': target.key.identity };
    case 'identity':
      return { 'captf.identity': target.name };
    case 'namespace':
      return { 'k8s.namespace.name': target.name };
    default:
      return {};
  }
}

/** mirror-sync's work, by name, through one queue; one instance per process. */
export class Scheduler {
  private readonly deps: ReconcileDeps;
  private readonly cfg: SchedulerConfig;
  private readonly queue: WorkQueue<Target, Seed, Done>;

  /** @param deps API access, consumer kinds, logger. @param cfg concurrency and `K_SINK`. */
  constructor(deps: ReconcileDeps, cfg: SchedulerConfig) {
    this.deps = deps;
    this.cfg = cfg;
    this.queue = new WorkQueue((run) => this.process(run));
    // The process's one queue: its depth is what an operator watches drain (lib/telemetry.ts).
    watchQueueDepth(() => this.queue.size);
  }

  /**
   * Reconciles one mirror key (reconcile.ts): at once when the key is idle, else in the run
   * that follows the one under way (queue.ts).
   * @param scope the consumers the request is about (by name), or `all`.
   * @param seed reads made for the key after the request arrived (used when the key is idle).
   */
  key(key: MirrorKey, scope: Scope = 'all', seed?: Seed): Promise<KeyResult> {
    return this.queue.add(`key/${keyString(key)}`, { kind: 'key', key }, scope, seed) as Promise<KeyResult>;
  }

  /** Reconciles keys, a few at a time (`concurrency`); results in the order given. */
  keys(work: readonly KeyWork[]): Promise<KeyResult[]> {
    const limit = pLimit(Math.max(1, this.cfg.concurrency));
    return Promise.all(work.map((w) => limit(() => this.key(w.key, w.scope, w.seed))));
  }

  /** An identity's pass (pass.ts): every namespace where it has consumers or a mirror (SPEC §7). */
  identity(name: string): Promise<PassDone> {
    return this.queue.add(`identity/${name}`, { kind: 'identity', name }) as Promise<PassDone>;
  }

  /** A namespace's pass (pass.ts): every identity used or mirrored there (SPEC §7). */
  namespace(name: string): Promise<PassDone> {
    return this.queue.add(`namespace/${name}`, { kind: 'namespace', name }) as Promise<PassDone>;
  }

  /** The resync (resync.ts, SPEC §12): a pass over everything, one at a time. */
  resync(): Promise<ResyncSummary> {
    return this.queue.add('resync', { kind: 'resync' }) as Promise<ResyncSummary>;
  }

  /** The one worker function: processes one run of a name, in a span named after its kind (lib/telemetry.ts). */
  private process(run: Run<Target, Seed>): Promise<Done> {
    const { target } = run;
    return telemetry().span(SPAN_NAMES[target.kind], { attributes: targetAttributes(target) }, async (span) => {
      const done = await this.run(run);
      if (target.kind === 'key') {
        const r = done as KeyResult;
        span.set({
          'captf.result': reconcileResult(r),
          'captf.mirror_action': r.mirrorAction,
          'captf.api_calls': r.apiCalls,
        });
        if (r.error) span.fail(r.error);
      }
      return done;
    });
  }

  /** Processes one run of a name. */
  private run({ target, scope, seed }: Run<Target, Seed>): Promise<Done> {
    switch (target.kind) {
      case 'key':
        return reconcileKey(this.deps, target.key, scope, seed);
      case 'identity':
        return this.pass((clients, kinds) => listsForIdentity(clients, kinds, target.name));
      case 'namespace':
        return this.pass((clients, kinds) => listsForNamespace(clients, kinds, target.name));
      case 'resync':
        return resync(this.deps, { ...this.cfg, again: this.again });
    }
  }

  /** A pass of lists read for this request: its keys decided and acted on, consumers without a key settled. */
  private async pass(lists: (clients: Clients, kinds: readonly ConsumerKind[]) => Promise<Lists>): Promise<PassDone> {
    const ctx = contextOf(this.deps);
    const pass = { ctx, limit: pLimit(Math.max(1, this.cfg.concurrency)), again: this.again, fresh: true };
    const listed = await lists(ctx.clients, ctx.kinds);
    const direct = await settleKeyless(pass, listed.consumers);
    const passed = await reconcilePass(pass, listed);
    return { results: passed.map(({ result }) => ({ durationMs: 0, apiCalls: 0, ...result })), direct };
  }

  /** A key decided again from fresh reads, for a pass whose write to it conflicted. */
  private readonly again = (key: MirrorKey): Promise<KeyOutcome> => this.key(key);
}
