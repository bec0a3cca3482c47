/**
 * SPEC §4: reconcile one consumer. Re-reads everything from the API server (object,
 * identity, namespace, source Secret, mirror), decides with the pure functions in plan.ts,
 * writes with resourceVersion preconditions, and returns one result that the HTTP layer
 * maps to a status code and the logger writes as one line. Nothing is remembered between
 * calls; the same code serves events, resync and prepare.
 */
import type { KubeConfig, V1Secret } from '@kubernetes/client-node';
import { isDns1123Subdomain, isNamespaceAllowed } from '../lib/allowed-namespaces.ts';
import { GROUP, IDENTITY_PLURAL, VERSION, type Consumer, type ConsumerKind, type TerraformClusterIdentity } from '../lib/api.ts';
import type { ConditionInput } from '../lib/conditions.ts';
import { describeError, isForbidden, isNotFound, makeClients, redactApiError, retryOnConflict, type Clients } from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import { isCurrent, isOurs, mirrorName, ownerReferenceFor, sourceHash, type SecretLike } from '../lib/mirror.ts';
import { releaseOwnerEverywhere, revokeMirror } from './cleanup.ts';
import { consumerRefMatcher, planMirror } from './plan.ts';
import { writeConditions } from './status.ts';

/** How a reconcile ended (SPEC §4, §16). */
export type Outcome =
  | 'mirrored'
  | 'gone'
  | 'no-identity-ref'
  | 'identity-not-found'
  | 'not-allowed'
  | 'source-not-found'
  | 'mirror-failed'
  | 'error';

/** One reconcile's result: what happened, whether to retry, and why. */
export interface ReconcileResult {
  /** `<namespace>/<name>` of the consumer. */
  object: string;
  kind: string;
  identity?: string | undefined;
  outcome: Outcome;
  /** True when the caller should retry (CloudEvent → 5xx, prepare → non-2xx). */
  retry: boolean;
  /** Condition reason (SPEC §16) or a short word for outcomes without a condition. */
  reason: string;
  /** Human-readable, never Secret data. */
  message: string;
  /** Mirror name when `outcome` is `mirrored`. */
  mirror?: string;
  /** Source hash when `outcome` is `mirrored` (returned by prepare only). */
  sourceHash?: string;
  /** What this reconcile did to the mirror (logged, for operators and the local mode). */
  mirrorAction?: 'created' | 'updated' | 'unchanged' | 'revoked' | undefined;
  durationMs: number;
  apiCalls: number;
}

/** What a reconcile needs from its caller. */
export interface ReconcileDeps {
  kc: KubeConfig;
  kinds: readonly ConsumerKind[];
  logger: Logger;
  /** Clock for lastTransitionTime and Events (tests may fix it). */
  now?: () => Date;
}

/** Names one consumer to reconcile; `uid` is known from Resource-mode events. */
export interface ConsumerRequest {
  kind: ConsumerKind;
  namespace: string;
  name: string;
  uid?: string | undefined;
}

type Partial = Omit<ReconcileResult, 'object' | 'kind' | 'durationMs' | 'apiCalls'>;

async function getOrUndefined<T>(p: Promise<T>): Promise<T | undefined> {
  try {
    return await p;
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

const allowed = (message: string): ConditionInput => ({ type: 'IdentityAllowed', status: 'True', reason: 'NamespaceAllowed', message });

/**
 * Reconciles one consumer (SPEC §4 steps 1–7) and logs one JSON line with object, identity,
 * outcome, reason, duration in ms and the number of API calls.
 * @returns the result; unexpected API errors become `outcome: 'error', retry: true` (never thrown).
 */
export async function reconcileConsumer(deps: ReconcileDeps, req: ConsumerRequest): Promise<ReconcileResult> {
  const started = performance.now();
  const clients = makeClients(deps.kc, { calls: 0 });
  let partial: Partial;
  try {
    partial = await reconcile(clients, deps, req);
  } catch (err) {
    partial = { outcome: 'error', retry: true, reason: 'APIError', message: describeError(err) };
  }
  const result: ReconcileResult = {
    object: `${req.namespace}/${req.name}`,
    kind: req.kind.kind,
    ...partial,
    durationMs: Math.round((performance.now() - started) * 10) / 10,
    apiCalls: clients.counter.calls,
  };
  // `message` would be merged into winston's own message field, so it is logged as `detail`.
  const { sourceHash: _hash, message: detail, ...rest } = result;
  deps.logger.log(result.outcome === 'error' ? 'warn' : 'info', 'reconcile', { ...rest, detail });
  return result;
}

async function reconcile(clients: Clients, deps: ReconcileDeps, req: ConsumerRequest): Promise<Partial> {
  const now = deps.now?.() ?? new Date();
  const { kind, namespace, name } = req;
  const isConsumerRef = consumerRefMatcher(deps.kinds);
  const apiVersion = `${kind.group}/${kind.version}`;

  // 1. The object. Gone → release its owner reference everywhere in the namespace.
  const obj = (await getOrUndefined(
    clients.custom.getNamespacedCustomObject({ group: kind.group, version: kind.version, plural: kind.plural, namespace, name }),
  )) as Consumer | undefined;
  if (!obj) {
    const released = await releaseOwnerEverywhere(clients, namespace, { apiVersion, kind: kind.kind, name, uid: req.uid }, isConsumerRef);
    return { outcome: 'gone', retry: false, reason: 'ObjectGone', message: `object is gone; released ${released.length} mirror(s)` };
  }
  const consumer: Consumer = { ...obj, apiVersion, kind: kind.kind };
  const owner = ownerReferenceFor(consumer);
  const deleting = Boolean(consumer.metadata.deletionTimestamp);
  const generation = consumer.metadata.generation;
  const cond = (c: Omit<ConditionInput, 'observedGeneration'>): ConditionInput => (generation === undefined ? c : { ...c, observedGeneration: generation });
  const identityName = consumer.spec?.identityRef?.name;

  // A consumer that switched identities lets go of the old mirror (SPEC §6).
  await releaseOwnerEverywhere(clients, namespace, owner, isConsumerRef, identityName);

  // 2. No identityRef: it stopped using credentials.
  if (!identityName) {
    await writeConditions(clients, kind, consumer, [], now, deps.logger);
    return { outcome: 'no-identity-ref', retry: false, reason: 'NoIdentityRef', message: 'spec.identityRef is not set; no credentials are mirrored' };
  }

  // 3. The identity. A name that is not a valid object name cannot exist (and must not be
  // put into a URL, where "." or ".." would change the request).
  if (!isDns1123Subdomain(identityName)) {
    const message = `spec.identityRef.name ${JSON.stringify(identityName).slice(0, 80)} is not a valid TerraformClusterIdentity name`;
    await writeConditions(clients, kind, consumer, [cond({ type: 'IdentityAllowed', status: 'False', reason: 'IdentityNotFound', message })], now, deps.logger);
    return { identity: undefined, outcome: 'identity-not-found', retry: false, reason: 'IdentityNotFound', message };
  }
  const identity = (await getOrUndefined(
    clients.custom.getClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, name: identityName }),
  )) as TerraformClusterIdentity | undefined;
  if (!identity) {
    const revoked = await revokeMirror(clients, namespace, identityName);
    const message = `TerraformClusterIdentity ${identityName} does not exist`;
    await writeConditions(clients, kind, consumer, [cond({ type: 'IdentityAllowed', status: 'False', reason: 'IdentityNotFound', message })], now, deps.logger);
    return { identity: identityName, outcome: 'identity-not-found', retry: true, reason: 'IdentityNotFound', message, mirrorAction: revoked ? 'revoked' : undefined };
  }

  // 4. The namespace.
  const ns = await getOrUndefined(clients.core.readNamespace({ name: namespace }));
  if (!ns || !isNamespaceAllowed(identity.spec?.allowedNamespaces, { name: namespace, labels: ns.metadata?.labels })) {
    const revoked = await revokeMirror(clients, namespace, identityName);
    const message = `namespace ${namespace} is not allowed by TerraformClusterIdentity ${identityName} (spec.allowedNamespaces)${revoked ? '; its mirror was deleted' : ''}`;
    const conditions = [cond({ type: 'IdentityAllowed', status: 'False', reason: 'NamespaceNotAllowed', message })];
    if (deleting) {
      conditions.push(cond({ type: 'ApplyJobSucceeded', status: 'False', reason: 'IdentityNotAllowed', message: `destroy waits: ${message}; allow the namespace again, or abandon the infrastructure by removing the object's finalizer` }));
    }
    await writeConditions(clients, kind, consumer, conditions, now, deps.logger);
    return { identity: identityName, outcome: 'not-allowed', retry: deleting, reason: deleting ? 'IdentityNotAllowed' : 'NamespaceNotAllowed', message, mirrorAction: revoked ? 'revoked' : undefined };
  }
  const allowedCond = cond(allowed(`namespace ${namespace} is allowed by TerraformClusterIdentity ${identityName}`));

  // 5. The source Secret, read directly (never cached), so a rotation is seen at once.
  const ref = identity.spec.secretRef;
  let source: V1Secret | undefined;
  let sourceProblem: string | undefined;
  try {
    source = await getOrUndefined(clients.core.readNamespacedSecret({ name: ref.name, namespace: ref.namespace }));
    if (!source) sourceProblem = `source Secret ${ref.namespace}/${ref.name} of TerraformClusterIdentity ${identityName} does not exist`;
  } catch (err) {
    if (!isForbidden(err)) throw err;
    sourceProblem = `source Secret ${ref.namespace}/${ref.name} of TerraformClusterIdentity ${identityName} is not readable by mirror-sync (403)`;
  }
  if (!source) {
    await writeConditions(clients, kind, consumer, [allowedCond, cond({ type: 'CredentialsMirrored', status: 'False', reason: 'SourceNotFound', message: sourceProblem! })], now, deps.logger);
    return { identity: identityName, outcome: 'source-not-found', retry: true, reason: 'SourceNotFound', message: sourceProblem! };
  }
  const hash = sourceHash(source.data);
  const name_ = mirrorName(identityName);

  // 6. The mirror: create, or one resourceVersion-guarded update, or nothing at all.
  let failure: { message: string; retry: boolean } | undefined;
  let wrote = false;
  let mirrorAction: ReconcileResult['mirrorAction'];
  try {
    failure = await retryOnConflict(async () => {
      const existing = await getOrUndefined(clients.core.readNamespacedSecret({ name: name_, namespace }));
      const plan = planMirror(existing as SecretLike | undefined, identityName, namespace, source.data, hash, owner);
      if (plan.action === 'blocked') return { message: plan.message, retry: false };
      try {
        if (plan.action === 'create') await clients.core.createNamespacedSecret({ namespace, body: plan.body as V1Secret });
        else if (plan.action === 'update') await clients.core.replaceNamespacedSecret({ name: name_, namespace, body: plan.body as V1Secret });
      } catch (err) {
        throw redactApiError(err);
      }
      wrote = plan.action !== 'none';
      mirrorAction = plan.action === 'create' ? 'created' : plan.action === 'update' ? 'updated' : 'unchanged';
      return undefined;
    }, 20);
  } catch (err) {
    failure = { message: `writing mirror ${namespace}/${name_} failed: ${describeError(err)}`, retry: true };
  }
  if (failure) {
    await writeConditions(clients, kind, consumer, [allowedCond, cond({ type: 'CredentialsMirrored', status: 'False', reason: 'MirrorFailed', message: failure.message })], now, deps.logger);
    return { identity: identityName, outcome: 'mirror-failed', retry: failure.retry, reason: 'MirrorFailed', message: failure.message };
  }

  // A revocation (narrowed list, relabelled namespace, deleted identity) may have landed
  // between step 4 and our write and found no mirror to delete. Re-check after writing so a
  // mirror never outlives its permission by a resync period.
  if (wrote && !(await stillAllowed(clients, identityName, namespace))) {
    await revokeMirror(clients, namespace, identityName);
    const message = `namespace ${namespace} stopped being allowed by TerraformClusterIdentity ${identityName} while the mirror was written; the mirror was deleted`;
    await writeConditions(clients, kind, consumer, [cond({ type: 'IdentityAllowed', status: 'False', reason: 'NamespaceNotAllowed', message })], now, deps.logger);
    return { identity: identityName, outcome: 'not-allowed', retry: true, reason: 'NamespaceNotAllowed', message, mirrorAction: 'revoked' };
  }

  // 7. Mirrored. The message names the mirror, never data or hash.
  const message = `mirror ${namespace}/${name_} is current and owned by this object`;
  const desired = [allowedCond, cond({ type: 'CredentialsMirrored', status: 'True', reason: 'Mirrored', message })];
  await writeConditions(clients, kind, consumer, desired, now, deps.logger);
  return { identity: identityName, outcome: 'mirrored', retry: false, reason: 'Mirrored', message, mirror: name_, sourceHash: hash, mirrorAction };
}

/** Fresh reads of the identity and namespace: is `namespace` still allowed (SPEC §2)? */
async function stillAllowed(clients: Clients, identityName: string, namespace: string): Promise<boolean> {
  const identity = (await getOrUndefined(
    clients.custom.getClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, name: identityName }),
  )) as TerraformClusterIdentity | undefined;
  const ns = identity ? await getOrUndefined(clients.core.readNamespace({ name: namespace })) : undefined;
  return Boolean(identity && ns && isNamespaceAllowed(identity.spec?.allowedNamespaces, { name: namespace, labels: ns.metadata?.labels }));
}

/**
 * SPEC §5: is the namespace's mirror of `identityName` current for `hash` and does it carry
 * this consumer's owner reference (exact UID)? Re-read after a reconcile, for prepare.
 */
export async function mirrorReadyFor(clients: Clients, namespace: string, identityName: string, hash: string, owner: { apiVersion: string; kind: string; name: string; uid: string }): Promise<boolean> {
  const m = await getOrUndefined(clients.core.readNamespacedSecret({ name: mirrorName(identityName), namespace }));
  if (!m || !isOurs(m as SecretLike, identityName) || !isCurrent(m as SecretLike, hash)) return false;
  return (m.metadata?.ownerReferences ?? []).some((r) => r.uid === owner.uid && r.kind === owner.kind && r.name === owner.name);
}

