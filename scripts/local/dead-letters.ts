/**
 * The local stand-in for the manifests' dead-letter Service `captf-dead-letters` (Knative's
 * event-display in a cluster, which logs every event it gets): a plain HTTP server on the
 * loopback interface that takes each CloudEvent Knative's dispatcher dead-letters — after a
 * Trigger's last retry, or at once for a 4xx other than 404, 408, 409 and 429 — answers 202
 * with no body, and reports what a reader needs: the event's type and object, and Knative's
 * error extensions (`knativeerrorcode`, `knativeerrordest`, `knativeerrordata`).
 *
 * Locally the dispatcher does not recognise the Broker's filter by its Service host name, so
 * `knativeerrordest` is the filter's Trigger URL (`…/triggers/<ns>/<trigger>/<uid>`) and
 * `knativeerrordata` is the base64 of the filter's JSON answer
 * `{"errdestination": <subscriber URL>, "errresponsebody": <base64 of the subscriber's answer>}`
 * (docs/eventing-dataplane.md); in a cluster they are the subscriber's URL and answer. Both
 * forms are read.
 */
import { createServer, type IncomingHttpHeaders } from 'node:http';
import { jsonObject } from './print.ts';

/** What one dead letter says, for one printed line. */
export interface DeadLetter {
  /** The event's CloudEvents type. */
  type: string;
  /** The object it is about: `<Kind> <namespace>/<name>` for API events, else its subject or source. */
  about: string;
  /** `knativeerrorcode`: the last HTTP status of the delivery (empty when Knative sent none). */
  code: string;
  /** The Trigger that gave up, when `knativeerrordest` names one (the local filter URL). */
  trigger?: string;
  /** The subscriber that failed: `errdestination` of the filter's answer, else `knativeerrordest`. */
  destination?: string;
  /** The `error` field of the subscriber's JSON answer, when it had one (at most 200 characters). */
  error?: string;
}

const fromBase64 = (s: unknown): string => (typeof s === 'string' ? Buffer.from(s, 'base64').toString('utf8') : '');
const str = (v: unknown): string => (typeof v === 'string' ? v : v === undefined ? '' : String(v));

/** The object an event is about, from the ApiServerSource extensions when present. */
function aboutOf(attrs: Record<string, unknown>): string {
  const [kind, namespace, name] = [str(attrs.kind), str(attrs.namespace), str(attrs.name)];
  if (kind && name) return `${kind} ${namespace ? `${namespace}/` : ''}${name}`;
  return str(attrs.subject) || str(attrs.source);
}

/**
 * Reads a dead letter's attributes (a CloudEvent's attributes and extensions, lower case).
 * The subscriber's answer is read for its `error` field only: nothing else of it is shown.
 */
export function describeDeadLetter(attrs: Record<string, unknown>): DeadLetter {
  const dest = str(attrs.knativeerrordest);
  const trigger = /\/triggers\/[^/]+\/([^/]+)\/[^/]+$/.exec(dest)?.[1];
  // In a cluster knativeerrordata is the subscriber's answer itself; locally the filter's JSON wraps it.
  const data = jsonObject(fromBase64(attrs.knativeerrordata));
  const wrapped = data && typeof data.errdestination === 'string';
  const answer = wrapped ? jsonObject(fromBase64(data.errresponsebody)) : data;
  const error = typeof answer?.error === 'string' ? answer.error.slice(0, 200) : undefined;
  return {
    type: str(attrs.type),
    about: aboutOf(attrs),
    code: str(attrs.knativeerrorcode),
    ...(trigger ? { trigger } : {}),
    ...(wrapped ? { destination: str(data.errdestination) } : dest ? { destination: dest } : {}),
    ...(error ? { error } : {}),
  };
}

/**
 * The CloudEvent attributes of a request: the `ce-*` headers in binary mode (how the
 * dispatcher sends), the JSON body's top-level strings in structured mode.
 */
export function attributesOf(headers: IncomingHttpHeaders, body: string): Record<string, unknown> {
  if (String(headers['content-type'] ?? '').startsWith('application/cloudevents+json')) return jsonObject(body) ?? {};
  const attrs: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(headers)) if (k.startsWith('ce-')) attrs[k.slice(3)] = String(v);
  return attrs;
}

/** A running dead-letter sink. */
export interface DeadLetterSink {
  /** `http://127.0.0.1:<port>/`: the URL the Broker's and Triggers' `deadLetterSink` resolves to. */
  url: string;
  stop(): Promise<void>;
}

/**
 * Starts the sink on a free loopback port; `onLetter` gets each dead letter (a request that is
 * not a CloudEvent is answered 202 too, and reported with what could be read of it).
 */
export async function startDeadLetterSink(onLetter: (d: DeadLetter) => void): Promise<DeadLetterSink> {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      res.writeHead(202).end();
      onLetter(describeDeadLetter(attributesOf(req.headers, Buffer.concat(chunks).toString('utf8'))));
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}/`,
    stop: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
