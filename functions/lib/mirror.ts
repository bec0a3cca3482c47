/**
 * SPEC §3: the per-namespace credential mirror — its name, the canonical source hash, what
 * makes a Secret "ours", when it is current, and the owner references it carries. Pure.
 */
import { createHash } from 'node:crypto';
import type { Consumer, OwnerReference, SecretRef } from './api.ts';

/**
 * Name prefix of every mirror Secret, reserved for mirrors (SPEC §3): an identity whose
 * `spec.secretRef.name` starts with it is refused at admission and by the CRD's CEL rule, and
 * one stored anyway is inert ({@link isReservedSourceName}).
 */
export const MIRROR_PREFIX = 'captf-creds-';
/** Label that marks a Secret as a mirror (SPEC §3). */
export const LABEL_MIRRORED = 'captf.io/mirrored';
/** Label that marks a Secret as managed by this project (SPEC §3). */
export const LABEL_MANAGED = 'captf.io/managed';
/** Annotation holding the source hash the mirror was copied from (64 lower-case hex). */
export const ANNOTATION_SOURCE_HASH = 'captf.io/source-hash';
/** Annotation naming the identity the mirror belongs to. */
export const ANNOTATION_IDENTITY = 'captf.io/identity';
/**
 * Label naming the identity a mirror belongs to, so one label-selected list finds an
 * identity's mirrors in every namespace (SPEC §7): the identity name when it fits a label
 * value, else {@link mirrorOfLabel}'s hash form.
 */
export const LABEL_MIRROR_OF = 'captf.io/mirror-of';
/** Longest object name Kubernetes accepts for a Secret (DNS-1123 subdomain). */
export const MAX_NAME_LENGTH = 253;

/** Secret data as the API returns it: key → base64-encoded bytes. */
export type SecretData = Record<string, string>;

/** The parts of a `v1.Secret` these decisions read. */
export interface SecretLike {
  metadata?: {
    name?: string;
    namespace?: string;
    resourceVersion?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    ownerReferences?: OwnerReference[];
  };
  type?: string;
  data?: SecretData;
}

/**
 * SPEC §3: the mirror's name for an identity: `captf-creds-<identity>`, or, when that would
 * exceed 253 characters, `captf-creds-` plus the first 16 hex characters of SHA-256 of the
 * identity name.
 * @param identityName the identity's `metadata.name`.
 */
export function mirrorName(identityName: string): string {
  const plain = MIRROR_PREFIX + identityName;
  if (plain.length <= MAX_NAME_LENGTH) return plain;
  return MIRROR_PREFIX + createHash('sha256').update(identityName, 'utf8').digest('hex').slice(0, 16);
}

/**
 * The {@link LABEL_MIRROR_OF} value for an identity: its name when at most 63 characters
 * (identity names are DNS-1123 subdomains, so they are valid label values up to that length),
 * else `sha256-` and the first 56 hex characters of SHA-256 of the name (63 in all).
 */
export function mirrorOfLabel(identityName: string): string {
  if (identityName.length <= 63) return identityName;
  return `sha256-${createHash('sha256').update(identityName, 'utf8').digest('hex').slice(0, 56)}`;
}

function u32be(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
}

/**
 * SPEC §3: canonical SHA-256 of a Secret's data. Keys sorted by UTF-8 byte order; for each
 * key: 4-byte big-endian key length, key bytes, 4-byte big-endian value length, value bytes.
 * @param data key → base64 value as the API returns `Secret.data`; absent or empty hashes
 *   the empty input.
 * @returns 64 lower-case hex characters.
 */
export function sourceHash(data: SecretData | undefined | null): string {
  const entries = Object.entries(data ?? {}).map(
    ([k, v]) => [Buffer.from(k, 'utf8'), Buffer.from(v ?? '', 'base64')] as const,
  );
  entries.sort((a, b) => Buffer.compare(a[0], b[0]));
  const h = createHash('sha256');
  for (const [k, v] of entries) {
    h.update(u32be(k.length)).update(k).update(u32be(v.length)).update(v);
  }
  return h.digest('hex');
}

/**
 * SPEC §3: does `name` (a `spec.secretRef.name`) carry the prefix reserved for mirrors? Such
 * an identity would publish a mirror — another identity's credentials — as its own source, so
 * it is refused at admission and by CEL, and one stored before those rules is inert: nothing
 * is copied from it, and its own mirrors are deleted.
 */
export function isReservedSourceName(name: string | undefined): boolean {
  return typeof name === 'string' && name.startsWith(MIRROR_PREFIX);
}

/**
 * The identity whose mirror a reserved Secret name would be, when the rest of the name can be
 * an identity name (a hashed long-name mirror cannot be traced back: undefined).
 */
export function mirrorIdentityOf(name: string): string | undefined {
  if (!isReservedSourceName(name)) return undefined;
  const rest = name.slice(MIRROR_PREFIX.length);
  return /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/.test(rest) && mirrorName(rest) === name ? rest : undefined;
}

/**
 * Why a reserved `spec.secretRef.name` is never a source, in one sentence shared by admission,
 * identity-status and mirror-sync (SPEC §3, §9, §10).
 */
export function reservedSourceMessage(name: string): string {
  const of = mirrorIdentityOf(name);
  return `spec.secretRef.name ${JSON.stringify(name.slice(0, 253))} starts with ${MIRROR_PREFIX}, which is reserved for the mirrors mirror-sync writes${of ? ` (this is the name of TerraformClusterIdentity ${JSON.stringify(of)}'s mirror)` : ''}; a mirror is never a source: name the operator's own Secret`;
}

/** Does `ref` name exactly this Secret (namespace and name)? */
export function namesSecret(ref: Partial<SecretRef> | undefined, secret: SecretLike | undefined): boolean {
  const md = secret?.metadata;
  return ref !== undefined && md !== undefined && ref.namespace === md.namespace && ref.name === md.name;
}

/**
 * SPEC §3, the one ownership predicate every write path uses (create, update, delete, the
 * resync) and every reader that counts mirrors: a Secret is the mirror of `identityName` only
 * if it carries label `captf.io/mirrored=true`, annotation `captf.io/identity=<identityName>`,
 * and is not the Secret that same identity names as its source (an operator's source that
 * looks like the identity's own mirror is never written or deleted). No other identity's
 * `secretRef` changes the answer: an inert identity naming another's mirror cannot make it
 * "not ours" and so keep it alive past a revocation.
 * @param sourceRef the identity's `spec.secretRef`; undefined when the identity does not exist.
 */
export function isOurs(
  secret: SecretLike | undefined,
  identityName: string,
  sourceRef: Partial<SecretRef> | undefined,
): boolean {
  return (
    secret?.metadata?.labels?.[LABEL_MIRRORED] === 'true' &&
    secret.metadata.annotations?.[ANNOTATION_IDENTITY] === identityName &&
    !namesSecret(sourceRef, secret)
  );
}

/**
 * SPEC §3: is the mirror current? The source hash must equal both the mirror's
 * `captf.io/source-hash` annotation and the hash of the mirror's own data, so a hand-edited
 * mirror whose annotation was kept is still repaired.
 * @param hash the source's {@link sourceHash}.
 */
export function isCurrent(mirror: SecretLike, hash: string): boolean {
  return mirror.metadata?.annotations?.[ANNOTATION_SOURCE_HASH] === hash && sourceHash(mirror.data) === hash;
}

/** API group of an `apiVersion` string (`''` for the core group). */
export function groupOf(apiVersion: string): string {
  const i = apiVersion.indexOf('/');
  return i < 0 ? '' : apiVersion.slice(0, i);
}

/**
 * SPEC §3: the owner reference a consumer puts on its mirror: `{apiVersion, kind, name, uid}`
 * with `controller` and `blockOwnerDeletion` unset.
 * @throws Error when the consumer lacks apiVersion, kind, name or uid (a caller bug).
 */
export function ownerReferenceFor(consumer: Consumer): OwnerReference {
  const { apiVersion, kind } = consumer;
  const { name, uid } = consumer.metadata;
  if (!apiVersion || !kind || !name || !uid)
    throw new Error('consumer needs apiVersion, kind, metadata.name and metadata.uid');
  return { apiVersion, kind, name, uid };
}

/** Same owner (group, kind and name), whatever the version or UID. */
export function sameOwner(a: OwnerReference, b: OwnerReference): boolean {
  return groupOf(a.apiVersion) === groupOf(b.apiVersion) && a.kind === b.kind && a.name === b.name;
}

/**
 * SPEC §3: owner references with `ref` present and current. A reference with the same group,
 * kind and name but another UID (the object was recreated) is replaced; references to other
 * objects are kept in order.
 * @returns `{ refs, changed }`; `changed` is false when `refs` already held exactly `ref`.
 */
export function withOwnerReference(
  refs: readonly OwnerReference[] | undefined,
  ref: OwnerReference,
): { refs: OwnerReference[]; changed: boolean } {
  const current = refs ?? [];
  const exact = current.filter((r) => sameOwner(r, ref) && r.uid === ref.uid);
  const others = current.filter((r) => !sameOwner(r, ref));
  const isExact =
    exact.length === 1 &&
    exact[0]!.apiVersion === ref.apiVersion &&
    !exact[0]!.controller &&
    !exact[0]!.blockOwnerDeletion;
  if (isExact && others.length === current.length - 1) return { refs: [...current], changed: false };
  return { refs: [...others, { ...ref }], changed: true };
}

/**
 * SPEC §6: owner references without the given owner (matched by group, kind and name; when
 * `uid` is given, only that UID is removed so a newer object of the same name keeps its
 * reference).
 * @returns `{ refs, changed }`.
 */
export function withoutOwnerReference(
  refs: readonly OwnerReference[] | undefined,
  owner: Pick<OwnerReference, 'apiVersion' | 'kind' | 'name'> & { uid?: string | undefined },
): { refs: OwnerReference[]; changed: boolean } {
  const current = refs ?? [];
  const kept = current.filter(
    (r) => !(sameOwner(r, { ...owner, uid: '' }) && (owner.uid === undefined || r.uid === owner.uid)),
  );
  return { refs: kept, changed: kept.length !== current.length };
}

/**
 * The mirror Secret to create for an identity in a namespace (SPEC §3): type Opaque, the
 * source's data unchanged, the two labels, the two annotations and one owner reference.
 * @param identityName identity's name; @param namespace consumer's namespace;
 * @param sourceData the source Secret's data (base64 values); @param owner the consumer's reference.
 */
export function desiredMirror(
  identityName: string,
  namespace: string,
  sourceData: SecretData | undefined,
  owner: OwnerReference,
): Required<Pick<SecretLike, 'metadata' | 'type' | 'data'>> & { apiVersion: 'v1'; kind: 'Secret' } {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: {
      name: mirrorName(identityName),
      namespace,
      labels: { [LABEL_MIRRORED]: 'true', [LABEL_MANAGED]: 'true', [LABEL_MIRROR_OF]: mirrorOfLabel(identityName) },
      annotations: { [ANNOTATION_SOURCE_HASH]: sourceHash(sourceData), [ANNOTATION_IDENTITY]: identityName },
      ownerReferences: [{ ...owner }],
    },
    type: 'Opaque',
    data: { ...(sourceData ?? {}) },
  };
}

/**
 * SPEC §4 step 3: the strategic-merge patch (`application/strategic-merge-patch+json`) that adds
 * and removes a mirror's owner references by UID and touches nothing else. `ownerReferences` is
 * merged by its `uid` key (apimachinery's `+patchMergeKey=uid`), and the API server applies the
 * patch to whatever is stored on each of its own retries, so adds and removals by different
 * instances commute. A removal is the garbage collector's own form (`$patch: delete` by UID,
 * kube-controller-manager's `controller_ref_manager.go`). The mirror's `metadata.uid` rides along
 * as the guard: the API server refuses the patch for a mirror deleted and created again meanwhile
 * (a UID is immutable), so a change decided for one mirror never lands on another.
 *
 * Adds commute with each other and with removals of other UIDs, so a patch that only adds carries
 * nothing more. A removal does not commute with a concurrent add of the same UID (a consumer that
 * switched identity and back) nor with the removal of the mirror's other users (two removals by
 * UID could leave a mirror with no owner, which nothing would collect): a patch that removes
 * carries the `resourceVersion` it was decided from, and conflicts when anything changed since.
 * @param read the mirror as read: its UID, and the resourceVersion a removal needs.
 * @param change references to add (whole, `controller` and `blockOwnerDeletion` unset, SPEC §3)
 *   and UIDs to remove; at least one of them (an empty list in a patch changes nothing,
 *   kubernetes/kubernetes#96107).
 */
export function ownerReferencesPatch(
  read: { uid: string; resourceVersion?: string | undefined },
  change: { add: readonly OwnerReference[]; remove: readonly string[] },
): {
  metadata: {
    uid: string;
    resourceVersion?: string;
    ownerReferences: (OwnerReference | { $patch: 'delete'; uid: string })[];
  };
} {
  const guard = change.remove.length && read.resourceVersion ? { resourceVersion: read.resourceVersion } : {};
  return {
    metadata: {
      uid: read.uid,
      ...guard,
      ownerReferences: [
        ...change.add.map(({ apiVersion, kind, name, uid }) => ({ apiVersion, kind, name, uid })),
        ...change.remove.map((uid) => ({ $patch: 'delete' as const, uid })),
      ],
    },
  };
}
