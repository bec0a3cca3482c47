/**
 * The three kinds of failure a write can end in, decided in one place (SPEC §4, §16; the shape
 * of knative/pkg's `controller.NewPermanentError` and controller-runtime's `TerminalError`):
 * - `conflict`: what the decision read has changed (a resourceVersion precondition failed, a
 *   create met AlreadyExists, the object went away, a UID guard met another object, a condition
 *   write landed on another object or generation) — observe and decide again;
 * - `retry`: a failure a retry can fix (429, 5xx, no answer) — no condition changes, the event
 *   is answered 5xx so Knative delivers it again;
 * - `permanent`: the API server refused for good (a policy, a webhook, a namespace being
 *   deleted) — it waits for a person: `MirrorFailed` says why, nothing retries.
 */
import { apiStatus, isInvalidField } from '../lib/kube.ts';

/** The kinds of failure, see the module comment. */
export type FailureKind = 'conflict' | 'retry' | 'permanent';

/**
 * A write met a newer state than its decision read: decide again from fresh reads. `code` 409,
 * so lib/kube.ts `retryOnConflict` runs observe → decide → act once more.
 */
export class Conflict extends Error {
  readonly code = 409;
  /** @param why what changed, in safe words (it is logged when a key gives up). */
  constructor(why: string) {
    super(why);
    this.name = 'Conflict';
  }
}

/**
 * Which kind a failed write is. Only write errors are classified: reads map 404 to "absent"
 * themselves (lib/kube.ts `ignoreNotFound`).
 * @param err what the write threw (an API error, a {@link Conflict}, or anything else, which a
 *   retry may fix).
 */
export function classify(err: unknown): FailureKind {
  if (err instanceof Conflict) return 'conflict';
  const status = apiStatus(err);
  // 404: the object the decision read is gone. A UID guard that fails answers 422 on metadata.uid.
  if (status === 409 || status === 404 || isInvalidField(err, 'metadata.uid')) return 'conflict';
  if (status === undefined || status === 429 || status >= 500) return 'retry';
  return 'permanent';
}
