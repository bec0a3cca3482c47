/**
 * What a dead letter says (pure). Knative's Broker sends an event to the dead-letter sink after
 * a Trigger's last retry, or at once for a 4xx other than 404, 408, 409 and 429, with its error
 * extensions: `knativeerrorcode` (the last HTTP status), `knativeerrordest` (where it failed)
 * and `knativeerrordata` (base64 of the failed answer). On a cluster `knativeerrordest` is the
 * subscriber's URL and `knativeerrordata` its answer; where the channel's dispatcher does not
 * know the Broker's filter by name (the process world, docs/eventing-dataplane.md) they are the
 * filter's Trigger URL (`…/triggers/<ns>/<trigger>/<uid>`) and the filter's JSON
 * `{"errdestination": <subscriber URL>, "errresponsebody": <base64 of the answer>}`. Both are read.
 */
import { APISERVER_EVENT_TYPES, KEY_EVENT_TYPE, PING_EVENT_TYPE } from '../lib/cloudevents.ts';
import { jsonObject } from '../lib/json.ts';

/** The functions a dead letter can be for; `other` for any other destination. */
export const DEAD_LETTER_TARGETS = ['mirror-sync', 'identity-status', 'other'] as const;
/** One of {@link DEAD_LETTER_TARGETS}. */
export type DeadLetterTarget = (typeof DEAD_LETTER_TARGETS)[number];

/** One dead letter: a log line's fields, and metric labels from bounded sets. */
export interface DeadLetter {
  /** The event's id, at most {@link MAX_SHOWN} characters. */
  id: string;
  /** The event's type, at most {@link MAX_SHOWN} characters. */
  type: string;
  /** The object it is about: `<Kind> <namespace>/<name>` for API events, else its subject or source. */
  about: string;
  /** The Trigger that gave up, when `knativeerrordest` names one (the filter's Trigger URL). */
  trigger?: string;
  /** Where delivery failed: `errdestination` of the filter's answer, else `knativeerrordest`. */
  destination?: string;
  /** The `error` field of the failed answer when it was JSON with one (at most 200 characters). */
  error?: string;
  /** Metric labels: which function, which event type (a known one or `other`), which code (`none` when absent). */
  labels: { target: DeadLetterTarget; type: string; code: string };
}

/** Longest text taken from a dead letter into a field (its object's name may be 253 characters). */
export const MAX_SHOWN = 300;
/** Longest `error` shown. */
const MAX_ERROR = 200;
/**
 * Longest `knativeerrordata` decoded, in characters: only the failed answer's short `error`
 * is shown, and a longer one would be parsed whole for it.
 */
export const MAX_ERROR_DATA = 16 * 1024;
/** HTTP statuses counted as themselves; any other is its class (`4xx`), or `none`. */
const KNOWN_CODES: ReadonlySet<string> = new Set([
  '400',
  '401',
  '403',
  '404',
  '408',
  '409',
  '413',
  '415',
  '422',
  '429',
  '500',
  '502',
  '503',
  '504',
]);
/** Control characters and direction overrides: a log reader's terminal must not act on them. */
const UNPRINTABLE = /[\p{Cc}\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/gu;
/** Event types counted as themselves; any other is `other` (a metric label from a bounded set). */
const KNOWN_TYPES: ReadonlySet<string> = new Set([...APISERVER_EVENT_TYPES, PING_EVENT_TYPE, KEY_EVENT_TYPE]);

// A fresh copy (a short slice of a long string would keep the whole one alive in a log
// buffer), with what a terminal would act on replaced.
const cut = (s: string, max = MAX_SHOWN): string =>
  Buffer.from(s.slice(0, max)).toString().replace(UNPRINTABLE, '\uFFFD');
const str = (v: unknown): string => (typeof v === 'string' ? v : '');
const fromBase64 = (v: unknown): string =>
  typeof v === 'string' && v.length <= MAX_ERROR_DATA ? Buffer.from(v, 'base64').toString('utf8') : '';

/** A status as a metric label: a known one, else its class, else `none`. */
export function codeLabel(code: string): string {
  if (KNOWN_CODES.has(code)) return code;
  return /^[1-5]\d\d$/.test(code) ? `${code[0]}xx` : 'none';
}

/** The object an event is about, from the ApiServerSource extensions when present. */
function aboutOf(attrs: Record<string, unknown>): string {
  const [kind, namespace, name] = [str(attrs.kind), str(attrs.namespace), str(attrs.name)];
  if (kind && name) return `${kind} ${namespace ? `${namespace}/` : ''}${name}`;
  return str(attrs.subject) || str(attrs.source);
}

/** Each function a dead letter can name, and its Service's name inside a URL. */
const FUNCTION_NAMES = (['mirror-sync', 'identity-status'] as const).map((target) => ({
  target,
  host: new RegExp(`(^|[/.])captf-${target}([-./:]|$)`),
}));

/** The function a Trigger's name or a subscriber's URL points at (the manifests' `captf-<function>…` names). */
export function targetOf(trigger: string | undefined, destination: string | undefined): DeadLetterTarget {
  for (const { target, host } of FUNCTION_NAMES)
    if (trigger?.startsWith(`captf-${target}-`) || (destination && host.test(destination))) return target;
  return 'other';
}

/** Where and why delivery failed, from the error extensions (see the module's comment). */
function failureOf(attrs: Record<string, unknown>): Pick<DeadLetter, 'trigger' | 'destination' | 'error'> {
  const dest = str(attrs.knativeerrordest);
  const trigger = /\/triggers\/[^/]+\/([^/]+)\/[^/]+$/.exec(dest)?.[1];
  const data = jsonObject(fromBase64(attrs.knativeerrordata));
  const wrapped = data !== undefined && typeof data.errdestination === 'string';
  const answer = wrapped ? jsonObject(fromBase64(data.errresponsebody)) : data;
  const destination = wrapped ? str(data.errdestination) : dest;
  const error = typeof answer?.error === 'string' ? cut(answer.error, MAX_ERROR) : undefined;
  return {
    ...(trigger ? { trigger: cut(trigger) } : {}),
    ...(destination ? { destination: cut(destination) } : {}),
    ...(error ? { error } : {}),
  };
}

/**
 * Reads one dead letter from its CloudEvent attributes and extensions (lower-case names, as the
 * `cloudevents` SDK gives them). The failed answer is read for its `error` field only, and the
 * event's data not at all: a dead letter is shown without its payload.
 */
export function describeDeadLetter(attrs: Record<string, unknown>): DeadLetter {
  const failure = failureOf(attrs);
  const type = str(attrs.type);
  const code = str(attrs.knativeerrorcode);
  return {
    id: cut(str(attrs.id)),
    type: cut(type),
    about: cut(aboutOf(attrs)),
    ...failure,
    labels: {
      target: targetOf(failure.trigger, failure.destination),
      type: KNOWN_TYPES.has(type) ? type : 'other',
      code: codeLabel(code),
    },
  };
}
