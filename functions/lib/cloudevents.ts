/**
 * Incoming CloudEvents (SPEC §12) → typed requests. Accepts CloudEvents 1.0 in binary,
 * structured and batch HTTP mode (the `cloudevents` SDK parses; this module validates and
 * classifies). The payload only names what to reconcile; handlers re-read state.
 *
 * Event shapes (Knative ApiServerSource, PingSource):
 * - `dev.knative.apiserver.resource.{add,update,delete}`: data = the object (last state on delete)
 * - `dev.knative.apiserver.ref.{add,update,delete}`: data = `{apiVersion, kind, name, namespace}`
 * - `dev.knative.sources.ping`: a periodic tick (resync / refresh)
 */
import { CloudEvent, HTTP, ValidationError } from 'cloudevents';
import { isDns1123Label, isDns1123Subdomain } from './allowed-namespaces.ts';
import { API_VERSION, IDENTITY_KIND, type ConsumerKind } from './api.ts';

/** CloudEvent type prefix of ApiServerSource Resource mode. */
export const RESOURCE_EVENT_PREFIX = 'dev.knative.apiserver.resource.';
/** CloudEvent type prefix of ApiServerSource Reference mode. */
export const REF_EVENT_PREFIX = 'dev.knative.apiserver.ref.';
/** CloudEvent type of a PingSource tick. */
export const PING_EVENT_TYPE = 'dev.knative.sources.ping';
/**
 * CloudEvent type of one mirror key sent by a resync in fan-out mode (`K_SINK`), data
 * `{namespace, identity}`; a Trigger routes it back to mirror-sync (SPEC §12).
 */
export const KEY_EVENT_TYPE = 'io.captf.mirror-sync.key';
/** Every ApiServerSource event type, both modes. */
export const APISERVER_EVENT_TYPES: readonly string[] = ['add', 'update', 'delete'].flatMap((v) => [
  `${RESOURCE_EVENT_PREFIX}${v}`,
  `${REF_EVENT_PREFIX}${v}`,
]);

/** Which object an ApiServerSource event is about. */
export interface ObjectRef {
  apiVersion: string;
  kind: string;
  name: string;
  namespace?: string | undefined;
  /** Known in Resource mode (data carries metadata.uid); absent in Reference mode. */
  uid?: string | undefined;
}

/** What one CloudEvent asks for. */
export type EventRequest =
  | { type: 'ping'; id: string }
  | { type: 'key'; id: string; namespace: string; identity: string }
  | {
      type: 'object';
      id: string;
      /** add / update / delete, from the event type. */
      verb: 'add' | 'update' | 'delete';
      mode: 'resource' | 'ref';
      target: 'consumer' | 'identity' | 'namespace' | 'secret' | 'other';
      ref: ObjectRef;
      /** The object's labels in Resource mode (used by the Secret fast path). */
      labels?: Record<string, string> | undefined;
    };

/** A CloudEvent the function cannot use; answered with 4xx. */
export class BadEventError extends Error {}

/** Most events one batch request may carry (a bigger batch is refused whole, SPEC §15). */
export const MAX_BATCH = 100;

const BATCH_CONTENT_TYPE = 'application/cloudevents-batch+json';

function flatHeaders(headers: Record<string, string | string[] | undefined>): Record<string, string> {
  const flat: Record<string, string> = {};
  for (const [k, v] of Object.entries(headers))
    if (v !== undefined) flat[k.toLowerCase()] = Array.isArray(v) ? v.join(',') : v;
  // Media types are case-insensitive (RFC 9110); the SDK compares them as written.
  if (flat['content-type'] !== undefined) flat['content-type'] = flat['content-type'].toLowerCase();
  return flat;
}

function checked(e: CloudEvent<unknown>): CloudEvent<unknown> {
  try {
    // The SDK builds events without validating them; enforce CloudEvents 1.0 here.
    e.validate();
  } catch (err) {
    throw new BadEventError(`invalid CloudEvent: ${eventErrorText(err)}`);
  }
  if (e.specversion !== '1.0')
    throw new BadEventError(`CloudEvents specversion ${shown(e.specversion)} is not supported (use 1.0)`);
  return e;
}

/**
 * Reads every CloudEvent of an HTTP request (binary, structured or batch mode), keeping the
 * good events of a batch when some are bad.
 * @param headers request headers (any case); @param body raw request body as text.
 * @returns the valid events and one message per invalid batch element.
 * @throws BadEventError when the request as a whole is unusable: no CloudEvent, invalid
 *   JSON, a batch that is not a JSON array or holds more than {@link MAX_BATCH} events.
 */
export function readCloudEvents(
  headers: Record<string, string | string[] | undefined>,
  body: string,
): { events: CloudEvent<unknown>[]; errors: string[] } {
  const flat = flatHeaders(headers);
  if ((flat['content-type'] ?? '').startsWith(BATCH_CONTENT_TYPE)) {
    let list: unknown;
    try {
      list = JSON.parse(body);
    } catch {
      throw new BadEventError('not a CloudEvent: batch body is not valid JSON');
    }
    if (!Array.isArray(list)) throw new BadEventError('not a CloudEvent: a batch must be a JSON array of events');
    if (list.length === 0) throw new BadEventError('empty CloudEvents batch');
    if (list.length > MAX_BATCH)
      throw new BadEventError(`batch holds ${list.length} events; at most ${MAX_BATCH} are accepted per request`);
    const events: CloudEvent<unknown>[] = [];
    const errors: string[] = [];
    list.forEach((item: unknown, i: number) => {
      try {
        if (typeof item !== 'object' || item === null || Array.isArray(item))
          throw new BadEventError('invalid CloudEvent: not a JSON object');
        const problem = attributeProblem(item as Record<string, unknown>, 'invalid CloudEvent:');
        if (problem) throw new BadEventError(problem);
        events.push(checked(new CloudEvent<unknown>(item as CloudEvent<unknown>, false)));
      } catch (err) {
        errors.push(`batch[${i}]: ${err instanceof BadEventError ? err.message : eventErrorText(err)}`);
      }
    });
    return { events, errors };
  }
  const missing = missingAttributes(flat, body);
  if (missing) throw new BadEventError(`not a CloudEvent: ${missing}`);
  let parsed: CloudEvent<unknown>;
  try {
    parsed = HTTP.toEvent({ headers: flat, body }) as CloudEvent<unknown>;
  } catch (err) {
    throw new BadEventError(`not a CloudEvent: ${eventErrorText(err)}`);
  }
  return { events: [checked(parsed)], errors: [] };
}

/** A value for a message: a string (at most 80 characters), anything else by its type (`String()` of a deep array overflows the stack). */
const shown = (v: unknown): string =>
  typeof v === 'string' ? v.slice(0, 80) : Array.isArray(v) ? '(array)' : `(${typeof v})`;

/**
 * Members of a JSON event other than `data` that are objects or arrays: CloudEvents
 * attributes are scalars, and such a value nested thousands of levels deep would overflow the
 * stack of the SDK's validation and of any message quoting it.
 */
const nonScalarAttributes = (doc: Record<string, unknown>): string[] =>
  Object.entries(doc)
    .filter(([k, v]) => k !== 'data' && typeof v === 'object' && v !== null)
    .map(([k]) => JSON.stringify(k.slice(0, 40)));

/**
 * Most attributes one JSON event may have: Knative's events carry about a dozen, and the SDK
 * copies and checks each one (hundreds of thousands of them fill a function's heap).
 */
export const MAX_ATTRIBUTES = 100;

/** Why a JSON event's attributes are unusable (absent, too many, or not scalars), or undefined. */
function attributeProblem(doc: Record<string, unknown>, what: string): string | undefined {
  const count = Object.keys(doc).length;
  if (count > MAX_ATTRIBUTES) return `${what} has ${count} attributes; at most ${MAX_ATTRIBUTES} are accepted`;
  const absent = absentAttributes(doc);
  if (absent.length) return `${what} lacks required attribute(s) ${absent.join(', ')}`;
  const nonScalar = nonScalarAttributes(doc);
  if (nonScalar.length)
    return `${what} has attribute(s) ${nonScalar.slice(0, 5).join(', ')} that are not strings, numbers or booleans`;
  return undefined;
}

/** The attributes CloudEvents 1.0 requires of every event. */
const REQUIRED_ATTRIBUTES = ['id', 'source', 'type', 'specversion'] as const;

/** Required attributes absent, null or empty in a JSON event (the SDK would invent an id or a specversion). */
const absentAttributes = (doc: Record<string, unknown>): string[] =>
  REQUIRED_ATTRIBUTES.filter((a) => doc[a] === undefined || doc[a] === null || doc[a] === '');

/**
 * Names the required attributes a request that tries to be one event lacks (the SDK only
 * says "no cloud event detected"): binary mode when it has any `ce-` header, structured
 * mode when its content type is `application/cloudevents+json`. Undefined when none is
 * missing or the request is neither (the SDK then says so).
 */
function missingAttributes(flat: Record<string, string>, body: string): string | undefined {
  const contentType = flat['content-type'] ?? '';
  if (contentType.startsWith('application/cloudevents+json')) {
    let doc: unknown;
    try {
      doc = JSON.parse(body);
    } catch {
      return undefined;
    }
    // The SDK makes every member of what it parsed an attribute: a string's characters or an
    // array's elements too (a 1 MB string of quotes held 150 MB of heap).
    if (typeof doc !== 'object' || doc === null || Array.isArray(doc))
      return 'a structured-mode event must be a JSON object';
    return attributeProblem(doc as Record<string, unknown>, 'structured-mode event');
  }
  if (!Object.keys(flat).some((h) => h.startsWith('ce-'))) return undefined;
  const absent = REQUIRED_ATTRIBUTES.map((a) => `ce-${a}`).filter((h) => !flat[h]);
  return absent.length ? `binary-mode event lacks required header(s) ${absent.join(', ')}` : undefined;
}

/**
 * Parses an HTTP request into CloudEvents (binary, structured or batch), strictly.
 * @returns one event per CloudEvent (a batch yields several).
 * @throws BadEventError naming what is wrong (no CloudEvent, invalid JSON, missing required
 *   attributes — in any element of a batch — or an oversized batch).
 */
export function parseCloudEvents(
  headers: Record<string, string | string[] | undefined>,
  body: string,
): CloudEvent<unknown>[] {
  const { events, errors } = readCloudEvents(headers, body);
  if (errors.length > 0) throw new BadEventError(errors.join('; '));
  return events;
}

function eventErrorText(err: unknown): string {
  if (err instanceof ValidationError) {
    // ajv errors → "type: must have required property" style, never raw JSON.
    const details = (err.errors ?? []).map((x) => {
      if (typeof x === 'string') return x.split('\n')[0];
      const e = x as { instancePath?: string; message?: string; params?: { missingProperty?: string } };
      return e.params?.missingProperty
        ? `missing required attribute ${e.params.missingProperty}`
        : `${e.instancePath || 'event'} ${e.message ?? 'is invalid'}`;
    });
    return [err.message.split('\n')[0], ...details].join('; ').slice(0, 300);
  }
  if (err instanceof SyntaxError) return 'body is not valid JSON';
  return (err instanceof Error ? err.message : String(err)).split('\n')[0]!.slice(0, 300);
}

function dataObject(event: CloudEvent<unknown>): Record<string, unknown> {
  let data: unknown = event.data;
  if (data === undefined && typeof event.data_base64 === 'string')
    data = Buffer.from(event.data_base64, 'base64').toString('utf8');
  if (typeof data === 'string' || Buffer.isBuffer(data)) {
    try {
      data = JSON.parse(data.toString());
    } catch {
      throw new BadEventError(`event ${event.type}: data is not JSON`);
    }
  }
  if (typeof data !== 'object' || data === null || Array.isArray(data))
    throw new BadEventError(`event ${event.type}: data must be a JSON object`);
  return data as Record<string, unknown>;
}

const str = (v: unknown): string | undefined => (typeof v === 'string' && v !== '' ? v : undefined);

/**
 * Classifies one CloudEvent.
 * @param consumerKinds configured consumer kinds (SPEC §1).
 * @returns a ping, or an object event naming its target (consumer, identity, namespace,
 *   secret, or other).
 * @throws BadEventError for unknown event types or data that names no object.
 */
export function classifyEvent(event: CloudEvent<unknown>, consumerKinds: readonly ConsumerKind[]): EventRequest {
  if (event.type === PING_EVENT_TYPE) return { type: 'ping', id: event.id };
  if (event.type === KEY_EVENT_TYPE) return classifyKeyEvent(event);
  const { mode, verb } = objectEventType(event.type);
  const data = dataObject(event);
  const ref = mode === 'resource' ? refFromResource(data) : refFromReference(data);
  fillFromExtensions(ref, event as unknown as Record<string, unknown>);
  checkRef(ref, event.type, mode);
  const md = data.metadata as Record<string, unknown> | undefined;
  const labels =
    mode === 'resource' && typeof md?.labels === 'object' && md.labels !== null
      ? (md.labels as Record<string, string>)
      : undefined;
  return { type: 'object', id: event.id, verb, mode, target: targetOf(ref, consumerKinds), ref, labels };
}

/** A mirror-sync key event: data `{namespace, identity}`, both valid names. */
function classifyKeyEvent(event: CloudEvent<unknown>): EventRequest {
  const d = dataObject(event);
  const namespace = str(d.namespace) ?? '';
  const identity = str(d.identity) ?? '';
  if (!isDns1123Label(namespace) || !isDns1123Subdomain(identity)) {
    throw new BadEventError(
      `event ${event.type}: data must be {"namespace": <namespace name>, "identity": <identity name>}`,
    );
  }
  return { type: 'key', id: event.id, namespace, identity };
}

/** ApiServerSource's `dev.knative.apiserver.{resource,ref}.{add,update,delete}`, split. */
function objectEventType(type: string): { mode: 'resource' | 'ref'; verb: 'add' | 'update' | 'delete' } {
  const mode = type.startsWith(RESOURCE_EVENT_PREFIX)
    ? 'resource'
    : type.startsWith(REF_EVENT_PREFIX)
      ? 'ref'
      : undefined;
  if (!mode) {
    throw new BadEventError(
      `unsupported event type ${JSON.stringify(type)} (expected ${PING_EVENT_TYPE}, ${KEY_EVENT_TYPE} or dev.knative.apiserver.{resource,ref}.{add,update,delete})`,
    );
  }
  const verb = type.slice((mode === 'resource' ? RESOURCE_EVENT_PREFIX : REF_EVENT_PREFIX).length);
  if (verb !== 'add' && verb !== 'update' && verb !== 'delete')
    throw new BadEventError(`unsupported event type ${JSON.stringify(type)}`);
  return { mode, verb };
}

/** Resource mode: the object itself. */
function refFromResource(data: Record<string, unknown>): ObjectRef {
  const md = (data.metadata ?? {}) as Record<string, unknown>;
  return {
    apiVersion: str(data.apiVersion) ?? '',
    kind: str(data.kind) ?? '',
    name: str(md.name) ?? '',
    namespace: str(md.namespace),
    uid: str(md.uid),
  };
}

/** Reference mode: an ObjectReference. */
function refFromReference(data: Record<string, unknown>): ObjectRef {
  return {
    apiVersion: str(data.apiVersion) ?? '',
    kind: str(data.kind) ?? '',
    name: str(data.name) ?? '',
    namespace: str(data.namespace),
    uid: str(data.uid),
  };
}

/** ApiServerSource also carries kind/name/namespace as extensions; fill gaps from them. */
function fillFromExtensions(ref: ObjectRef, ext: Record<string, unknown>): void {
  ref.kind ||= str(ext.kind) ?? '';
  ref.name ||= str(ext.name) ?? '';
  ref.apiVersion ||= str(ext.apiversion) ?? '';
  ref.namespace ??= str(ext.namespace);
}

/**
 * The object must be named, and names end up in API paths and field selectors: only valid
 * Kubernetes names get through (".." would otherwise turn a namespaced call into a cluster-wide one).
 */
function checkRef(ref: ObjectRef, type: string, mode: 'resource' | 'ref'): void {
  if (!ref.apiVersion || !ref.kind || !ref.name) {
    throw new BadEventError(
      `event ${type}: data must name the object (apiVersion, kind, name${mode === 'resource' ? ' under metadata' : ''})`,
    );
  }
  if (!isDns1123Subdomain(ref.name))
    throw new BadEventError(
      `event ${type}: name ${JSON.stringify(ref.name).slice(0, 80)} is not a valid Kubernetes object name`,
    );
  if (ref.namespace !== undefined && !isDns1123Label(ref.namespace))
    throw new BadEventError(
      `event ${type}: namespace ${JSON.stringify(ref.namespace).slice(0, 80)} is not a valid namespace name`,
    );
}

/** Which kind of object a reference names. */
export function targetOf(
  ref: Pick<ObjectRef, 'apiVersion' | 'kind'>,
  consumerKinds: readonly ConsumerKind[],
): 'consumer' | 'identity' | 'namespace' | 'secret' | 'other' {
  if (ref.apiVersion === 'v1' && ref.kind === 'Namespace') return 'namespace';
  if (ref.apiVersion === 'v1' && ref.kind === 'Secret') return 'secret';
  if (ref.apiVersion === API_VERSION && ref.kind === IDENTITY_KIND) return 'identity';
  if (consumerKinds.some((k) => `${k.group}/${k.version}` === ref.apiVersion && k.kind === ref.kind)) return 'consumer';
  return 'other';
}

/**
 * SPEC §12's batch policy, for every function: reads a request's CloudEvents and classifies
 * each on its own, so a bad element never drops the good ones.
 * @returns the usable requests and one message per unusable event (malformed batch element,
 *   unknown type, data naming no object).
 * @throws BadEventError when the request as a whole is unusable (see {@link readCloudEvents}).
 */
export function readEventRequests(
  headers: Record<string, string | string[] | undefined>,
  body: string,
  consumerKinds: readonly ConsumerKind[],
): { requests: EventRequest[]; bad: string[] } {
  const read = readCloudEvents(headers, body);
  const bad = [...read.errors];
  const requests: EventRequest[] = [];
  for (const e of read.events) {
    try {
      requests.push(classifyEvent(e, consumerKinds));
    } catch (err) {
      if (err instanceof BadEventError) bad.push(err.message);
      else throw err;
    }
  }
  return { requests, bad };
}
