/**
 * `POST /validate` of the admission function: an AdmissionReview `admission.k8s.io/v1` in,
 * one answer out (SPEC §10). A body that is not a usable review answers 4xx, or a denial when
 * it carries a `request.uid` to answer; a well-formed review goes to {@link reviewIdentity}.
 */
import type { RequestHandler } from 'express';
import { parseReview, reviewResponse } from './admission-review.ts';
import { reviewIdentity, type ReviewDeps } from './review.ts';

/**
 * The Express handler for `POST /validate`.
 * @param deps API clients, consumer kinds, logger.
 * @returns a handler that always answers: 200 with an AdmissionReview (allowed or denied,
 *   `response.uid` = `request.uid`), or 4xx `{error}` for a body that holds no request to answer.
 */
export function validateHandler(deps: ReviewDeps): RequestHandler {
  return async (req, res) => {
    const parsed = parseReview(req.body);
    if (!parsed.ok) {
      if ('httpStatus' in parsed) {
        deps.logger.warn('malformed AdmissionReview', { error: parsed.error });
        res.status(parsed.httpStatus).json({ error: parsed.error });
        return;
      }
      deps.logger.warn('AdmissionReview denied as malformed', { uid: parsed.uid, denial: parsed.decision.message });
      res.json(reviewResponse(parsed.uid, parsed.decision));
      return;
    }
    const decision = await reviewIdentity(parsed.request, deps);
    res.json(reviewResponse(parsed.request.uid, decision));
  };
}
