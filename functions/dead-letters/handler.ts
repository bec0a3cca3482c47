/**
 * HTTP adapter of dead-letters: each delivery is one dead letter (or a batch of them), taken
 * whatever its content: a dead letter that cannot be read as a CloudEvent is still one, and is
 * counted as such. Each is one `dead letter` log line at warn level (what, about which object,
 * where it failed and why, never its data) and one count in `captf.dead_letters`; the answer
 * is 202 with no body. Nothing is retried here: the resync repairs what the event was about.
 */
import { HTTP } from 'cloudevents';
import type { RequestHandler } from 'express';
import type { Logger } from '../lib/log.ts';
import { telemetry } from '../lib/telemetry.ts';
import { describeDeadLetter, type DeadLetter } from './describe.ts';

/**
 * The attributes of each CloudEvent in a delivery (binary, structured or batch mode), or one
 * empty set when the delivery is no CloudEvent (its headers and body are not read further).
 */
export function lettersOf(
  headers: Record<string, string | string[] | undefined>,
  body: string,
): Record<string, unknown>[] {
  try {
    const parsed = HTTP.toEvent({ headers, body });
    const events = Array.isArray(parsed) ? parsed : [parsed];
    return events.length ? events.map((e) => ({ ...e })) : [{}];
  } catch {
    return [{}];
  }
}

/** The log line's fields of one dead letter: what it says, the function it was for (`for`) and the code. */
const logged = ({ labels, ...fields }: DeadLetter): Record<string, unknown> => ({
  ...fields,
  for: labels.target,
  code: labels.code,
});

/** `POST /` handler: logs and counts each dead letter of the delivery, then answers 202. */
export function takeDeadLetters(logger: Logger): RequestHandler {
  return (req, res) => {
    for (const attrs of lettersOf(req.headers, typeof req.body === 'string' ? req.body : '')) {
      const letter = describeDeadLetter(attrs);
      logger.warn('dead letter', logged(letter));
      telemetry().deadLetter(letter.labels);
    }
    res.status(202).end();
  };
}
