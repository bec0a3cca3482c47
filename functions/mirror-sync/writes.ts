/**
 * SPEC §4 step 3, as data: the one request a plan's mirror part sends, and what guards it. Pure,
 * so the write path is tested as a table (snapshot in, requests out) and the shell (act.ts
 * `writeMirror`) only sends what this says. Each request carries its guard where the API server
 * reads it (the resourceVersion in an update's body, the UID in a merge's body, both as a delete's
 * preconditions); `precondition` states it for readers and tests.
 *
 * Writes that commute with other instances' writes are merges the API server makes (adding owner
 * references by UID, guarded only by the mirror's UID); every other write, a removal of a
 * reference included, carries the resourceVersion it was decided from (SPEC §0, §4, §6).
 */
import { ownerReferencesPatch, type SecretLike } from '../lib/mirror.ts';
import type { KeyPlan } from './decide.ts';

/** What makes the API server refuse a write decided from an older read. */
export interface Precondition {
  /** The mirror must still be this object (deleted and created again → refused). */
  uid?: string;
  /** The mirror must not have changed at all since it was read. */
  resourceVersion?: string;
}

/** One request to the mirror Secret. */
export type MirrorWrite =
  | {
      /** A create: it is refused (409 AlreadyExists) when any Secret already holds the name. */
      verb: 'create';
      namespace: string;
      name: string;
      body: SecretLike;
    }
  | {
      /** A whole replacement (data, labels, a reference whose fields change), with its resourceVersion. */
      verb: 'update';
      namespace: string;
      name: string;
      body: SecretLike;
      precondition: Required<Pick<Precondition, 'resourceVersion'>>;
    }
  | {
      /**
       * A strategic-merge patch of `metadata.ownerReferences` by UID. Adding only, it commutes with
       * every other instance's write; a removal also carries the resourceVersion it was read at.
       */
      verb: 'patch';
      namespace: string;
      name: string;
      body: ReturnType<typeof ownerReferencesPatch>;
      precondition: Precondition & Required<Pick<Precondition, 'uid'>>;
    }
  | {
      /** A delete of exactly the mirror that was read (SPEC §6: never one that gained a user). */
      verb: 'delete';
      namespace: string;
      name: string;
      precondition: Required<Precondition>;
    };

/**
 * The request a plan's mirror part sends, or undefined when it sends none (`none`, `blocked`).
 * @throws Error when the plan's mirror lacks what its write needs (a name, a UID or a
 *   resourceVersion): a mirror read from the API server always has them.
 */
export function mirrorWriteOf(plan: KeyPlan): MirrorWrite | undefined {
  const m = plan.mirror;
  const { namespace } = plan.key;
  switch (m.action) {
    case 'create':
      return { verb: 'create', namespace, name: required(m.body, 'name'), body: m.body };
    case 'update':
      return {
        verb: 'update',
        namespace,
        name: required(m.body, 'name'),
        body: m.body,
        precondition: { resourceVersion: required(m.body, 'resourceVersion') },
      };
    case 'merge': {
      const uid = required(m.secret, 'uid');
      const resourceVersion = m.remove.length ? required(m.secret, 'resourceVersion') : undefined;
      return {
        verb: 'patch',
        namespace,
        name: required(m.secret, 'name'),
        body: ownerReferencesPatch({ uid, resourceVersion }, m),
        precondition: { uid, ...(resourceVersion ? { resourceVersion } : {}) },
      };
    }
    case 'delete':
      return {
        verb: 'delete',
        namespace,
        name: required(m.secret, 'name'),
        precondition: { resourceVersion: required(m.secret, 'resourceVersion'), uid: required(m.secret, 'uid') },
      };
    default:
      return undefined;
  }
}

/** A metadata field the write needs. */
function required(s: SecretLike & { metadata?: { uid?: string } }, field: 'name' | 'uid' | 'resourceVersion'): string {
  const v = s.metadata?.[field];
  if (!v) throw new Error(`the mirror's metadata.${field} is missing: it was not read from the API server`);
  return v;
}
