/**
 * The pure core of mirror-sync (SPEC §3, §4, §6, §16): one snapshot of a mirror key in, one
 * plan out — what to do with the mirror, and the conditions and outcome of every consumer
 * observed. Events, `prepare` and the resync all decide here; only how the snapshot is
 * gathered differs. No I/O.
 */
import { isNamespaceAllowed } from '../lib/allowed-namespaces.ts';
import type { Consumer, ConsumerKind, OwnerReference, TerraformClusterIdentity } from '../lib/api.ts';
import type { ConditionInput } from '../lib/conditions.ts';
import {
  ANNOTATION_IDENTITY,
  ANNOTATION_SOURCE_HASH,
  LABEL_MANAGED,
  LABEL_MIRRORED,
  LABEL_MIRROR_OF,
  desiredMirror,
  groupOf,
  isCurrent,
  isOurs,
  isReservedSourceName,
  mirrorName,
  mirrorOfLabel,
  ownerReferenceFor,
  reservedSourceMessage,
  type SecretData,
  type SecretLike,
} from '../lib/mirror.ts';

/** A mirror key (SPEC §4): the mirror of `identity` in `namespace`, and its consumers there. */
export interface MirrorKey {
  namespace: string;
  identity: string;
}

/** `<namespace>/<identity>`: a key as a map key. */
export const keyString = (k: MirrorKey): string => `${k.namespace}/${k.identity}`;

/** A consumer named without its UID: kind (with group) and name, in the key's namespace. */
export interface ConsumerName {
  apiVersion: string;
  kind: string;
  name: string;
}

/** What the source Secret read found. */
export type SourceRead =
  { state: 'found'; data: SecretData; hash: string } | { state: 'missing' | 'unreadable'; message: string };

/** What a decision needs of a namespace: its labels (SPEC §2), and whether it is being deleted. */
export interface NamespaceState {
  labels?: Record<string, string> | undefined;
  /** Terminating: the API server refuses new objects there, so no mirror can be created. */
  terminating?: boolean;
}

/** Everything a decision needs, read fresh from the API server (observe.ts, resync.ts). */
export interface Snapshot {
  key: MirrorKey;
  /** Undefined: no such identity. */
  identity: TerraformClusterIdentity | undefined;
  /** Undefined: no such namespace. */
  namespace: NamespaceState | undefined;
  /** The source Secret; undefined when it was not read (the identity or namespace already decides). */
  source: SourceRead | undefined;
  /** The Secret holding the mirror's name, if any (with data and resourceVersion). */
  mirror: ReadMirror | undefined;
  /** Consumers in the namespace whose `spec.identityRef.name` is the identity (deleting ones included). */
  consumers: Consumer[];
  /**
   * `all`: `consumers` is every such consumer (a list). Otherwise only these consumers were
   * looked at (by name): any of them missing from `consumers` is gone or uses another
   * identity, and the mirror's other owner references are left as they are.
   */
  scope: 'all' | ConsumerName[];
}

/** How a consumer's reconcile ended (SPEC §4, §16); `no-identity-ref`: it names no identity, so has no key. */
export type ConsumerOutcome =
  | 'mirrored'
  | 'identity-not-found'
  | 'not-allowed'
  | 'source-not-found'
  | 'source-is-mirror'
  | 'mirror-failed'
  | 'no-identity-ref';

/** One consumer's part of a plan. */
export interface ConsumerPlan {
  consumer: Consumer;
  /** The owned conditions it should carry (others' condition types are never touched). */
  conditions: ConditionInput[];
  outcome: ConsumerOutcome;
  /** Condition reason (SPEC §16) summarising the outcome. */
  reason: string;
  /** Human-readable; names objects, never Secret data. */
  message: string;
  /**
   * True when a retry may change the outcome (a CloudEvent is answered 5xx). Decisions never
   * set it: a missing identity or source, or a namespace not allowed, waits for a person
   * (SPEC §4); only failures of the act step do.
   */
  retry: boolean;
}

/** The mirror as read: what a write to it names and is guarded by (its UID, its resourceVersion). */
type ReadMirror = SecretLike & { metadata?: { uid?: string } };

/**
 * SPEC §4 step 3: what to do with the mirror Secret. `merge`: only owner references change (added
 * by UID, removed by UID), sent as a strategic-merge patch the API server applies to whatever is
 * stored; adding only, it commutes with every other instance's write and carries no
 * resourceVersion (a removal carries the one it was read at: lib/mirror.ts `ownerReferencesPatch`).
 * `update` (data, labels, a reference whose fields must change) and `delete` carry the
 * resourceVersion they were read at; a `create` is refused when anything holds the name.
 */
export type MirrorAction =
  | { action: 'create'; body: SecretLike }
  | { action: 'update'; body: SecretLike }
  | {
      action: 'merge';
      /** The mirror as read; its UID guards the patch (a mirror recreated meanwhile is refused). */
      secret: ReadMirror;
      /** Owner references to add (UIDs the mirror does not hold), in order. */
      add: OwnerReference[];
      /** UIDs of owner references to remove. */
      remove: string[];
    }
  | {
      action: 'delete';
      secret: ReadMirror;
      /** `revoked`: the namespace lost access; `unused`: no consumer left; `inert`: its identity names a mirror (SPEC §3). */
      why: 'revoked' | 'unused' | 'inert';
    }
  | { action: 'none' }
  | { action: 'blocked'; message: string };

/** The whole decision for one key. */
export interface KeyPlan {
  key: MirrorKey;
  mirror: MirrorAction;
  consumers: ConsumerPlan[];
  /** Source hash when the mirror is (or will be, once written) current. */
  sourceHash?: string | undefined;
}

/** Whether an owner reference points at a configured consumer kind (any version). */
function isConsumerKindRef(
  kinds: readonly Pick<ConsumerKind, 'group' | 'kind'>[],
  ref: Pick<OwnerReference, 'apiVersion' | 'kind'>,
): boolean {
  return kinds.some((k) => k.group === groupOf(ref.apiVersion) && k.kind === ref.kind);
}

const ownerId = (r: Pick<OwnerReference, 'apiVersion' | 'kind' | 'name'>): string =>
  `${groupOf(r.apiVersion)}/${r.kind}/${r.name}`;

/**
 * SPEC §3, §6: the mirror's owner references after this decision. References of kinds that
 * are not consumers are kept as they are. With scope `all`, consumer references are exactly
 * the live consumers (current UIDs, in their existing order, new ones appended); otherwise
 * only the looked-at consumers' references change.
 */
export function desiredOwnerReferences(
  existing: readonly OwnerReference[],
  snapshot: Pick<Snapshot, 'consumers' | 'scope'>,
  kinds: readonly ConsumerKind[],
): OwnerReference[] {
  const live = new Map(snapshot.consumers.map((c) => [ownerId(ownerReferenceFor(c)), ownerReferenceFor(c)]));
  const lookedAt = snapshot.scope === 'all' ? undefined : new Set(snapshot.scope.map(ownerId));
  const out: OwnerReference[] = [];
  const placed = new Set<string>();
  for (const r of existing) {
    const kept = keptReference(r, { kinds, live, lookedAt, placed });
    if (kept) out.push(kept);
  }
  for (const [id, ref] of live) if (!placed.has(id)) out.push(ref);
  return out;
}

/**
 * What an existing owner reference becomes: itself (another kind, or a consumer not looked
 * at), the live consumer's exact reference (once per consumer), or nothing (a former user).
 */
function keptReference(
  r: OwnerReference,
  s: {
    kinds: readonly ConsumerKind[];
    live: Map<string, OwnerReference>;
    lookedAt: Set<string> | undefined;
    placed: Set<string>;
  },
): OwnerReference | undefined {
  if (!isConsumerKindRef(s.kinds, r)) return r;
  const id = ownerId(r);
  const want = s.live.get(id);
  if (!want) return s.lookedAt && !s.lookedAt.has(id) ? r : undefined;
  if (s.placed.has(id)) return undefined;
  s.placed.add(id);
  const exact = r.uid === want.uid && r.apiVersion === want.apiVersion && !r.controller && !r.blockOwnerDeletion;
  return exact ? r : want;
}

const sameRefs = (a: readonly OwnerReference[], b: readonly OwnerReference[]): boolean =>
  a.length === b.length &&
  a.every(
    (r, i) =>
      r.uid === b[i]!.uid &&
      r.kind === b[i]!.kind &&
      r.name === b[i]!.name &&
      r.apiVersion === b[i]!.apiVersion &&
      !r.controller === !b[i]!.controller &&
      !r.blockOwnerDeletion === !b[i]!.blockOwnerDeletion,
  );

/** The Secret with updated metadata (labels, hash annotation, owner references) and data. */
function updatedMirror(
  existing: SecretLike,
  identity: string,
  refs: OwnerReference[],
  source: Extract<SourceRead, { state: 'found' }> | undefined,
): SecretLike {
  const md = existing.metadata ?? {};
  return {
    ...existing,
    metadata: {
      ...md,
      labels: {
        ...md.labels,
        [LABEL_MIRRORED]: 'true',
        [LABEL_MANAGED]: 'true',
        [LABEL_MIRROR_OF]: mirrorOfLabel(identity),
      },
      annotations: {
        ...md.annotations,
        [ANNOTATION_IDENTITY]: identity,
        ...(source ? { [ANNOTATION_SOURCE_HASH]: source.hash } : {}),
      },
      ownerReferences: refs,
    },
    data: source ? { ...source.data } : (existing.data ?? {}),
  };
}

/** Whether everything but the owner references is as `updatedMirror` would write it (labels, hash, data). */
function contentCurrent(
  existing: SecretLike,
  identity: string,
  source: Extract<SourceRead, { state: 'found' }> | undefined,
): boolean {
  const labels = existing.metadata?.labels ?? {};
  return (
    labels[LABEL_MIRRORED] === 'true' &&
    labels[LABEL_MANAGED] === 'true' &&
    labels[LABEL_MIRROR_OF] === mirrorOfLabel(identity) &&
    !(source && !isCurrent(existing, source.hash))
  );
}

/** Whether `updatedMirror` would change anything a reader sees. */
function needsUpdate(
  existing: SecretLike,
  identity: string,
  refs: OwnerReference[],
  source: Extract<SourceRead, { state: 'found' }> | undefined,
): boolean {
  return !contentCurrent(existing, identity, source) || !sameRefs(existing.metadata?.ownerReferences ?? [], refs);
}

/**
 * The owner-reference change from `existing` to `desired` as adds and removals by UID — the
 * form a strategic-merge patch keyed by `uid` expresses — or undefined when it is not one: a
 * reference whose UID stays but whose other fields must change (apiVersion, `controller`,
 * `blockOwnerDeletion`), or stored references that repeat a UID (kubernetes/kubernetes#96065:
 * only a whole write makes such a list exact).
 */
export function ownerReferenceChange(
  existing: readonly OwnerReference[],
  desired: readonly OwnerReference[],
): { add: OwnerReference[]; remove: string[] } | undefined {
  const stored = new Map(existing.map((r) => [r.uid, r]));
  if (stored.size !== existing.length) return undefined;
  const wanted = new Set(desired.map((r) => r.uid));
  const add: OwnerReference[] = [];
  for (const r of desired) {
    const s = stored.get(r.uid);
    if (!s) add.push(r);
    else if (!sameRefs([s], [r])) return undefined;
  }
  return { add, remove: existing.filter((r) => !wanted.has(r.uid)).map((r) => r.uid) };
}

/**
 * The write that brings an existing mirror to `refs` (and the source's data, when read): a
 * merge when only owner references are added or removed, else a whole update carrying the
 * resourceVersion it was read at. Call only when {@link needsUpdate}.
 */
function changeOf(
  existing: ReadMirror,
  identity: string,
  refs: OwnerReference[],
  source: Extract<SourceRead, { state: 'found' }> | undefined,
): MirrorAction {
  const change = contentCurrent(existing, identity, source)
    ? ownerReferenceChange(existing.metadata?.ownerReferences ?? [], refs)
    : undefined;
  if (change) return { action: 'merge', secret: existing, ...change };
  return { action: 'update', body: updatedMirror(existing, identity, refs, source) };
}

/** What every branch of {@link decide} shares: the snapshot and the owner references it leads to. */
interface Ctx {
  snapshot: Snapshot;
  key: MirrorKey;
  name: string;
  existing: Snapshot['mirror'];
  /** The Secret at the mirror's name is our mirror (SPEC §3, {@link isOurs}). */
  ours: boolean;
  refs: OwnerReference[];
  /** Some owner reference points at a consumer kind (the mirror has users). */
  users: boolean;
  /** Some owner reference points at a kind this instance does not know. */
  foreign: boolean;
}

const gen = (c: Consumer) => (c.metadata.generation === undefined ? {} : { observedGeneration: c.metadata.generation });

/** One plan per consumer, from a function of the consumer. */
const each = (ctx: Ctx, f: (c: Consumer) => Omit<ConsumerPlan, 'consumer'>): ConsumerPlan[] =>
  ctx.snapshot.consumers.map((c) => ({ consumer: c, ...f(c) }));

/**
 * SPEC §12: were our conditions on the consumer decided for its current generation? Then its
 * spec — and so its key — is what we last decided, and an update event about it is the echo
 * of our own status write (or of another writer's, or a metadata change): nothing to reconcile.
 * The conditions that carry the decision are `IdentityAllowed` (always written for a consumer
 * with a key) and, when present, `CredentialsMirrored`. Deleting a custom resource bumps its
 * generation, so a consumer that starts deleting is never taken for decided.
 */
export function decidedForGeneration(consumer: Consumer): boolean {
  const generation = consumer.metadata.generation;
  const ours = (consumer.status?.conditions ?? []).filter(
    (c) => c.type === 'IdentityAllowed' || c.type === 'CredentialsMirrored',
  );
  return (
    generation !== undefined &&
    ours.some((c) => c.type === 'IdentityAllowed') &&
    ours.every((c) => c.observedGeneration === generation)
  );
}

/** SPEC §2: does the identity allow the key's namespace (which must exist; undefined = absent)? */
function namespaceAllows(
  identity: TerraformClusterIdentity,
  key: MirrorKey,
  namespace: Snapshot['namespace'],
): boolean {
  return (
    namespace !== undefined &&
    isNamespaceAllowed(identity.spec?.allowedNamespaces, { name: key.namespace, labels: namespace.labels })
  );
}

/**
 * SPEC §2, §3: may the identity have a mirror in the key's namespace? Only when it exists, is
 * not inert (its source is no mirror) and allows the namespace. Where not, its mirror goes
 * first (SPEC §7) and its source is not worth reading.
 */
export function mayHoldMirror(
  identity: TerraformClusterIdentity | undefined,
  key: MirrorKey,
  namespace: Snapshot['namespace'],
): identity is TerraformClusterIdentity {
  return (
    identity !== undefined &&
    !isReservedSourceName(identity.spec?.secretRef?.name) &&
    namespaceAllows(identity, key, namespace)
  );
}

/**
 * SPEC §4 step 2: decides one key.
 * @param snapshot fresh reads of the key (see {@link Snapshot}).
 * @param kinds configured consumer kinds (owner references of other kinds are left alone).
 * @returns the plan: one mirror action and every observed consumer's conditions and outcome.
 */
export function decide(snapshot: Snapshot, kinds: readonly ConsumerKind[]): KeyPlan {
  const ctx = decisionContext(snapshot, kinds);
  const { key, identity } = snapshot;
  if (!identity) return identityMissing(ctx);
  if (!namespaceAllows(identity, key, snapshot.namespace)) return notAllowed(ctx);
  if (isReservedSourceName(identity.spec?.secretRef?.name)) return inert(ctx, identity);
  if (ctx.existing && !ctx.ours) return blocked(ctx, inTheWay(ctx));
  const source = snapshot.source;
  if (source?.state !== 'found') return sourceMissing(ctx, identity, source);
  return mirrored(ctx, source);
}

function decisionContext(snapshot: Snapshot, kinds: readonly ConsumerKind[]): Ctx {
  const { key } = snapshot;
  const existing = snapshot.mirror;
  const refs = desiredOwnerReferences(existing?.metadata?.ownerReferences ?? [], snapshot, kinds);
  return {
    snapshot,
    key,
    name: mirrorName(key.identity),
    existing,
    ours: existing !== undefined && isOurs(existing, key.identity, snapshot.identity?.spec?.secretRef),
    refs,
    users: refs.some((r) => isConsumerKindRef(kinds, r)),
    foreign: refs.some((r) => !isConsumerKindRef(kinds, r)),
  };
}

/** The mirror, if ours, is deleted: it must not outlive the permission (SPEC §7). */
const revoke = (ctx: Ctx): MirrorAction =>
  ctx.ours ? { action: 'delete', secret: ctx.existing!, why: 'revoked' } : { action: 'none' };

function identityMissing(ctx: Ctx): KeyPlan {
  const message = `TerraformClusterIdentity ${ctx.key.identity} does not exist`;
  return {
    key: ctx.key,
    mirror: revoke(ctx),
    consumers: each(ctx, (c) => ({
      outcome: 'identity-not-found',
      reason: 'IdentityNotFound',
      message,
      retry: false,
      conditions: [{ type: 'IdentityAllowed', status: 'False', reason: 'IdentityNotFound', message, ...gen(c) }],
    })),
  };
}

function notAllowed(ctx: Ctx): KeyPlan {
  const { key } = ctx;
  // The same words before and after the mirror is gone: a message that changed would be a
  // new condition write and a second Event for one revocation.
  const message = `namespace ${key.namespace} is not allowed by TerraformClusterIdentity ${key.identity} (spec.allowedNamespaces); no mirror is kept there`;
  return {
    key,
    mirror: revoke(ctx),
    consumers: each(ctx, (c) => notAllowedPlan(c, message)),
  };
}

/**
 * A consumer's part when its namespace is not allowed: `IdentityAllowed=False/NamespaceNotAllowed`,
 * and for a deleting one also `ApplyJobSucceeded=False/IdentityNotAllowed` (its destroy waits, SPEC §5).
 */
function notAllowedPlan(
  c: Consumer,
  message: string,
  wayOut = 'allow the namespace again, or abandon the infrastructure by removing the object',
): Omit<ConsumerPlan, 'consumer'> {
  const deleting = Boolean(c.metadata.deletionTimestamp);
  const conditions: ConditionInput[] = [
    { type: 'IdentityAllowed', status: 'False', reason: 'NamespaceNotAllowed', message, ...gen(c) },
  ];
  if (deleting) {
    conditions.push({
      type: 'ApplyJobSucceeded',
      status: 'False',
      reason: 'IdentityNotAllowed',
      message: `destroy waits: ${message}; ${wayOut}'s finalizer`,
      ...gen(c),
    });
  }
  return {
    outcome: 'not-allowed',
    reason: deleting ? 'IdentityNotAllowed' : 'NamespaceNotAllowed',
    message,
    retry: false,
    conditions,
  };
}

/**
 * SPEC §2, §4: a cluster-scoped consumer (no namespace) is never allowed; it has no key and
 * nothing is listed or written for it but its own conditions.
 */
export function clusterScopedPlan(c: Consumer): ConsumerPlan {
  const identity = c.spec?.identityRef?.name;
  const message = `${c.kind ?? 'the object'} ${c.metadata.name} is cluster-scoped: cluster-scoped objects cannot use credentials (mirrors live in a namespace)${identity ? `; TerraformClusterIdentity ${identity} is not used` : ''}`;
  return {
    consumer: c,
    ...notAllowedPlan(c, message, 'it can never get credentials: abandon the infrastructure by removing the object'),
  };
}

/**
 * SPEC §3: an identity whose `secretRef` names a mirror (stored before the rule, or around the
 * webhook) is inert: nothing is copied from it, and its own mirror here — which may hold
 * credentials copied before the rule — is deleted. Its consumers say `SourceIsMirror`.
 */
function inert(ctx: Ctx, identity: TerraformClusterIdentity): KeyPlan {
  const { key } = ctx;
  const message = `TerraformClusterIdentity ${key.identity} is inert: ${reservedSourceMessage(identity.spec.secretRef.name)}; nothing is copied from it and its mirrors are deleted`;
  return {
    key,
    mirror: ctx.ours ? { action: 'delete', secret: ctx.existing!, why: 'inert' } : { action: 'none' },
    consumers: each(ctx, (c) => ({
      outcome: 'source-is-mirror',
      reason: 'SourceIsMirror',
      message,
      retry: false,
      conditions: [
        allowedCond(key, c),
        { type: 'CredentialsMirrored', status: 'False', reason: 'SourceIsMirror', message, ...gen(c) },
      ],
    })),
  };
}

/** Why a mirror write cannot happen in a namespace being deleted: the API server creates nothing there. */
export const namespaceTerminatingMessage = (verb: string, namespace: string, name: string | undefined): string =>
  `cannot ${verb} mirror Secret ${namespace}/${name}: namespace ${namespace} is being deleted (NamespaceTerminating)`;

/** Why the Secret at the mirror's name is not ours (SPEC §3). */
function inTheWay(ctx: Ctx): string {
  const { key, name } = ctx;
  return `Secret ${key.namespace}/${name} exists and is not a mirror of identity ${key.identity} (it lacks label captf.io/mirrored=true or annotation captf.io/identity=${key.identity}); rename or delete it so the mirror can be created`;
}

/** The condition saying the namespace is allowed. */
const allowedCond = (key: MirrorKey, c: Consumer): ConditionInput => ({
  type: 'IdentityAllowed',
  status: 'True',
  reason: 'NamespaceAllowed',
  message: `namespace ${key.namespace} is allowed by TerraformClusterIdentity ${key.identity}`,
  ...gen(c),
});

/** A Secret is in the way (or cannot be repaired): never touched; `MirrorFailed` says why. */
function blocked(ctx: Ctx, message: string): KeyPlan {
  return {
    key: ctx.key,
    mirror: { action: 'blocked', message },
    consumers: each(ctx, (c) => ({
      outcome: 'mirror-failed',
      reason: 'MirrorFailed',
      message,
      retry: false,
      conditions: [
        allowedCond(ctx.key, c),
        { type: 'CredentialsMirrored', status: 'False', reason: 'MirrorFailed', message, ...gen(c) },
      ],
    })),
  };
}

/** No consumer left (and no owner of a kind this instance does not know): SPEC §6 cleanup. */
const unused = (ctx: Ctx): MirrorAction =>
  ctx.existing && !ctx.foreign ? { action: 'delete', secret: ctx.existing, why: 'unused' } : { action: 'none' };

function sourceMissing(ctx: Ctx, identity: TerraformClusterIdentity, source: SourceRead | undefined): KeyPlan {
  const { key, existing, refs } = ctx;
  const ref = identity.spec.secretRef;
  const message =
    (source?.state !== 'found' ? source?.message : undefined) ??
    `source Secret ${ref.namespace}/${ref.name} of TerraformClusterIdentity ${key.identity} was not read`;
  // The last good copy stays; only the owner references follow the consumers.
  let mirror: MirrorAction = { action: 'none' };
  if (existing && !ctx.users) mirror = unused(ctx);
  else if (existing && needsUpdate(existing, key.identity, refs, undefined))
    mirror = changeOf(existing, key.identity, refs, undefined);
  return {
    key,
    mirror,
    consumers: each(ctx, (c) => ({
      outcome: 'source-not-found',
      reason: 'SourceNotFound',
      message,
      retry: false,
      conditions: [
        allowedCond(key, c),
        { type: 'CredentialsMirrored', status: 'False', reason: 'SourceNotFound', message, ...gen(c) },
      ],
    })),
  };
}

function mirrored(ctx: Ctx, source: Extract<SourceRead, { state: 'found' }>): KeyPlan {
  const { key, existing, refs, name } = ctx;
  if (!ctx.users) return { key, mirror: unused(ctx), consumers: [] };
  let mirror: MirrorAction;
  if (!existing && ctx.snapshot.namespace?.terminating) {
    // The create would be refused (403 NamespaceTerminating) at every try: say so once
    // instead, in the words of that refusal (act.ts), so either path writes one condition.
    return blocked(ctx, namespaceTerminatingMessage('create', key.namespace, name));
  } else if (!existing) {
    const body = desiredMirror(key.identity, key.namespace, source.data, refs[0]!);
    body.metadata.ownerReferences = refs;
    mirror = { action: 'create', body };
  } else if (!needsUpdate(existing, key.identity, refs, source)) {
    mirror = { action: 'none' };
  } else if (existing.type !== undefined && existing.type !== 'Opaque' && !isCurrent(existing, source.hash)) {
    // `type` is immutable: such a mirror cannot be repaired in place.
    return blocked(
      ctx,
      `mirror ${key.namespace}/${name} has type ${existing.type}, not Opaque; delete it so it can be recreated`,
    );
  } else {
    mirror = changeOf(existing, key.identity, refs, source);
  }
  const message = `mirror ${key.namespace}/${name} is current and owned by this object`;
  return {
    key,
    mirror,
    sourceHash: source.hash,
    consumers: each(ctx, (c) => ({
      outcome: 'mirrored',
      reason: 'Mirrored',
      message,
      retry: false,
      conditions: [
        allowedCond(key, c),
        { type: 'CredentialsMirrored', status: 'True', reason: 'Mirrored', message, ...gen(c) },
      ],
    })),
  };
}

/**
 * Whether acting on a plan gives the mirror (as `read`) an owner it does not have (a create, or a
 * new UID in an update or a merge). Such a plan is only as good as its read of the consumers: decided from a
 * list that has aged, the consumer may have switched identity or gone meanwhile, and its release
 * may already have run, so nothing would take the reference away again (SPEC §6, §12).
 */
export function addsOwners(plan: KeyPlan, read: Snapshot['mirror']): boolean {
  const m = plan.mirror;
  if (m.action === 'create') return true;
  if (m.action === 'merge') return m.add.length > 0;
  if (m.action !== 'update') return false;
  const had = new Set((read?.metadata?.ownerReferences ?? []).map((r) => r.uid));
  return (m.body.metadata?.ownerReferences ?? []).some((r) => !had.has(r.uid));
}

/** The verb and name of the mirror write a plan makes. */
export function writeOf(plan: KeyPlan): { verb: string; name: string | undefined } {
  const m = plan.mirror;
  if (m.action === 'delete') return { verb: 'delete', name: m.secret.metadata?.name };
  if (m.action === 'merge') return { verb: 'patch', name: m.secret.metadata?.name };
  const body = (m as { body?: { metadata?: { name?: string } } }).body;
  return { verb: m.action, name: body?.metadata?.name };
}

/**
 * The plan after a refused write: each consumer `MirrorFailed` with `message`. A refused
 * delete keeps the decision's `IdentityAllowed` reason (the namespace is still not allowed),
 * but both conditions then say that the mirror, and its credentials, are still there, and
 * what a person must do.
 */
export function failedPlan(plan: KeyPlan, message: string): ConsumerPlan[] {
  const revoking = plan.mirror.action === 'delete';
  const { namespace } = plan.key;
  const still = `mirror Secret ${namespace}/${writeOf(plan).name} is still there and still holds the credentials`;
  const todo = 'delete it by hand, or lift what refuses the delete';
  const why = revoking ? `the mirror could not be deleted; ${still}: ${message}; ${todo}` : message;
  const allowedNote = (m: string) =>
    `${m.replace(/; no mirror is kept there$/, '')}; ${still}: deleting it was refused (see CredentialsMirrored); ${todo}`;
  return plan.consumers.map((p): ConsumerPlan => ({
    ...p,
    outcome: 'mirror-failed',
    reason: 'MirrorFailed',
    message: why,
    conditions: [
      ...p.conditions
        .filter((c) => c.type !== 'CredentialsMirrored')
        .map((c) =>
          revoking && c.type === 'IdentityAllowed' && c.status === 'False'
            ? { ...c, message: allowedNote(c.message) }
            : c,
        ),
      {
        type: 'CredentialsMirrored',
        status: 'False',
        reason: 'MirrorFailed',
        message: why,
        ...(p.consumer.metadata.generation === undefined ? {} : { observedGeneration: p.consumer.metadata.generation }),
      },
    ],
  }));
}

/** The decision for a consumer without a key (SPEC §4): without `identityRef` its owned conditions are
 * cleared; with a name that cannot be an identity it is `IdentityAllowed=False/IdentityNotFound`;
 * a cluster-scoped one is `IdentityAllowed=False/NamespaceNotAllowed` (SPEC §2). */
export function keylessPlan(consumer: Consumer): ConsumerPlan {
  if (!consumer.metadata.namespace) return clusterScopedPlan(consumer);
  const identity = consumer.spec?.identityRef?.name;
  if (!identity) {
    const message = 'spec.identityRef is not set; no credentials are mirrored';
    return { consumer, outcome: 'no-identity-ref', reason: 'NoIdentityRef', message, retry: false, conditions: [] };
  }
  const message = `spec.identityRef.name ${JSON.stringify(identity).slice(0, 80)} is not a valid TerraformClusterIdentity name`;
  const cond: ConditionInput = {
    type: 'IdentityAllowed',
    status: 'False',
    reason: 'IdentityNotFound',
    message,
    ...(consumer.metadata.generation === undefined ? {} : { observedGeneration: consumer.metadata.generation }),
  };
  return {
    consumer,
    outcome: 'identity-not-found',
    reason: 'IdentityNotFound',
    message,
    retry: false,
    conditions: [cond],
  };
}
