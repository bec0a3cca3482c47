/**
 * CloudEvents for the fuzz: well-formed ApiServerSource, PingSource and
 * mirror-key events about objects that do not exist, and hostile ones made from them by
 * {@link mutations}, in binary, structured and batch HTTP mode. See ./hostile.ts.
 */
import fc from 'fast-check';
import { API_VERSION, IDENTITY_KIND } from '../../functions/lib/api.ts';
import { KEY_EVENT_TYPE, MAX_BATCH, PING_EVENT_TYPE } from '../../functions/lib/cloudevents.ts';
import {
  Raw,
  absentName,
  applyAll,
  contentType,
  garbageBody,
  mutations,
  weird,
  type FuzzCase,
  type HostileRequest,
} from './hostile.ts';

/** The function an event is for: they accept different kinds of object. */
export type EventTarget = 'mirror-sync' | 'identity-status';

/** One CloudEvent as a flat JSON object (structured mode's shape). */
export type EventDoc = Record<string, unknown>;

/** What an object event is about: apiVersion, kind, and whether it lives in a namespace. */
const SUBJECTS = {
  consumer: [
    { apiVersion: API_VERSION, kind: 'TerraformCluster', namespaced: true },
    { apiVersion: API_VERSION, kind: 'TerraformMachine', namespaced: true },
  ],
  identity: [{ apiVersion: API_VERSION, kind: IDENTITY_KIND, namespaced: false }],
  namespace: [{ apiVersion: 'v1', kind: 'Namespace', namespaced: false }],
};

const subjectsFor = (target: EventTarget) =>
  target === 'identity-status'
    ? SUBJECTS.identity
    : [...SUBJECTS.consumer, ...SUBJECTS.identity, ...SUBJECTS.namespace];

/** Valid extension attributes (lower-case alphanumeric names) that mean nothing to the functions. */
const extensions = fc.dictionary(
  fc
    .stringMatching(/^[a-z][a-z0-9]{0,15}$/)
    .filter((k) => !['kind', 'name', 'namespace', 'apiversion', 'data'].includes(k) && !k.startsWith('data')),
  fc.stringMatching(/^[ -~]{0,40}$/),
  { maxKeys: 3 },
);

/** A well-formed ApiServerSource event (either mode, any verb) about an object that does not exist. */
function objectEvent(target: EventTarget): fc.Arbitrary<EventDoc> {
  return fc
    .record({
      subject: fc.constantFrom(...subjectsFor(target)),
      mode: fc.constantFrom('resource', 'ref'),
      verb: fc.constantFrom('add', 'update', 'delete'),
      name: absentName,
      namespace: absentName,
      id: fc.uuid(),
      ext: extensions,
      extra: fc.dictionary(fc.constantFrom('spec', 'status', 'x'), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 2 }),
    })
    .map((r) => {
      const ns = r.subject.namespaced ? { namespace: r.namespace } : {};
      const data =
        r.mode === 'resource'
          ? {
              apiVersion: r.subject.apiVersion,
              kind: r.subject.kind,
              metadata: { name: r.name, ...ns, uid: r.id },
              ...r.extra,
            }
          : { apiVersion: r.subject.apiVersion, kind: r.subject.kind, name: r.name, ...ns };
      return {
        ...r.ext,
        specversion: '1.0',
        id: r.id,
        source: 'https://127.0.0.1:6443',
        type: `dev.knative.apiserver.${r.mode}.${r.verb}`,
        datacontenttype: 'application/json',
        kind: r.subject.kind,
        name: r.name,
        ...ns,
        apiversion: r.subject.apiVersion,
        data,
      };
    });
}

/** A ping (identity-status only: mirror-sync's would resync the whole shared control plane). */
const pingEvent = fc.tuple(fc.uuid(), extensions).map(([id, ext]) => ({
  ...ext,
  specversion: '1.0',
  id,
  source: '/apis/v1/namespaces/captf-system/pingsources/fuzz',
  type: PING_EVENT_TYPE,
  datacontenttype: 'application/json',
  data: {},
}));

/** A mirror-sync key event about a key with nothing in it. */
const keyEvent = fc.tuple(fc.uuid(), absentName, absentName).map(([id, namespace, identity]) => ({
  specversion: '1.0',
  id,
  source: 'captf-credentials/mirror-sync/resync',
  type: KEY_EVENT_TYPE,
  datacontenttype: 'application/json',
  data: { namespace, identity },
}));

/** A well-formed event for `target` about something that does not exist. */
export function goodEvent(target: EventTarget): fc.Arbitrary<EventDoc> {
  return target === 'identity-status'
    ? fc.oneof({ arbitrary: objectEvent(target), weight: 4 }, { arbitrary: pingEvent, weight: 1 })
    : fc.oneof({ arbitrary: objectEvent(target), weight: 4 }, { arbitrary: keyEvent, weight: 1 });
}

/** Paths of an event a mutation may hit: attributes, data, and names that are not valid attribute names. */
export const EVENT_PATHS: readonly (readonly string[])[] = [
  ['specversion'],
  ['id'],
  ['source'],
  ['type'],
  ['subject'],
  ['time'],
  ['datacontenttype'],
  ['dataschema'],
  ['data'],
  ['data_base64'],
  ['data', 'apiVersion'],
  ['data', 'kind'],
  ['data', 'name'],
  ['data', 'namespace'],
  ['data', 'identity'],
  ['data', 'metadata'],
  ['data', 'metadata', 'name'],
  ['data', 'metadata', 'namespace'],
  ['data', 'metadata', 'labels'],
  ['kind'],
  ['name'],
  ['namespace'],
  ['apiversion'],
  ['Bad-Name'],
  ['UPPER'],
  ['x'.repeat(300)],
];

/** How an event goes over HTTP. */
export type Mode = 'binary' | 'structured' | 'batch';

/** A header value Node's client will send (tab, printable ASCII, Latin-1); other characters become `?`. */
function headerValue(v: unknown): string {
  const text =
    v instanceof Raw ? v.bytes.subarray(0, 8_192).toString('latin1') : typeof v === 'string' ? v : JSON.stringify(v);
  return (text ?? '').replace(/[^\t\x20-\x7e\x80-\xff]/g, '?');
}

/** A header name Node's client will send, or undefined. */
const headerName = (k: string): string | undefined =>
  /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(`ce-${k}`) ? `ce-${k}` : undefined;

/** Binary mode: attributes as `ce-` headers, `data` as the body with `datacontenttype` as its type. */
export function binary(doc: EventDoc): { headers: Record<string, string>; body: unknown } {
  const headers: Record<string, string> = {};
  for (const [k, v] of Object.entries(doc)) {
    if (k === 'data' || k === 'datacontenttype' || v === undefined) continue;
    const name = headerName(k);
    if (name) headers[name] = headerValue(v);
  }
  if (doc.datacontenttype !== undefined) headers['content-type'] = headerValue(doc.datacontenttype);
  return { headers, body: doc.data === undefined ? new Raw('', 'no data') : doc.data };
}

/** An HTTP request carrying `docs` in `mode` (binary and structured send the first). */
export function eventRequest(docs: readonly unknown[], mode: Mode, reply: boolean): HostileRequest {
  const prefer: Record<string, string> = reply ? { prefer: 'reply' } : {};
  if (mode === 'binary') {
    const first = docs[0];
    const { headers, body } =
      typeof first === 'object' && first !== null && !(first instanceof Raw) && !Array.isArray(first)
        ? binary(first as EventDoc)
        : { headers: {}, body: first };
    return { method: 'POST', path: '/', headers: { ...headers, ...prefer }, body };
  }
  const type = mode === 'batch' ? 'application/cloudevents-batch+json' : 'application/cloudevents+json';
  return {
    method: 'POST',
    path: '/',
    headers: { 'content-type': type, ...prefer },
    body: mode === 'batch' ? [...docs] : docs[0],
  };
}

const mode = fc.constantFrom<Mode>('binary', 'structured', 'batch');

/** Well-formed events about objects that do not exist, in any mode: a 2xx is expected. */
export function wellFormedEvents(target: EventTarget): fc.Arbitrary<FuzzCase> {
  return fc
    .tuple(fc.array(goodEvent(target), { minLength: 1, maxLength: 4 }), mode, fc.boolean())
    .map(([docs, m, reply]) => ({ kind: `well-formed ${m}`, expect: 'ok', request: eventRequest(docs, m, reply) }));
}

/** One event with mutations applied. */
const mutatedEvent = (target: EventTarget) =>
  fc.tuple(goodEvent(target), mutations(EVENT_PATHS)).map(([doc, m]) => applyAll(doc, m));

/** Hostile events: mutated ones in any mode, batches mixing good and bad, oversized and non-array batches, garbage. */
export function hostileEvents(target: EventTarget): fc.Arbitrary<FuzzCase> {
  const hostile = (kind: string, request: HostileRequest): FuzzCase => ({ kind, expect: 'no-5xx', request });
  return fc.oneof(
    {
      weight: 6,
      arbitrary: fc
        .tuple(
          fc.array(fc.oneof(mutatedEvent(target), goodEvent(target)), { minLength: 1, maxLength: 4 }),
          mode,
          fc.boolean(),
        )
        .map(([docs, m, reply]) => hostile(`mutated ${m}`, eventRequest(docs, m, reply))),
    },
    {
      weight: 1,
      arbitrary: fc
        .tuple(goodEvent(target), fc.constantFrom(0, MAX_BATCH + 1))
        .map(([doc, n]) => hostile(`batch of ${n}`, eventRequest(Array(n).fill(doc), 'batch', false))),
    },
    {
      weight: 1,
      arbitrary: fc
        .tuple(fc.oneof(weird, garbageBody), fc.constantFrom<Mode>('structured', 'batch'))
        .map(([body, m]) => hostile(`not an event (${m})`, { ...eventRequest([body], m, false), body })),
    },
    {
      weight: 2,
      arbitrary: fc
        .tuple(goodEvent(target), mode, contentType, fc.option(garbageBody, { nil: undefined }))
        .map(([doc, m, type, body]) => {
          const req = eventRequest([doc], m, false);
          const headers = { ...req.headers };
          if (type === undefined) delete headers['content-type'];
          else headers['content-type'] = type;
          return hostile(`content type (${m}: ${type ?? 'none'})`, { ...req, headers, body: body ?? req.body });
        }),
    },
  );
}

/** A known-good event between hostile cases: a reference-mode update about a consumer or identity that does not exist. */
export function knownGoodEvent(target: EventTarget, id: string): HostileRequest {
  const kind = target === 'identity-status' ? IDENTITY_KIND : 'TerraformCluster';
  const ns = target === 'identity-status' ? {} : { namespace: 'fz-known-good' };
  return eventRequest(
    [
      {
        specversion: '1.0',
        id,
        source: 'https://127.0.0.1:6443',
        type: 'dev.knative.apiserver.ref.update',
        datacontenttype: 'application/json',
        data: { apiVersion: API_VERSION, kind, name: 'fz-known-good', ...ns },
      },
    ],
    'binary',
    false,
  );
}

/**
 * `Authorization` headers for prepare: mostly the caller's own (so the body is looked at),
 * sometimes none, another scheme, a truncated or extended token, or printable junk (401s).
 */
const prepareAuthorization = (authorization: string): fc.Arbitrary<string | undefined> =>
  fc.oneof(
    { arbitrary: fc.constant(authorization), weight: 6 },
    {
      arbitrary: fc.constantFrom(
        undefined,
        'Basic dXNlcjpwYXNz',
        'Bearer',
        authorization.slice(0, -5),
        `${authorization} extra`,
        'Bearer bm90LWEtdG9rZW4',
      ),
      weight: 3,
    },
    { arbitrary: fc.string({ unit: 'grapheme-ascii', maxLength: 300 }).map((t) => `Bearer ${t}`), weight: 1 },
  );

/**
 * Requests for mirror-sync's `POST /prepare` (SPEC §5): well-formed bodies about objects that
 * do not exist (404 once authorized), mutated ones and garbage, with the caller's
 * `Authorization` header or a missing or broken one (401).
 * @param authorization `Bearer <token>` of a caller allowed to prepare (scripts/lib/serviceaccount.ts `prepareCaller`).
 */
export const hostilePrepare = (authorization: string): fc.Arbitrary<FuzzCase> =>
  fc
    .tuple(
      fc.record({
        apiVersion: fc.constant(API_VERSION),
        kind: fc.constantFrom('TerraformCluster', 'TerraformMachine'),
        namespace: absentName,
        name: absentName,
      }),
      fc.option(mutations([['apiVersion'], ['kind'], ['namespace'], ['name'], ['extra']]), { nil: undefined }),
      fc.option(garbageBody, { nil: undefined }),
      contentType,
      prepareAuthorization(authorization),
    )
    .map(([good, m, garbage, type, auth]): FuzzCase => ({
      kind: garbage ? 'prepare garbage' : m ? 'prepare mutated' : 'prepare absent object',
      expect: 'no-5xx',
      request: {
        method: 'POST',
        path: '/prepare',
        headers: { ...(type ? { 'content-type': type } : {}), ...(auth !== undefined ? { authorization: auth } : {}) },
        body: garbage ?? (m ? applyAll(good, m) : good),
      },
    }));
