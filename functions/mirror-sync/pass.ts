/**
 * SPEC §4, §7, §12: a pass — many keys decided at once from lists instead of per-key reads.
 * The resync makes one of every object; an identity's event one scoped to that identity, a
 * namespace's event one scoped to that namespace (keys.ts reads their lists). Each distinct
 * source Secret is read once, every key is decided by the same pure function as one event's
 * key (decide.ts), and only differences are written: revocations first, then the rest; one
 * re-read of the identities and namespaces after all creates; then the conditions that changed.
 * A key whose mirror changed since the lists goes through the key queue, decided from fresh reads.
 */
import type { V1Secret } from '@kubernetes/client-node';
import type { LimitFunction } from 'p-limit';
import { isDns1123Subdomain } from '../lib/allowed-namespaces.ts';
import type { Consumer, TerraformClusterIdentity } from '../lib/api.ts';
import { describeError, ignoreNotFound, isConflict, METADATA, type Clients } from '../lib/kube.ts';
import { ANNOTATION_IDENTITY, isOurs, mirrorName } from '../lib/mirror.ts';
import {
  decide,
  keylessPlan,
  keyString,
  mayHoldMirror,
  type MirrorKey,
  type NamespaceState,
  type KeyPlan,
  type Snapshot,
  type SourceRead,
} from './decide.ts';
import { EXISTS, readSource } from './observe.ts';
import type { KeyQueue } from './queue.ts';
import {
  conditionsStep,
  failedKey,
  isWritten,
  logKey,
  revokedMeanwhile,
  settleWithoutKey,
  writeStep,
  type ConsumerResult,
  type KeyOutcome,
  type ReconcileContext,
  type Written,
} from './reconcile.ts';
import { conditionPlan } from './status.ts';

/** What a pass decides from: lists (mirrors listed before the consumers, SPEC §12). */
export interface Lists {
  mirrors: V1Secret[];
  consumers: Consumer[];
  identities: Map<string, TerraformClusterIdentity>;
  /**
   * Namespaces by name (one absent from a map does not exist); undefined when not read because
   * no identity in the lists selects by label: each key's namespace then holds one of its objects.
   */
  namespaces: Map<string, NamespaceState> | undefined;
  /** The mirrors were listed by name, so a Secret in a mirror's way is among them (else by label). */
  mirrorsByName?: boolean;
}

/** What one pass works with. */
export interface Pass {
  ctx: ReconcileContext;
  /** Keys acted on at once. */
  limit: LimitFunction;
  /** The process's key queue: keys decided again from fresh reads go through it. */
  queue: KeyQueue;
  /**
   * The lists were read for this request (an event): keys with only conditions to change are
   * written from them. Otherwise (the resync's lists may be minutes old, and a status write
   * from them would mostly meet its resourceVersion precondition failing) such keys are decided
   * again from fresh reads.
   */
  fresh: boolean;
}

/** One key's plan and what acting on it did. */
interface PassResult {
  /** Absent when the key failed before it was decided (its source could not be read). */
  plan?: KeyPlan;
  result: KeyOutcome;
}

/** A consumer with no key: cluster-scoped, or naming no usable identity (SPEC §4). */
const isKeyless = (c: Consumer): boolean => {
  const id = c.spec?.identityRef?.name;
  return !c.metadata.namespace || !id || !isDns1123Subdomain(id);
};

/** One key's listed consumers and mirror. */
interface Listed {
  key: MirrorKey;
  consumers: Consumer[];
  mirror: V1Secret | undefined;
}

/** Groups consumers and mirrors by key (consumers without a key are left out). */
function groupByKey(lists: Lists): Listed[] {
  const keys = new Map<string, Listed>();
  const entry = (key: MirrorKey) =>
    keys.get(keyString(key)) ??
    keys.set(keyString(key), { key, consumers: [], mirror: undefined }).get(keyString(key))!;
  for (const c of lists.consumers) {
    if (!isKeyless(c))
      entry({ namespace: c.metadata.namespace!, identity: c.spec!.identityRef!.name! }).consumers.push(c);
  }
  for (const m of lists.mirrors) {
    const key = mirrorKeyOf(m, lists.identities) ?? inTheWay(m, lists);
    if (key) entry(key).mirror = m;
  }
  return [...keys.values()];
}

/** The keys the lists hold (namespace × identity with a consumer or a mirror). */
export const keysOf = (lists: Lists): MirrorKey[] => groupByKey(lists).map((l) => l.key);

/** The key of a listed Secret that is an identity's mirror (SPEC §3: ours, at that identity's mirror name). */
function mirrorKeyOf(m: V1Secret, identities: Lists['identities']): MirrorKey | undefined {
  const id = m.metadata?.annotations?.[ANNOTATION_IDENTITY];
  // A hand-made Secret's annotation is no identity's name unless it could be one.
  if (!id || !isDns1123Subdomain(id) || m.metadata?.name !== mirrorName(id)) return undefined;
  return isOurs(m, id, identities.get(id)?.spec?.secretRef)
    ? { namespace: m.metadata.namespace!, identity: id }
    : undefined;
}

/**
 * A Secret listed by name that is not ours but stands at a listed identity's mirror name: the
 * key's own state (decided `MirrorFailed`, never written), as a fresh read would find it.
 */
function inTheWay(m: V1Secret, lists: Lists): MirrorKey | undefined {
  if (!lists.mirrorsByName || !m.metadata?.namespace) return undefined;
  const identity = [...lists.identities.keys()].find((id) => m.metadata?.name === mirrorName(id));
  return identity ? { namespace: m.metadata.namespace, identity } : undefined;
}

/** A key's snapshot from the lists (its source read once per pass, on first need). */
async function snapshotOf(
  lists: Lists,
  { key, consumers, mirror }: Listed,
  readOnce: (i: TerraformClusterIdentity) => Promise<SourceRead>,
): Promise<Snapshot> {
  const identity = lists.identities.get(key.identity);
  const namespace = lists.namespaces ? lists.namespaces.get(key.namespace) : EXISTS;
  return {
    key,
    identity,
    namespace,
    source: mayHoldMirror(identity, key, namespace) ? await readOnce(identity) : undefined,
    mirror,
    consumers,
    scope: 'all',
  };
}

/** Whether acting on a plan would write anything (mirror or any consumer's conditions). */
function needsWork(plan: KeyPlan, now: Date): boolean {
  if (plan.mirror.action !== 'none' && plan.mirror.action !== 'blocked') return true;
  return plan.consumers.some((p) => conditionPlan(p.consumer, p.conditions, now).changed);
}

/** A plan that takes credentials away (SPEC §7): acted on before every other. */
const isRevocation = (p: KeyPlan): boolean => p.mirror.action === 'delete' && p.mirror.why !== 'unused';

/**
 * Decides every key of the lists and acts on those that need a write. A key whose source
 * cannot be read fails alone (retried): it never holds up another key's revocation.
 * @returns each acted-on key's plan (absent for a key that failed before deciding) and result;
 *   keys that needed nothing are left out. Never throws for one key's failure.
 */
export async function reconcilePass(pass: Pass, lists: Lists): Promise<PassResult[]> {
  const sources = new Map<string, Promise<SourceRead>>();
  const readOnce = (i: TerraformClusterIdentity) => {
    const id = `${i.spec.secretRef.namespace}/${i.spec.secretRef.name}`;
    if (!sources.has(id)) sources.set(id, readSource(pass.ctx.clients, i));
    return sources.get(id)!;
  };
  const now = pass.ctx.now();
  const plans: KeyPlan[] = [];
  const failed: PassResult[] = [];
  for (const listed of groupByKey(lists)) {
    try {
      const plan = decide(await snapshotOf(lists, listed, readOnce), pass.ctx.kinds);
      if (needsWork(plan, now)) plans.push(plan);
    } catch (err) {
      failed.push({ result: logged(pass, failedKey(listed.key, err)) });
    }
  }
  const first = plans.filter(isRevocation);
  const rest = plans.filter((p) => !isRevocation(p));
  const write = (plan: KeyPlan) => pass.limit(() => writeListed(pass, lists, plan));
  // Revocations first (SPEC §7): credentials leave before anything else is written.
  const steps = [...(await Promise.all(first.map(write))), ...(await Promise.all(rest.map(write)))];
  const created = steps.filter((s): s is Written => s !== 'again' && isWritten(s) && s.action === 'created');
  const revoked = await recheck(pass, created);
  const ordered = [...first, ...rest];
  const acted = await Promise.all(
    steps.map((s, i) =>
      pass.limit(async () => ({ plan: ordered[i]!, result: await finish(pass, ordered[i]!, s, revoked) })),
    ),
  );
  return [...acted, ...failed];
}

/** The keys a revocation landed on while they were created (one re-read for all); none when nothing was created. */
async function recheck(pass: Pass, created: readonly Written[]): Promise<Set<string> | Error> {
  if (!created.length) return new Set();
  try {
    return await revokedMeanwhile(
      pass.ctx.clients,
      created.map((w) => w.plan.key),
    );
  } catch (err) {
    return err as Error;
  }
}

/** A listed key's mirror write; `again` when the key must be decided again from fresh reads. */
async function writeListed(pass: Pass, lists: Lists, plan: KeyPlan): Promise<Written | KeyOutcome | 'again'> {
  const onlyConditions = plan.mirror.action === 'none' || plan.mirror.action === 'blocked';
  if (onlyConditions)
    return pass.fresh ? { plan, action: plan.mirror.action === 'none' ? 'unchanged' : 'blocked' } : 'again';
  try {
    // A list by label sees only labelled Secrets: a create is first checked against whatever
    // stands at the mirror's name (metadata only), so a Secret in the way is never sent a
    // create that cannot succeed; the key is decided from fresh reads instead, as an event would.
    if (plan.mirror.action === 'create' && !lists.mirrorsByName && (await somethingAt(pass.ctx.clients, plan.key)))
      return 'again';
    return await writeStep(pass.ctx, plan);
  } catch (err) {
    // The mirror (or a consumer) changed since the list: decided again from fresh reads.
    return isConflict(err) ? 'again' : failedKey(plan.key, err);
  }
}

/** A listed key after the writes: its conditions, its fresh reconcile, or its outcome as it is. */
async function finish(
  pass: Pass,
  plan: KeyPlan,
  step: Written | KeyOutcome | 'again',
  revoked: Set<string> | Error,
): Promise<KeyOutcome> {
  if (step === 'again') return pass.queue.run(plan.key, 'all');
  if (!isWritten(step)) return logged(pass, step);
  if (step.action === 'created') {
    if (revoked instanceof Error) return logged(pass, failedKey(plan.key, revoked));
    // A revocation landed meanwhile: observing again decides the delete.
    if (revoked.has(keyString(plan.key))) return pass.queue.run(plan.key, 'all');
  }
  try {
    return logged(pass, await conditionsStep(pass.ctx, step));
  } catch (err) {
    // A consumer changed since the list (its status write's precondition failed): decide again.
    if (isConflict(err)) return pass.queue.run(plan.key, 'all');
    return logged(pass, failedKey(plan.key, err));
  }
}

/** Logs a key the pass acted on itself (a key run through the queue logs its own line). */
function logged(pass: Pass, r: KeyOutcome): KeyOutcome {
  logKey(pass.ctx.logger, { ...r, durationMs: 0, apiCalls: 0 });
  return r;
}

/** Whether any Secret stands at `key`'s mirror name (a metadata-only read: no data is fetched). */
async function somethingAt(clients: Clients, key: MirrorKey): Promise<boolean> {
  const name = mirrorName(key.identity);
  return (
    (await ignoreNotFound(clients.core.readNamespacedSecret({ namespace: key.namespace, name }, METADATA))) !==
    undefined
  );
}

/**
 * Settles the conditions of consumers without a key (SPEC §4); a failed write is returned
 * as a retried result, it never aborts the pass.
 */
export async function settleKeyless(pass: Pass, consumers: readonly Consumer[]): Promise<ConsumerResult[]> {
  return Promise.all(
    consumers.filter(isKeyless).map((c) =>
      pass.limit(async (): Promise<ConsumerResult> => {
        try {
          return await settleWithoutKey(pass.ctx, c);
        } catch (err) {
          const object = `${c.metadata.namespace ?? ''}/${c.metadata.name}`;
          pass.ctx.logger.warn('could not settle a consumer without a key', { object, error: describeError(err) });
          const message = `its conditions could not be written: ${describeError(err)}`;
          return {
            object,
            kind: c.kind ?? '',
            outcome: keylessPlan(c).outcome,
            reason: 'WriteFailed',
            message,
            retry: true,
          };
        }
      }),
    ),
  );
}
