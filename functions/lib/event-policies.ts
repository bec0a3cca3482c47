/**
 * SPEC §12: the EventPolicies that may let a sender in beside a function's own Triggers —
 * the shell around senders.ts `policySenders`. The function's namespace's EventPolicies
 * (`eventing.knative.dev/v1alpha1`) are listed only when a verified sender is not one of the
 * function's own, and the list is reused for {@link POLICY_TTL_MS}, so a narrowed policy takes
 * effect within that time and a stranger with a valid token costs at most one list per period.
 */
import type { KubeConfig } from '@kubernetes/client-node';
import { isForbidden, isNotFound, makeClients, type CallCounter } from './kube.ts';
import type { Logger } from './log.ts';
import { policySenders, type EventPolicyLike, type PolicyTarget } from './senders.ts';

/** How long a list of EventPolicies is reused, in ms: how late a narrowed policy may take effect. */
export const POLICY_TTL_MS = 5_000;

/** How long a failed list is answered again without asking, in ms: a struggling API server is not asked once per stranger's delivery. */
export const FAILURE_TTL_MS = 1_000;

/** The EventPolicies resource (Knative Eventing 1.15 and later). */
const POLICIES = { group: 'eventing.knative.dev', version: 'v1alpha1', plural: 'eventpolicies' } as const;

/** The senders one function's EventPolicies add, read from the API server and reused a few seconds. */
export class EventPolicySenders {
  private readonly kc: KubeConfig;
  private readonly target: PolicyTarget;
  private readonly logger: Logger;
  private readonly ttlMs: number;
  private last: { at: number; senders: string[] } | undefined;
  /** The last failed list, answered again for {@link FAILURE_TTL_MS} without asking. */
  private failed: { at: number; err: unknown } | undefined;
  private pending: Promise<string[]> | undefined;

  /**
   * @param kc API access that may `list` eventpolicies in the target's namespace.
   * @param target the object the function's audience names (senders.ts `targetOfAudience`).
   * @param ttlMs how long a list is reused (default {@link POLICY_TTL_MS}).
   */
  constructor(kc: KubeConfig, target: PolicyTarget, logger: Logger, ttlMs = POLICY_TTL_MS) {
    this.kc = kc;
    this.target = target;
    this.logger = logger;
    this.ttlMs = ttlMs;
  }

  /**
   * The subjects the target's Ready EventPolicies let in. No EventPolicy resource (Eventing
   * without it) means none; so does a list the function may not make, which it logs: a sender
   * a policy names is then refused, never let in unchecked. Concurrent callers share one list.
   * @throws the API error of any other failed list (the delivery is answered 503 and retried),
   *   also for {@link FAILURE_TTL_MS} after it without a new list.
   */
  async senders(counter: CallCounter): Promise<string[]> {
    if (this.last && Date.now() - this.last.at < this.ttlMs) return this.last.senders;
    if (this.failed && Date.now() - this.failed.at < FAILURE_TTL_MS) throw this.failed.err;
    this.pending ??= this.list(counter).finally(() => (this.pending = undefined));
    return this.pending;
  }

  private async list(counter: CallCounter): Promise<string[]> {
    const { custom } = makeClients(this.kc, counter);
    let items: EventPolicyLike[];
    try {
      const list = (await custom.listNamespacedCustomObject({ ...POLICIES, namespace: this.target.namespace })) as {
        items?: EventPolicyLike[];
      };
      items = list.items ?? [];
    } catch (err) {
      if (!isNotFound(err) && !isForbidden(err)) {
        this.failed = { at: Date.now(), err };
        throw err;
      }
      if (isForbidden(err))
        this.logger.warn('event policies unreadable', {
          detail: `may not list eventpolicies in ${this.target.namespace}: only the configured senders are let in`,
        });
      items = [];
    }
    const { senders, skipped } = policySenders(items, this.target);
    if (skipped.length) this.logger.info('event policies skipped', { skipped });
    this.last = { at: Date.now(), senders };
    return senders;
  }
}
