/**
 * CloudEvents shaped exactly as Knative's ApiServerSource and PingSource send them (binary
 * HTTP mode; type, source, subject, `kind`/`name`/`namespace`/`apiversion` extensions,
 * `application/json` data), for driving functions over HTTP in tests.
 */
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import { CloudEvent, HTTP } from 'cloudevents';

/** An object as far as events need it. */
export interface EventObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; uid?: string; [k: string]: unknown };
  [k: string]: unknown;
}

function subjectOf(o: EventObject, plural: string): string {
  const gv = o.apiVersion.includes('/') ? `/apis/${o.apiVersion}` : `/api/${o.apiVersion}`;
  return o.metadata.namespace
    ? `${gv}/namespaces/${o.metadata.namespace}/${plural}/${o.metadata.name}`
    : `${gv}/${plural}/${o.metadata.name}`;
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
  const ns = obj.metadata.namespace ? { namespace: obj.metadata.namespace } : {};
  const data =
    mode === 'resource' ? obj : { apiVersion: obj.apiVersion, kind: obj.kind, name: obj.metadata.name, ...ns };
  return new CloudEvent<unknown>({
    specversion: '1.0',
    id: randomUUID(),
    type: `dev.knative.apiserver.${mode}.${verb}`,
    source: 'https://127.0.0.1:6443',
    subject: subjectOf(obj, plural),
    datacontenttype: 'application/json',
    data,
    kind: obj.kind,
    name: obj.metadata.name,
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

/**
 * POSTs CloudEvents to `url`: one event in `binary` (default) or `structured` mode, or
 * several as a `batch` (`application/cloudevents-batch+json`).
 * @returns status and parsed JSON body (or text).
 */
export async function postEvents(
  url: string,
  events: CloudEvent<unknown> | CloudEvent<unknown>[],
  mode: 'binary' | 'structured' | 'batch' = 'binary',
): Promise<{ status: number; body: unknown; text: string }> {
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
  const res = await fetch(url, { method: 'POST', headers, body });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // keep text
  }
  return { status: res.status, body: parsed, text };
}

/** One request a {@link startSink} received. */
export interface ReceivedEvent {
  headers: IncomingHttpHeaders;
  body: string;
}

/** A local CloudEvents sink (a stand-in for a Broker or `K_SINK`) that records every request and answers 202. */
export async function startSink(): Promise<{ url: string; received: ReceivedEvent[]; server: Server }> {
  const received: ReceivedEvent[] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      received.push({ headers: req.headers, body });
      res.writeHead(202).end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}/`, received, server };
}
