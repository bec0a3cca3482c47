/**
 * The one place where an error of a call to the API server becomes text (SPEC §15).
 *
 * Everything the API server, or anything between it and us (a proxy, a load balancer, an
 * admission webhook or policy), writes into an answer is untrusted: it may echo our request
 * headers (the ServiceAccount token) or the Secret data a webhook saw. So the text of an
 * error is built only from what the product knows itself — the request it made (verb,
 * resource, namespace, name: {@link RequestAttributes}) and its own user — plus words that
 * Kubernetes defines:
 * - the HTTP code, and the Status `reason` when it is a `metav1.StatusReason`;
 * - Status `details` only where they equal what was asked (the name a create sent);
 * - field causes by `field` (syntactically a field path, bounded) and type (a
 *   `metav1.CauseType`), never their message;
 * - for a 403, the server's sentence only when it is exactly the one kube-apiserver's
 *   authorizer writes for this user and request ({@link rbacForbiddenMessages});
 * - for a transport failure, its error codes (an allow-list, or `^[A-Z][A-Z0-9_]{2,60}$`).
 * Never the Status `message`, a non-Status body (an HTML error page), request options,
 * URLs or headers. The one thing read from an answer's headers is the wait a `Retry-After`
 * asks for, as a number ({@link retryAfterOf}).
 *
 * What was asked is recorded by the HTTP layer of {@link makeClients} (kube.ts) for each
 * failed request ({@link rememberRequest}), so every caller of {@link describeError} gets it
 * without passing it; a caller may pass it explicitly for clients built elsewhere.
 */
import { X509Certificate } from 'node:crypto';
import { parseRetryAfter } from './retry-after.ts';

/**
 * One request as the API server's authorizer sees it (k8s.io/apiserver
 * pkg/endpoints/request/requestinfo.go `RequestInfo`), built from the product's own URL.
 */
export interface RequestAttributes {
  /** get, list, watch, create, update, patch, delete, deletecollection. */
  verb: string;
  /** API group; '' for the core group. */
  group: string;
  /** Plural resource, e.g. `secrets`. */
  resource: string;
  /** e.g. `status`; '' when none. */
  subresource: string;
  /** '' when cluster-scoped (or a list across namespaces). */
  namespace: string;
  /** The name in the URL; '' for a create or a list. */
  name: string;
  /** `metadata.name` of the object a create sent (an answer's `details.name` may repeat it). */
  objectName?: string;
  /** The field names (keys at any depth) of the body it sent: a cause's field path must be made of them. */
  fields?: readonly string[];
  /** The product's own user (read from its own credentials: kube.ts `whoAmI`), known for a 403. */
  user?: string;
}

/** HTTP status of an API error (`ApiException.code`, or a `statusCode`) when it is an HTTP code, else undefined. */
export function apiStatus(err: unknown): number | undefined {
  if (typeof err !== 'object' || err === null) return undefined;
  const e = err as { code?: unknown; statusCode?: unknown };
  for (const c of [e.code, e.statusCode]) {
    // A DOMException's `code` is a number too (AbortError 20): only HTTP codes count.
    if (typeof c === 'number' && Number.isInteger(c) && c >= 100 && c <= 599) return c;
  }
  return undefined;
}

/** An API error reduced to what {@link describeError} keeps: code, Kubernetes-defined cause types, safe text. */
export class RedactedApiError extends Error {
  readonly code: number | undefined;
  /** The Status's `details.causes[].reason` values that are `metav1.CauseType`s (e.g. `NamespaceTerminating`). */
  readonly causes: readonly string[];
  /** The wait the answer's `Retry-After` asked for, in seconds ({@link retryAfterOf}); undefined for none. */
  readonly retryAfterSeconds: number | undefined;
  /**
   * @param code HTTP status kept so `isConflict`/`isNotFound` still work.
   * @param message safe text (from {@link describeError}).
   * @param causes cause types kept from the Status.
   * @param retryAfterSeconds the wait kept from the answer's `Retry-After`.
   */
  constructor(code: number | undefined, message: string, causes: readonly string[] = [], retryAfterSeconds?: number) {
    super(message);
    this.code = code;
    this.causes = causes;
    this.retryAfterSeconds = retryAfterSeconds;
  }
}

/**
 * The wait, in seconds, that the answer of a failed API call asks for with `Retry-After`
 * (retry-after.ts `parseRetryAfter`: delay-seconds or an HTTP-date), read only from a 429 or
 * 5xx answer as client-go does (k8s.io/client-go rest/with_retry.go `checkWait`): the API
 * server sends it when it throttles (priority and fairness, max-in-flight) or times out. A
 * {@link RedactedApiError} keeps the wait of the error it replaced.
 * @param now milliseconds since the epoch, for an HTTP-date (default: the current time).
 * @returns seconds ≥ 0 (not capped), or undefined when the answer asks for no wait.
 */
export function retryAfterOf(err: unknown, now: number = Date.now()): number | undefined {
  if (err instanceof RedactedApiError) return err.retryAfterSeconds;
  const status = apiStatus(err);
  if (status === undefined || (status !== 429 && status < 500)) return undefined;
  const headers = (err as { headers?: unknown }).headers;
  if (typeof headers !== 'object' || headers === null) return undefined;
  // client-node's fetch library names the headers in lower case; a hand-made error may not.
  const name = Object.keys(headers).find((k) => k.toLowerCase() === 'retry-after');
  return name === undefined ? undefined : parseRetryAfter((headers as Record<string, unknown>)[name], now);
}

const asked = new WeakMap<object, RequestAttributes | (() => RequestAttributes | undefined)>();

/**
 * Records what the product asked, for a failed request: `target` is the answer's headers
 * object (client-node hands that very object to the `ApiException` it throws) or the
 * transport error itself. `attributes` may be a function, called once when the error is
 * first described (most failed requests, 404s and 409s, never are).
 */
export function rememberRequest(
  target: object,
  attributes: RequestAttributes | (() => RequestAttributes | undefined),
): void {
  asked.set(target, attributes);
}

/** The request recorded for `err` by {@link rememberRequest}, if any. */
export function requestOf(err: unknown): RequestAttributes | undefined {
  if (typeof err !== 'object' || err === null) return undefined;
  const headers = (err as { headers?: unknown }).headers;
  const key = asked.has(err) ? err : typeof headers === 'object' && headers !== null ? headers : undefined;
  if (!key) return undefined;
  const found = asked.get(key);
  if (typeof found !== 'function') return found;
  const attributes = found();
  if (attributes) asked.set(key, attributes);
  return attributes;
}

/**
 * A safe one-line description of any error of an API call (see the module comment for the
 * rules). `RedactedApiError`s are already safe and keep their text.
 * @param request what was asked; by default the request recorded for `err`.
 * @example `HTTP 403 Forbidden (create secrets in namespace "team-a" as "system:serviceaccount:captf-system:captf-mirror-sync"): refused (by a policy or webhook); its message is withheld`
 */
export function describeError(err: unknown, request: RequestAttributes | undefined = requestOf(err)): string {
  if (err instanceof RedactedApiError) return err.message;
  const code = apiStatus(err);
  if (code !== undefined) return describeAnswer(code, (err as { body?: unknown }).body, request);
  // The HTTP layer records a request for a failure without an answer only.
  const recorded = typeof err === 'object' && err !== null && asked.has(err);
  if (recorded || isTransportError(err)) return describeTransport(err, request);
  return describeOther(err);
}

/**
 * For errors of requests whose answer must never be shown (kept for callers that need
 * codes and causes after the error object is gone): the {@link describeError} text, the
 * HTTP code, the Kubernetes-defined cause types and the `Retry-After` wait.
 * @returns a {@link RedactedApiError}, or the input unchanged when it is not an HTTP error.
 */
export function redactApiError(err: unknown): unknown {
  const code = apiStatus(err);
  if (code === undefined || err instanceof RedactedApiError) return err;
  const status = statusOf((err as { body?: unknown }).body);
  const types = [...new Set(keptCauses(status?.details?.causes).map((c) => c.type))];
  return new RedactedApiError(code, describeError(err), types, retryAfterOf(err));
}

/**
 * Whether an API error is a 422 (Invalid) with a cause on `field`, e.g. `metadata.uid` when a
 * patch's UID guard met another object (a UID is immutable). Only Kubernetes-defined cause types
 * and field paths count ({@link keptCauses}); nothing of the answer's text is read.
 */
export function isInvalidField(err: unknown, field: string): boolean {
  if (apiStatus(err) !== 422) return false;
  return keptCauses(statusOf((err as { body?: unknown }).body)?.details?.causes).some((c) => c.field === field);
}

/**
 * The text of an API server's answer for tools that act as a person at a terminal (the demo
 * prints what kubectl would print) and for tests. UNTRUSTED: never use it in a function's
 * log, condition, Event or answer (SPEC §15).
 */
export function untrustedServerMessage(err: unknown): string {
  const status = statusOf((err as { body?: unknown } | undefined)?.body);
  return typeof status?.message === 'string' ? status.message : describeError(err);
}

/** The fields of a `metav1.Status` this module reads (all untrusted). */
interface StatusView {
  reason?: unknown;
  message?: unknown;
  details?: { name?: unknown; causes?: unknown };
}

/** The `metav1.Status` of an answer's body (text or parsed) when it is one (`kind: Status`), else undefined. */
function statusOf(body: unknown): StatusView | undefined {
  let parsed = body;
  if (typeof body === 'string') {
    try {
      parsed = JSON.parse(body);
    } catch {
      return undefined;
    }
  }
  if (typeof parsed !== 'object' || parsed === null || (parsed as { kind?: unknown }).kind !== 'Status')
    return undefined;
  return parsed as StatusView;
}

/** `HTTP <code>[ <Reason>][ (<request>)]`, then causes, then for a 403 what refused it. */
function describeAnswer(code: number, body: unknown, request: RequestAttributes | undefined): string {
  const status = statusOf(body);
  const reason = typeof status?.reason === 'string' && STATUS_REASONS.has(status.reason) ? status.reason : undefined;
  const what = request ? ` (${requestText(request, status, code === 403)})` : '';
  const head = `HTTP ${code}${reason ? ` ${reason}` : ''}${what}`;
  if (!status) return head;
  const tail = causesText(keptCauses(status.details?.causes, request?.fields));
  if (code !== 403) return head + tail;
  return `${head}: ${forbiddenText(status, reason, request)}${tail}`;
}

/** `; causes: <field> <Type>, <Type>` ('' for none). */
const causesText = (causes: readonly { type: string; field?: string }[]): string =>
  causes.length ? `; causes: ${causes.map((c) => (c.field ? `${c.field} ${c.type}` : c.type)).join(', ')}` : '';

/** For a 403: the API server's own sentence when it is exactly the authorizer's for this request, else a withheld note. */
function forbiddenText(status: StatusView, reason: string | undefined, request: RequestAttributes | undefined): string {
  const sentence = status.message;
  if (reason === 'Forbidden' && request?.user && typeof sentence === 'string') {
    if (rbacForbiddenMessages(request, request.user).includes(sentence)) return sentence;
  }
  return 'refused (by a policy or webhook); its message is withheld';
}

/**
 * The request in words, from what the product asked: `<verb> <resource>[.<group>][/<sub>]
 * ["<name>"][ in namespace "<ns>"][ as "<user>"]`. A create's name is shown when the
 * answer's `details.name` equals the name it sent.
 */
function requestText(r: RequestAttributes, status: StatusView | undefined, withUser: boolean): string {
  const parts = [`${r.verb} ${resourceText(r)}`];
  const name = r.name || (r.objectName === status?.details?.name ? r.objectName : '');
  if (name) parts.push(JSON.stringify(name));
  if (r.namespace) parts.push(`in namespace ${JSON.stringify(r.namespace)}`);
  if (withUser && r.user) parts.push(`as ${JSON.stringify(r.user)}`);
  return parts.join(' ');
}

/** `<resource>[.<group>][/<subresource>]`. */
const resourceText = (r: RequestAttributes): string =>
  [r.resource, r.group && `.${r.group}`, r.subresource && `/${r.subresource}`].join('');

/** At most this many causes are kept. */
const MAX_CAUSES = 5;

/**
 * The causes of a Status reduced to Kubernetes-defined types and field paths: a cause whose
 * `reason` is not a `metav1.CauseType` is dropped; its `field` is kept only when
 * {@link isFieldPath} and made of names the request sent (`sent`, see
 * {@link RequestAttributes.fields}) or of ObjectMeta's and common top-level field names (a
 * required field that was not sent); its `message` never. At most 5, without repeats.
 */
export function keptCauses(causes: unknown, sent: readonly string[] = []): { type: string; field?: string }[] {
  if (!Array.isArray(causes)) return [];
  const known = new Set([...KNOWN_FIELDS, ...sent]);
  const madeOfKnown = (f: unknown): f is string => isFieldPath(f) && fieldNames(f).every((n) => known.has(n));
  const out = new Map<string, { type: string; field?: string }>();
  const isType = (t: unknown): t is string => typeof t === 'string' && CAUSE_TYPES.has(t);
  for (const c of causes as ({ reason?: unknown; field?: unknown } | null)[]) {
    if (!isType(c?.reason)) continue;
    const field = madeOfKnown(c.field) ? c.field : undefined;
    out.set(`${c.reason} ${field ?? ''}`, { type: c.reason, ...(field ? { field } : {}) });
    if (out.size >= MAX_CAUSES) break;
  }
  return [...out.values()];
}

/** The names in a field path: its segments and bracketed keys, without indexes. */
const fieldNames = (path: string): string[] =>
  path
    .split(/[.[\]]+/)
    .filter(Boolean)
    .filter((n) => !/^[0-9]+$/.test(n));

/** Field names that may be named without having been sent: ObjectMeta's, and common top-level ones. */
const KNOWN_FIELDS = [
  'apiVersion',
  'kind',
  'metadata',
  'name',
  'generateName',
  'namespace',
  'uid',
  'resourceVersion',
  'generation',
  'labels',
  'annotations',
  'ownerReferences',
  'finalizers',
  'managedFields',
  'spec',
  'status',
  'data',
  'stringData',
  'type',
  'immutable',
];

// `metadata.name`, `spec.containers[0].image`, `data[AWS_ACCESS_KEY_ID]`: lowerCamelCase
// segments as Kubernetes names its JSON fields, indexes, and bracketed map keys.
const FIELD_PATH = /^[a-z][A-Za-z0-9]{0,47}(?:\.[a-z][A-Za-z0-9]{0,47}|\[[0-9]{1,6}\]|\[[-._A-Za-z0-9/]{1,63}\])*$/;

/** Whether `v` is syntactically a field path (as apimachinery's `field.Path` prints one) of at most 128 characters. */
export function isFieldPath(v: unknown): v is string {
  return typeof v === 'string' && v.length <= 128 && FIELD_PATH.test(v);
}

/**
 * The sentences kube-apiserver writes when its authorizer denies `request` to `user`, with
 * no reason given (RBAC's denial has none unless a binding is broken): an exact comparison
 * of these with the answer decides whether the answer's message may be quoted.
 *
 * Format, from upstream (Kubernetes v1.3x):
 * - k8s.io/apiserver pkg/endpoints/handlers/responsewriters/errors.go `Forbidden` and
 *   `forbiddenMessage`: `User %q cannot %s resource %q in API group %q in the namespace %q`
 *   (or `... at the cluster scope`), resource joined with `/subresource`, `&<>` escaped as
 *   HTML entities; followed by `: <reason>` only when the authorizer gave one; wrapped by
 * - k8s.io/apimachinery pkg/api/errors/errors.go `NewForbidden(gr, name, err)`:
 *   `<resource>[.<group>] "<name>" is forbidden: <err>` (without the name when it is '').
 * Go's `%q` equals JSON quoting for printable ASCII; values with other characters yield
 * no sentence (so nothing is quoted).
 * @returns one sentence, or none when a value is not printable ASCII.
 */
export function rbacForbiddenMessages(request: RequestAttributes, user: string): string[] {
  const { verb, group, resource, subresource, namespace, name } = request;
  if (![verb, group, resource, subresource, namespace, name, user].every(isPrintableAscii)) return [];
  const q = (s: string) => JSON.stringify(s);
  const res = subresource ? `${resource}/${subresource}` : resource;
  const scope = namespace ? `in the namespace ${q(namespace)}` : 'at the cluster scope';
  const sentence = `User ${q(user)} cannot ${verb} resource ${q(res)} in API group ${q(group)} ${scope}`.replace(
    /[&<>]/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;' })[c]!,
  );
  const gr = group ? `${resource}.${group}` : resource;
  return [name ? `${gr} ${q(name)} is forbidden: ${sentence}` : `${gr} is forbidden: ${sentence}`];
}

const isPrintableAscii = (s: string): boolean => s.length <= 253 && /^[\x20-\x7e]*$/.test(s);

/** The verb per HTTP method: [named, collection, collection with `?watch`] (k8s.io/apiserver requestinfo.go). */
const VERBS: Record<string, readonly [string, string, string]> = {
  GET: ['get', 'list', 'watch'],
  HEAD: ['get', 'list', 'watch'],
  POST: ['create', 'create', 'create'],
  PUT: ['update', 'update', 'update'],
  PATCH: ['patch', 'patch', 'patch'],
  DELETE: ['delete', 'deletecollection', 'deletecollection'],
};

/** The verb an HTTP method means to the authorizer. */
function verbOf(method: string, named: boolean, watch: boolean): string | undefined {
  return VERBS[method.toUpperCase()]?.[named ? 0 : watch ? 2 : 1];
}

/** Group and the parts after the version of an API path (`/api/v1/…`, `/apis/<group>/<version>/…`). */
function apiParts(parts: readonly string[]): { group: string; rest: string[] } | undefined {
  if (parts[0] === 'api' && parts.length >= 3) return { group: '', rest: parts.slice(2) };
  if (parts[0] === 'apis' && parts.length >= 4) return { group: parts[1]!, rest: parts.slice(3) };
  return undefined;
}

/**
 * What a request asks, parsed from its method and URL the way kube-apiserver's
 * `RequestInfoFactory` does (`namespaces/<ns>/<resource>/<name>/<subresource>`; a
 * namespace's own URL is resource `namespaces` in that namespace).
 * @param basePath the path of the kubeconfig's server URL, stripped first (e.g. `/k8s/clusters/c-1`).
 * @returns undefined for a URL that is not a resource request or holds a part that is not printable ASCII.
 */
export function requestAttributes(method: string, url: string, basePath = ''): RequestAttributes | undefined {
  const u = URL.parse(url);
  if (!u) return undefined;
  const parts = pathParts(u.pathname, basePath);
  const api = parts && apiParts(parts);
  const target = api && resourceParts(api.rest);
  const watch = ['1', 'true'].includes(u.searchParams.get('watch') ?? '');
  const verb = target && verbOf(method, target.name !== '', watch);
  return target?.resource && verb ? { verb, group: api.group, ...target } : undefined;
}

/** The decoded parts of a URL path below `basePath`; undefined when one is not printable ASCII. */
function pathParts(pathname: string, basePath: string): string[] | undefined {
  const base = basePath.replace(/\/+$/, '');
  const path = base && pathname.startsWith(`${base}/`) ? pathname.slice(base.length) : pathname;
  const parts = path.split('/').filter(Boolean).map(decodePart);
  return parts.every((p): p is string => p !== undefined && isPrintableAscii(p)) ? parts : undefined;
}

/**
 * Namespace, resource, name and subresource of the parts after the API version, as
 * `RequestInfoFactory` reads them: `namespaces/<ns>/<resource>/…`, except that a namespace's
 * own URL (`namespaces/<ns>`, `namespaces/<ns>/status|finalize`) is resource `namespaces`
 * named and namespaced `<ns>`.
 */
function resourceParts(rest: readonly string[]): Omit<RequestAttributes, 'verb' | 'group'> {
  let namespace = '';
  let parts = rest;
  if (parts[0] === 'namespaces' && parts.length > 1) {
    namespace = parts[1]!;
    if (parts.length > 2 && parts[2] !== 'status' && parts[2] !== 'finalize') parts = parts.slice(2);
  }
  const [resource = '', name = '', subresource = ''] = parts;
  return { namespace, resource, name, subresource };
}

function decodePart(p: string): string | undefined {
  try {
    return decodeURIComponent(p);
  } catch {
    return undefined;
  }
}

/** At most this many field names are taken from a request body. */
const MAX_FIELDS = 1000;

/**
 * What a JSON request body tells about the request: `metadata.name` of the object (a
 * create's name), and its field names (object keys at any depth, printable ASCII only).
 * @returns empty facts for a body that is not a JSON object or array.
 */
export function sentBody(body: unknown): Pick<RequestAttributes, 'objectName' | 'fields'> {
  if (typeof body !== 'string' || !/^\s*[[{]/.test(body)) return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch {
    return {};
  }
  const fields = new Set<string>();
  const walk = (v: unknown, depth: number): void => {
    if (typeof v !== 'object' || v === null || depth > 12 || fields.size >= MAX_FIELDS) return;
    if (!Array.isArray(v)) for (const k of Object.keys(v)) if (isPrintableAscii(k)) fields.add(k);
    for (const child of Object.values(v)) walk(child, depth + 1);
  };
  walk(parsed, 0);
  const name = (parsed as { metadata?: { name?: unknown } }).metadata?.name;
  const objectName = typeof name === 'string' && name && isPrintableAscii(name) ? name : undefined;
  return { ...(objectName ? { objectName } : {}), fields: [...fields] };
}

/** Codes of transport failures that are always shown (Node and undici error codes, OpenSSL verify errors). */
const TRANSPORT_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EPIPE',
  'EPROTO',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_HEADERS_TIMEOUT',
  'UND_ERR_BODY_TIMEOUT',
  'UND_ERR_SOCKET',
  'UND_ERR_CLOSED',
  'UND_ERR_ABORTED',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'ERR_TLS_CERT_ALTNAME_INVALID',
]);

/** Error names that say what happened without a code (an aborted or timed-out fetch). */
const TRANSPORT_NAMES = new Set(['AbortError', 'TimeoutError']);

const CODE = /^[A-Z][A-Z0-9_]{2,60}$/;

/**
 * The error codes in `err` and its causes (`cause`, an AggregateError's `errors`; at most 4
 * levels, 16 errors), as client-node's undici `fetch` nests them (`TypeError: fetch failed`
 * → `cause: Error { code: 'ECONNREFUSED' }`): those that match `^[A-Z][A-Z0-9_]{2,60}$`
 * (so also codes not on the allow-list), plus `AbortError`/`TimeoutError` names. Never a message.
 */
export function transportCodes(err: unknown): string[] {
  const codes = new Set<string>();
  let level: unknown[] = [err];
  let budget = 16;
  for (let depth = 0; depth < 5 && level.length > 0 && budget > 0; depth++) {
    const errors = level.filter((e): e is object => typeof e === 'object' && e !== null).slice(0, budget);
    budget -= errors.length;
    for (const e of errors) for (const c of codesOf(e)) codes.add(c);
    level = errors.flatMap(causesOf);
  }
  return [...codes];
}

/** The code (when code-shaped) and the name (when an allow-listed one) of one error. */
function codesOf(e: object): string[] {
  const { code, name } = e as { code?: unknown; name?: unknown };
  return [
    ...(typeof code === 'string' && CODE.test(code) ? [code] : []),
    ...(typeof name === 'string' && TRANSPORT_NAMES.has(name) ? [name] : []),
  ];
}

/** The errors nested in one: its `cause` and an AggregateError's `errors`. */
function causesOf(e: object): unknown[] {
  const { cause, errors } = e as { cause?: unknown; errors?: unknown };
  return [cause, ...(Array.isArray(errors) ? errors : [])];
}

/** Whether `err` failed before any HTTP answer: undici's `fetch failed`, or an allow-listed code or name in its chain. */
export function isTransportError(err: unknown): boolean {
  if (err instanceof TypeError && err.message === 'fetch failed') return true;
  return transportCodes(err).some((c) => TRANSPORT_CODES.has(c) || TRANSPORT_NAMES.has(c));
}

/** `transport error[ (<request>)]: <codes>`. */
function describeTransport(err: unknown, request: RequestAttributes | undefined): string {
  const codes = transportCodes(err);
  const what = request ? ` (${requestText(request, undefined, false)})` : '';
  return `transport error${what}: ${codes.length ? codes.slice(0, 3).join(', ') : 'no error code'}`;
}

/**
 * An error that is neither an HTTP answer nor a transport failure: the product's own errors
 * keep their first line; errors known to quote an answer (a JSON parse error shows part of
 * the body; client-node's unsupported-media-type error shows the Content-Type) say only what
 * happened.
 */
function describeOther(err: unknown): string {
  if (err instanceof SyntaxError) return 'an answer that is not valid JSON (SyntaxError; its text is withheld)';
  if (!(err instanceof Error)) return `a non-Error value was thrown (${typeof err})`;
  const line = err.message.split('\n')[0]!;
  if (/^The mediaType /.test(line)) return 'an answer with an unsupported Content-Type (withheld)';
  return line.slice(0, 300);
}

/** A ServiceAccount's username: `system:serviceaccount:<namespace>:<name>`. */
const SERVICE_ACCOUNT_USER =
  /^system:serviceaccount:[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?:[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
/** A certificate's common name kube-apiserver takes for a username, restricted to a safe alphabet. */
const CERT_USER = /^[A-Za-z0-9][A-Za-z0-9@._:+=-]{0,252}$/;

/**
 * Whether `name` is shaped like a ServiceAccount's username (so it may be logged as who called).
 */
export const isServiceAccountUser = (name: unknown): name is string =>
  typeof name === 'string' && SERVICE_ACCOUNT_USER.test(name);

/**
 * The username this process acts as, from its own credentials alone (never from an answer,
 * which a proxy could forge, SPEC §15): the `sub` claim of a ServiceAccount token (the
 * API server authenticates such a token as exactly that user), else the common name of the
 * client certificate (kube-apiserver's x509 authenticator takes the CN as the username).
 * @param own.bearer the bearer token sent; @param own.certPem the client certificate (PEM).
 * @returns the username, or undefined when neither gives one in a safe alphabet (an exec
 *   plugin, OIDC, a token that is not a ServiceAccount JWT).
 */
export function usernameFromCredentials(own: { bearer?: string; certPem?: string }): string | undefined {
  const sub = own.bearer ? jwtSubject(own.bearer) : undefined;
  if (isServiceAccountUser(sub)) return sub;
  const cn = own.certPem ? commonName(own.certPem) : undefined;
  return cn !== undefined && CERT_USER.test(cn) ? cn : undefined;
}

/** The `sub` claim of a JWT's payload (not verified: it is our own token), or undefined. */
function jwtSubject(token: string): string | undefined {
  const payload = token.split('.')[1];
  if (!payload) return undefined;
  try {
    const sub = (JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as { sub?: unknown }).sub;
    return typeof sub === 'string' ? sub : undefined;
  } catch {
    return undefined;
  }
}

/** The subject's CN of a PEM certificate (the first certificate), or undefined. */
function commonName(pem: string): string | undefined {
  try {
    const subject = new X509Certificate(pem).subject;
    return /^CN=(.*)$/m.exec(subject)?.[1];
  } catch {
    return undefined;
  }
}

/** `metav1.StatusReason` values (k8s.io/apimachinery/pkg/apis/meta/v1/types.go). */
const STATUS_REASONS = new Set([
  'Unauthorized',
  'Forbidden',
  'NotFound',
  'AlreadyExists',
  'Conflict',
  'Gone',
  'Invalid',
  'ServerTimeout',
  'StoreReadError',
  'Timeout',
  'TooManyRequests',
  'BadRequest',
  'MethodNotAllowed',
  'NotAcceptable',
  'RequestEntityTooLarge',
  'UnsupportedMediaType',
  'InternalError',
  'Expired',
  'ServiceUnavailable',
]);

/** `metav1.CauseType` values (same file). */
const CAUSE_TYPES = new Set([
  'FieldValueNotFound',
  'FieldValueRequired',
  'FieldValueDuplicate',
  'FieldValueInvalid',
  'FieldValueNotSupported',
  'FieldValueForbidden',
  'FieldValueTooLong',
  'FieldValueTooMany',
  'InternalError',
  'FieldValueTypeInvalid',
  'UnexpectedServerResponse',
  'FieldManagerConflict',
  'ResourceVersionTooLarge',
  'NamespaceTerminating',
]);
