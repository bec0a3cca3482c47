/**
 * HTTP adapter of dead-letters: each delivery is one dead letter (or a batch of them); one that
 * cannot be read as a CloudEvent is still one, and is counted as such. Each is one `dead letter`
 * log line at warn level (what, about which object, where it failed and why, never its data)
 * and one count in `captf.dead_letters`; the answer is 202 with no body. Nothing is retried
 * here: the resync repairs what the event was about.
 */
import { BadEventError, readCloudEvents } from '../lib/cloudevents.ts';
import type { RequestHandler } from 'express';
import type { Logger } from '../lib/log.ts';
import { telemetry } from '../lib/telemetry.ts';
import { describeDeadLetter, type DeadLetter } from './describe.ts';

/**
 * The attributes of each CloudEvent in a delivery (binary, structured, or a batch of at most
 * `MAX_BATCH`), read as the event functions read theirs (lib/cloudevents.ts), with one empty
 * set for each event that is not readable and one for a delivery that is no CloudEvent at all.
 */
export function lettersOf(
  headers: Record<string, string | string[] | undefined>,
  body: string,
): Record<string, unknown>[] {
  try {
    const { events, errors } = readCloudEvents(headers, body);
    return [...events.map((e) => ({ ...e })), ...errors.map(() => ({}))];
  } catch (err) {
    if (err instanceof BadEventError) return [{}];
    throw err;
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
