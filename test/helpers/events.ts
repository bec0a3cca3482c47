/**
 * CloudEvents shaped exactly as Knative's ApiServerSource and PingSource send them (binary
 * HTTP mode; type, source, subject, `kind`/`name`/`namespace`/`apiversion` extensions,
 * `application/json` data), for driving functions over HTTP in tests; local sinks that record
 * what they are sent; and Knative's real event path on the test control plane (the Broker data
 * plane and the ApiServerSource adapter, from the rendered manifests).
 */
import { randomUUID } from 'node:crypto';
import { createServer, request, type IncomingHttpHeaders, type Server } from 'node:http';
import { CloudEvent, HTTP } from 'cloudevents';
import { EVENT_AUTH_ENV } from '../../functions/lib/senders.ts';
import { installEventingCRDs } from '../../scripts/controlplane/crds.ts';
import {
  sourceConfigFor,
  startApiServerSourceAdapter,
  type ApiServerSourceSpec,
  type RunningAdapter,
} from '../../scripts/eventing/adapter.ts';
import {
  startEventingDataPlane,
  type EventingDataPlane,
  type EventingDataPlaneOptions,
} from '../../scripts/eventing/dataplane.ts';
import { KNATIVE_LAYOUT, render } from '../../scripts/tools/kustomize.ts';
import { admin, controlPlaneDir } from './cluster.ts';
import { loggedAnswer, type CapturedLog } from './logs.ts';

/**
 * The environment of a function started by a test that posts events itself, unsigned: the
 * sender check off, as components/unsigned-events ships it. Sender identity has its own file
 * (test/integration/senders.test.ts).
 */
export const UNSIGNED_EVENTS: Readonly<Record<string, string>> = { [EVENT_AUTH_ENV]: 'off' };

/** An object as far as events need it: what a builder of fixtures.ts makes, or an object read back. */
export interface EventObject {
  apiVersion?: string;
  kind?: string;
  metadata?: { name?: string; namespace?: string; uid?: string; labels?: Record<string, string> };
}

function subjectOf(o: EventObject, plural: string): string {
  const apiVersion = o.apiVersion ?? '';
  const gv = apiVersion.includes('/') ? `/apis/${apiVersion}` : `/api/${apiVersion}`;
  return o.metadata?.namespace
    ? `${gv}/namespaces/${o.metadata.namespace}/${plural}/${o.metadata.name}`
    : `${gv}/${plural}/${o.metadata?.name}`;
}

/**
 * An ApiServerSource event about `obj`.
 * @param mode `resource` (data = the object) or `ref` (data = {apiVersion, kind, name, namespace}).
 * @param verb add | update | delete.
 * @param plural the resource's plural, for the subject.
 */
export function apiServerEvent(
  obj: EventObject,
  mode: 'resource' | 'ref',
  verb: 'add' | 'update' | 'delete',
  plural: string,
): CloudEvent<unknown> {
  const ns = obj.metadata?.namespace ? { namespace: obj.metadata.namespace } : {};
  const data =
    mode === 'resource' ? obj : { apiVersion: obj.apiVersion, kind: obj.kind, name: obj.metadata?.name, ...ns };
  return new CloudEvent<unknown>({
    specversion: '1.0',
    id: randomUUID(),
    type: `dev.knative.apiserver.${mode}.${verb}`,
    source: 'https://127.0.0.1:6443',
    subject: subjectOf(obj, plural),
    datacontenttype: 'application/json',
    data,
    kind: obj.kind,
    name: obj.metadata?.name,
    ...ns,
    apiversion: obj.apiVersion,
  });
}

/** A PingSource tick (`dev.knative.sources.ping`). */
export function pingEvent(name = 'resync'): CloudEvent<unknown> {
  return new CloudEvent<unknown>({
    specversion: '1.0',
    id: randomUUID(),
    type: 'dev.knative.sources.ping',
    source: `/apis/v1/namespaces/captf-system/pingsources/${name}`,
    datacontenttype: 'application/json',
    data: {},
  });
}

/** A function under test that takes events: where, and its captured log (logs.ts). */
export interface EventTarget {
  url: string;
  log: CapturedLog;
}

/**
 * POSTs CloudEvents to `to`: one event in `binary` (default) or `structured` mode, or
 * several as a `batch` (`application/cloudevents-batch+json`).
 * @param to a URL, or a function under test: then the answer's `body` and `text` are the detail
 *   the function logged for it (what it decided; SPEC §12 keeps that out of the answer itself).
 * @param signal aborts the request (a Broker's ingress may hold it while it delivers).
 * @param authorization the `Authorization` header, as a signing sender sends it.
 * @returns status, parsed JSON body (or text) and the answer's headers.
 */
export async function postEvents(
  to: string | EventTarget,
  events: CloudEvent<unknown> | CloudEvent<unknown>[],
  mode: 'binary' | 'structured' | 'batch' = 'binary',
  signal?: AbortSignal,
  authorization?: string,
): Promise<EventAnswer> {
  let headers: Record<string, string>;
  let body: string;
  if (mode === 'batch') {
    const list = Array.isArray(events) ? events : [events];
    headers = { 'content-type': 'application/cloudevents-batch+json' };
    body = JSON.stringify(list.map((e) => e.toJSON()));
  } else {
    const e = Array.isArray(events) ? events[0]! : events;
    const msg = mode === 'binary' ? HTTP.binary(e) : HTTP.structured(e);
    headers = msg.headers as Record<string, string>;
    body = typeof msg.body === 'string' ? msg.body : JSON.stringify(msg.body);
  }
  if (authorization !== undefined) headers = { ...headers, authorization };
  const url = typeof to === 'string' ? to : to.url;
  const res = await fetch(url, { method: 'POST', headers, body, ...(signal ? { signal } : {}) });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // keep text
  }
  const sent = { body: parsed, text };
  if (typeof to === 'string') return { status: res.status, ...sent, headers: res.headers, sent };
  const detail = await loggedAnswer(to.log, res.headers);
  return { status: res.status, body: detail, text: JSON.stringify(detail), headers: res.headers, sent };
}

/** A function's answer to {@link postEvents}. */
export interface EventAnswer {
  status: number;
  /** The body parsed as JSON, or its text when it is not JSON; posted to a function under test, the detail it logged. */
  body: unknown;
  text: string;
  headers: Headers;
  /** What the answer itself carried (the same as `body` and `text` when posted to a URL). */
  sent: { body: unknown; text: string };
}

/** One request a {@link startSink} received. */
export interface ReceivedEvent {
  headers: IncomingHttpHeaders;
  body: string;
  /** Its `ce-id` ('' when it has none). */
  id: string;
  /** `performance.now()` when it had arrived whole. */
  at: number;
}

/** How a sink answers one request. */
export interface SinkAnswer {
  status: number;
  headers?: Record<string, string>;
  body?: string;
}

/** Listens on a free port of 127.0.0.1; returns `http://127.0.0.1:<port>`. */
export async function listen(server: Server): Promise<string> {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return `http://127.0.0.1:${(server.address() as { port: number }).port}`;
}

/**
 * A local CloudEvents sink (a stand-in for a Broker, `K_SINK`, a function or a dead-letter
 * sink) that records every request and answers it with `answer` (default: 202, no body),
 * once `answer`'s promise settles when it returns one.
 */
export async function startSink(
  answer: (e: ReceivedEvent) => SinkAnswer | Promise<SinkAnswer> = () => ({ status: 202 }),
): Promise<{ url: string; received: ReceivedEvent[]; server: Server }> {
  const received: ReceivedEvent[] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      const e = { headers: req.headers, body, id: String(req.headers['ce-id'] ?? ''), at: performance.now() };
      received.push(e);
      void Promise.resolve(answer(e)).then((a) => res.writeHead(a.status, a.headers).end(a.body));
    });
  });
  return { url: `${await listen(server)}/`, received, server };
}

/** One delivery a {@link startRecordingProxy} passed on to its function, and the function's answer. */
export interface Relayed {
  /** The CloudEvent's `ce-id`, `ce-type` and `ce-subject` ('' when absent). */
  id: string;
  type: string;
  subject: string;
  /** `performance.now()` when the request arrived. */
  at: number;
  /** The function's answer: its status, its `Retry-After` header, and `performance.now()` when it was passed back; unset until then. */
  answer?: { status: number; retryAfter: string | undefined; at: number };
}

/**
 * A recording pass-through in front of a function listening on 127.0.0.1:`port`, so a test
 * sees what the Broker delivered and what the function answered, when.
 * @returns its URL, what it relayed so far (in arrival order), and its server (close it after the file).
 */
export async function startRecordingProxy(port: number): Promise<{ url: string; relayed: Relayed[]; server: Server }> {
  const relayed: Relayed[] = [];
  const server = createServer((req, res) => {
    const h = (name: string) => String(req.headers[name] ?? '');
    const entry: Relayed = { id: h('ce-id'), type: h('ce-type'), subject: h('ce-subject'), at: performance.now() };
    relayed.push(entry);
    const up = request({ host: '127.0.0.1', port, method: req.method, path: req.url, headers: req.headers }, (r) => {
      const status = r.statusCode ?? 502;
      entry.answer = { status, retryAfter: r.headers['retry-after'], at: performance.now() };
      res.writeHead(status, r.headers);
      r.pipe(res);
    });
    up.on('error', () => res.writeHead(502).end());
    req.pipe(up);
  });
  return { url: await listen(server), relayed, server };
}

const JSON_TYPE = { 'content-type': 'application/json' };

/**
 * A stand-in for a function: a {@link startSink} that answers by the event id's prefix, as a
 * function would: `fail-` 500 and `bad-` 400 with a JSON error, `json-` 200 with a JSON body
 * that is not a CloudEvent, `hold-` `ok` only once `release()` is called, anything else `ok`
 * with no body.
 */
export async function startFunctionStandIn(ok = 202) {
  const held: (() => void)[] = [];
  const sink = await startSink(({ id }) =>
    id.startsWith('fail-')
      ? { status: 500, headers: JSON_TYPE, body: '{"error":"the API server is unavailable"}' }
      : id.startsWith('bad-')
        ? { status: 400, headers: JSON_TYPE, body: '{"error":"not an event this function takes"}' }
        : id.startsWith('json-')
          ? { status: 200, headers: JSON_TYPE, body: '{"ok":true}' }
          : id.startsWith('hold-')
            ? new Promise<SinkAnswer>((r) => held.push(() => r({ status: ok })))
            : { status: ok },
  );
  /** Answers every held request. @returns how many there were. */
  const release = () => held.splice(0).map((r) => r()).length;
  return { ...sink, release };
}

/** The shipped Knative layout (every function a Knative Service), for `render()`. */
export const RENDERED_MANIFESTS = KNATIVE_LAYOUT;

/**
 * Knative's Broker data plane (scripts/eventing/dataplane.ts) on the test control plane, as
 * admin, with the eventing CRDs installed first.
 */
export async function startBroker(
  opts: Omit<EventingDataPlaneOptions, 'kubeconfigPath' | 'kc'>,
): Promise<EventingDataPlane> {
  const { kc } = admin();
  await installEventingCRDs(kc);
  return startEventingDataPlane({ kubeconfigPath: `${controlPlaneDir()}/admin.kubeconfig`, kc, ...opts });
}

/** Knative's real event path (see {@link startEventPath}). */
export interface EventPath {
  /** The Broker data plane. */
  dp: EventingDataPlane;
  /** The ApiServerSource adapter sending to the Broker. */
  adapter: RunningAdapter;
  /** Stops the adapter, then the data plane. */
  stop(): Promise<void>;
}

/**
 * Knative's real event path from the rendered manifests: the Broker data plane with the
 * Broker, Triggers and PingSources moved into `namespace` ({@link startBroker}), fed by the
 * real ApiServerSource adapter configured from the rendered `captf-objects`, but watching only
 * `watch` (the rendered source watches every namespace; on a control plane shared with other
 * test files that would send their objects' events too).
 * @param opts.name the adapter's name (unique per run).
 */
export async function startEventPath(
  opts: Pick<EventingDataPlaneOptions, 'namespace' | 'sinks' | 'schedules' | 'observability' | 'systemNamespace'> & {
    watch: string[];
    name: string;
  },
): Promise<EventPath> {
  const rendered = await render(RENDERED_MANIFESTS);
  const { watch: _watch, name: _name, ...dataPlane } = opts;
  const dp = await startBroker({ objects: rendered, ...dataPlane });
  try {
    const objects = rendered.find((o) => o.kind === 'ApiServerSource' && o.metadata?.name === 'captf-objects');
    const config = await sourceConfigFor(admin().kc, objects as unknown as ApiServerSourceSpec);
    const adapter = await startApiServerSourceAdapter({
      kubeconfigPath: `${controlPlaneDir()}/admin.kubeconfig`,
      sink: dp.brokerUrl,
      source: { ...config, namespaces: opts.watch, allNamespaces: false },
      name: opts.name,
    });
    return {
      dp,
      adapter,
      async stop() {
        await adapter.stop();
        await dp.stop();
      },
    };
  } catch (err) {
    await dp.stop();
    throw err;
  }
}

/** Where EventPolicies of `namespace` live (`eventing.knative.dev/v1alpha1`), for CustomObjectsApi calls. */
export const eventPolicies = (namespace: string) =>
  ({ group: 'eventing.knative.dev', version: 'v1alpha1', namespace, plural: 'eventpolicies' }) as const;

/** An EventPolicy `name` aimed at the Knative Service `service` of its namespace, letting `subjects` send. */
export const eventPolicy = (name: string, service: string, subjects: readonly string[]) => ({
  apiVersion: 'eventing.knative.dev/v1alpha1',
  kind: 'EventPolicy',
  metadata: { name },
  spec: {
    to: [{ ref: { apiVersion: 'serving.knative.dev/v1', kind: 'Service', name: service } }],
    from: subjects.map((sub) => ({ sub })),
  },
});
