/**
 * SPEC §4, §7, §12: a pass — many keys decided at once from lists instead of per-key reads.
 * The resync makes one of every object; an identity's event one scoped to that identity, a
 * namespace's event one scoped to that namespace (keys.ts reads their lists). Each distinct
 * source Secret is read once, every key is decided by the same pure function as one event's
 * key (decide.ts), and only differences are written: revocations first, then the rest; one
 * re-read of the identities and namespaces after all creates; then the conditions that changed —
 * all by act.ts, the one writer. A key whose write conflicted is decided again from fresh reads.
 */
import type { V1Secret } from '@kubernetes/client-node';
import type { LimitFunction } from 'p-limit';
import { isDns1123Subdomain } from '../lib/allowed-namespaces.ts';
import type { Consumer, TerraformClusterIdentity } from '../lib/api.ts';
import { describeError, ignoreNotFound, METADATA, type Clients } from '../lib/kube.ts';
import { ANNOTATION_IDENTITY, isOurs, mirrorName } from '../lib/mirror.ts';
import { telemetry } from '../lib/telemetry.ts';
import {
  act,
  conditionsChange,
  settleWithoutKey,
  type ConsumerResult,
  type KeyOutcome,
  type ReconcileContext,
} from './act.ts';
import {
  addsOwners,
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
import { failedKey, logKey, reconcileResult } from './reconcile.ts';

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
  /** Decides a key again from fresh reads (the scheduler's queue): for a key whose write conflicted. */
  again: (key: MirrorKey) => Promise<KeyOutcome>;
  /**
   * The lists were read for this request (an event): their conditions are written. Otherwise
   * (the resync's lists may be minutes old) a key whose conditions would change is decided again
   * from fresh reads first (act.ts `decide-again`).
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

/** Whether acting on a plan would write anything (the mirror or any consumer's conditions). */
const needsWork = (ctx: ReconcileContext, plan: KeyPlan): boolean =>
  (plan.mirror.action !== 'none' && plan.mirror.action !== 'blocked') || conditionsChange(ctx, plan);

/**
 * Decides every key of the lists and acts (act.ts) on those that need a write. A key whose
 * source cannot be read fails alone (retried): it never holds up another key's revocation. A key
 * whose write conflicted is decided again from fresh reads, through the scheduler's queue.
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
  const plans: KeyPlan[] = [];
  const fresh: KeyPlan[] = [];
  const failed: PassResult[] = [];
  for (const listed of groupByKey(lists)) {
    try {
      const plan = decide(await snapshotOf(lists, listed, readOnce), pass.ctx.kinds);
      // From aged lists, an owner is added only after a fresh read of its consumers (addsOwners).
      if (!pass.fresh && addsOwners(plan, listed.mirror)) fresh.push(plan);
      else if (needsWork(pass.ctx, plan)) plans.push(plan);
    } catch (err) {
      failed.push({ result: logged(pass, failedKey(listed.key, err)) });
    }
  }
  const [clear, inTheWay] = await splitCreatesInTheWay(pass, lists, plans);
  const acted = await act(pass.ctx, clear, { limit: pass.limit, conditions: pass.fresh ? 'write' : 'decide-again' });
  // Keys decided again are bounded like the pass's own work: a resync that finds hundreds of new
  // keys must not send all their reads and writes at once (the API server answers 429).
  const again = (plan: KeyPlan) => pass.limit(() => pass.again(plan.key));
  const done = await Promise.all([
    ...acted.map(async (a) => ({
      plan: a.plan,
      result: 'conflict' in a ? await again(a.plan) : logged(pass, a.outcome),
    })),
    ...[...inTheWay, ...fresh].map(async (plan) => ({ plan, result: await again(plan) })),
  ]);
  return [...done, ...failed];
}

/**
 * A list by label sees only labelled Secrets, so a create decided from it is first checked
 * against whatever stands at the mirror's name (metadata only): a Secret in the way is never sent
 * a create that cannot succeed; its key is decided from fresh reads instead, as an event would.
 * @returns the plans to act on, and those whose create met something at the name.
 */
async function splitCreatesInTheWay(pass: Pass, lists: Lists, plans: KeyPlan[]): Promise<[KeyPlan[], KeyPlan[]]> {
  if (lists.mirrorsByName) return [plans, []];
  const blocked = await Promise.all(
    plans.map((p) =>
      pass.limit(async () => p.mirror.action === 'create' && (await somethingAt(pass.ctx.clients, p.key))),
    ),
  );
  return [plans.filter((_, i) => !blocked[i]), plans.filter((_, i) => blocked[i])];
}

/** Whether any Secret stands at `key`'s mirror name (a metadata-only read: no data is fetched). */
async function somethingAt(clients: Clients, key: MirrorKey): Promise<boolean> {
  const name = mirrorName(key.identity);
  return (
    (await ignoreNotFound(clients.core.readNamespacedSecret({ namespace: key.namespace, name }, METADATA))) !==
    undefined
  );
}

/** Logs a key the pass acted on itself (a key decided again through the queue logs its own line). */
function logged(pass: Pass, r: KeyOutcome): KeyOutcome {
  logKey(pass.ctx.logger, { ...r, durationMs: 0, apiCalls: 0 });
  telemetry().reconcile(reconcileResult(r));
  return r;
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
