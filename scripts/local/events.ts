/**
 * The local stand-in for Knative Eventing (SPEC §12, §14): CloudEvents shaped exactly as
 * Knative's ApiServerSource (Reference mode) and PingSource send them, delivered over HTTP
 * with a Trigger-like retry policy through a bounded queue, and a small event source that
 * watches the API server with client-node informers. Used by `npm start` and `npm run demo`
 * when the real ApiServerSource receive adapter has not been built.
 */
import { setTimeout as delay } from 'node:timers/promises';
import { CloudEvent, HTTP } from 'cloudevents';
import {
  CoreV1Api,
  CustomObjectsApi,
  Watch,
  makeInformer,
  type Informer,
  type KubeConfig,
  type KubernetesListObject,
  type KubernetesObject,
} from '@kubernetes/client-node';
import { GROUP, IDENTITY_KIND, IDENTITY_PLURAL, VERSION, type ConsumerKind } from '../../functions/lib/api.ts';
import { PING_EVENT_TYPE, REF_EVENT_PREFIX } from '../../functions/lib/cloudevents.ts';

/** An HTTP request carrying one CloudEvent in binary mode. */
export interface EventMessage {
  headers: Record<string, string>;
  body: string;
}

/**
 * The resource name Kubernetes' `meta.UnsafeGuessKindToResource` guesses from a kind, which
 * the ApiServerSource adapter (knative.dev/eventing v0.49 pkg/adapter/apiserver/events)
 * puts into `subject`: lower-case; `…s` → `…ses`, `…y` → `…ies`, `…endpoints` unchanged,
 * else `…s`.
 */
export function guessPlural(kind: string): string {
  const s = kind.toLowerCase();
  if (s.endsWith('endpoints')) return s;
  if (s.endsWith('s')) return `${s}es`;
  if (s.endsWith('y')) return `${s.slice(0, -1)}ies`;
  return `${s}s`;
}

/** What a Reference-mode event is about. */
export interface RefTarget {
  apiVersion: string;
  kind: string;
  name: string;
  /** Empty or absent for cluster-scoped objects. */
  namespace?: string | undefined;
}

/**
 * A Reference-mode ApiServerSource event, as the pinned adapter builds it: type
 * `dev.knative.apiserver.ref.<verb>`, `source` = the API server URL, `subject`
 * `/apis/<apiVersion>/namespaces/<namespace>/<guessed plural>/<name>` (always `/apis/`, and an
 * empty namespace segment for cluster-scoped objects: upstream quirks, kept), extensions
 * `kind`, `apiversion`, `name`, `namespace` (present and empty for cluster-scoped objects),
 * data = a core/v1 ObjectReference serialised in Go's field order (`kind`, `namespace`,
 * `name`, `apiVersion`; empty fields omitted), binary HTTP mode, `ce-time` = now, and the
 * `Kn-Namespace` header Knative's adapters (and Broker filters) add: the source's namespace.
 * @param server API server URL, e.g. `https://127.0.0.1:6443`.
 * @param sourceNamespace namespace of the ApiServerSource (default `captf-system`).
 * @returns headers and body to POST.
 */
export function refEvent(
  verb: 'add' | 'update' | 'delete',
  obj: RefTarget,
  server: string,
  sourceNamespace = 'captf-system',
): EventMessage {
  const ns = obj.namespace ?? '';
  const data = { kind: obj.kind, ...(ns ? { namespace: ns } : {}), name: obj.name, apiVersion: obj.apiVersion };
  const ev = new CloudEvent<unknown>({
    specversion: '1.0',
    type: `${REF_EVENT_PREFIX}${verb}`,
    source: server,
    subject: `/apis/${obj.apiVersion}/namespaces/${ns}/${guessPlural(obj.kind)}/${obj.name}`,
    time: new Date().toISOString(),
    datacontenttype: 'application/json',
    data,
    kind: obj.kind,
    apiversion: obj.apiVersion,
    name: obj.name,
    namespace: ns,
  });
  return toMessage(ev, sourceNamespace);
}

/**
 * A PingSource tick as the manifests' PingSources send it: type `dev.knative.sources.ping`,
 * source `/apis/v1/namespaces/<namespace>/pingsources/<name>`, data `{}` (application/json),
 * and the `Kn-Namespace` header.
 */
export function pingMessage(name: string, namespace = 'captf-system'): EventMessage {
  return toMessage(
    new CloudEvent<unknown>({
      specversion: '1.0',
      type: PING_EVENT_TYPE,
      source: `/apis/v1/namespaces/${namespace}/pingsources/${name}`,
      time: new Date().toISOString(),
      datacontenttype: 'application/json',
      data: {},
    }),
    namespace,
  );
}

function toMessage(ev: CloudEvent<unknown>, knNamespace: string): EventMessage {
  const msg = HTTP.binary(ev);
  return {
    headers: { ...(msg.headers as Record<string, string>), 'kn-namespace': knNamespace },
    body: typeof msg.body === 'string' ? msg.body : JSON.stringify(msg.body),
  };
}

/** Outcome of one delivery, for debug lines. */
export interface DeliveryReport {
  sink: string;
  type: string;
  subject: string;
  /** Last HTTP status, or 0 when the sink was unreachable. */
  status: number;
  attempts: number;
  /** True when the event was given up on (4xx, retries exhausted, or dropped from a full queue). */
  failed: boolean;
  error?: string;
}

/** Options of {@link Delivery}. */
export interface DeliveryOptions {
  /** Retries after the first attempt (default 5, as the manifests' Trigger `delivery.retry`). */
  retries?: number;
  /** First back-off in ms, doubled per retry (default 1000: `backoffPolicy: exponential`, `backoffDelay: PT1S`). */
  backoffMs?: number;
  /** Events waiting at most; the oldest is dropped when full (default 1000). */
  maxQueue?: number;
  /** Deliveries in flight at once (default 4). */
  concurrency?: number;
  /** Per-attempt timeout in ms (default 30 000). */
  timeoutMs?: number;
  onReport?: (r: DeliveryReport) => void;
}

/**
 * Delivers CloudEvents to one sink like a Knative Trigger: 2xx is done; 5xx, 429 and
 * connection errors are retried with exponential back-off; other 4xx are given up on (a
 * dead-letter sink would get them). A bounded queue keeps memory flat when the sink is
 * down: the oldest event is dropped, which is safe because events are hints and the resync
 * repairs what they missed (SPEC §12).
 */
export class Delivery {
  readonly sink: string;
  private readonly opts: Required<Omit<DeliveryOptions, 'onReport'>> & Pick<DeliveryOptions, 'onReport'>;
  private readonly queue: EventMessage[] = [];
  private active = 0;
  private stopped = false;
  private readonly idleWaiters: (() => void)[] = [];
  private readonly abort = new AbortController();

  /** @param sink URL the events are POSTed to. */
  constructor(sink: string, opts: DeliveryOptions = {}) {
    this.sink = sink;
    this.opts = { retries: 5, backoffMs: 1000, maxQueue: 1000, concurrency: 4, timeoutMs: 30_000, ...opts };
  }

  /** Queues one event; returns at once. */
  send(msg: EventMessage): void {
    if (this.stopped) return;
    if (this.queue.length >= this.opts.maxQueue) {
      const dropped = this.queue.shift()!;
      this.report(dropped, { status: 0, attempts: 0, failed: true, error: 'queue full; dropped the oldest event' });
    }
    this.queue.push(msg);
    this.pump();
  }

  /** Resolves when nothing is queued or in flight. */
  idle(): Promise<void> {
    if (this.queue.length === 0 && this.active === 0) return Promise.resolve();
    return new Promise((r) => this.idleWaiters.push(r));
  }

  /** Stops: drops what is queued and aborts what is in flight. */
  stop(): void {
    this.stopped = true;
    this.queue.length = 0;
    this.abort.abort();
  }

  private pump(): void {
    while (!this.stopped && this.active < this.opts.concurrency && this.queue.length > 0) {
      const msg = this.queue.shift()!;
      this.active++;
      void this.deliver(msg).finally(() => {
        this.active--;
        this.pump();
        if (this.queue.length === 0 && this.active === 0) for (const w of this.idleWaiters.splice(0)) w();
      });
    }
  }

  private async deliver(msg: EventMessage): Promise<void> {
    let status = 0;
    let error: string | undefined;
    for (let attempt = 1; attempt <= this.opts.retries + 1; attempt++) {
      if (this.stopped) return;
      try {
        const res = await fetch(this.sink, {
          method: 'POST',
          headers: msg.headers,
          body: msg.body,
          signal: AbortSignal.any([this.abort.signal, AbortSignal.timeout(this.opts.timeoutMs)]),
        });
        status = res.status;
        await res.arrayBuffer();
        error = undefined;
      } catch (err) {
        if (this.stopped) return;
        status = 0;
        error = (err as Error).message;
      }
      const retryable = status === 0 || status === 429 || status >= 500;
      if (!retryable) {
        this.report(msg, { status, attempts: attempt, failed: status >= 300 });
        return;
      }
      if (attempt <= this.opts.retries) await sleep(this.opts.backoffMs * 2 ** (attempt - 1), this.abort.signal);
    }
    this.report(msg, {
      status,
      attempts: this.opts.retries + 1,
      failed: true,
      error: error ?? 'retries exhausted',
    });
  }

  private report(msg: EventMessage, outcome: Pick<DeliveryReport, 'status' | 'attempts' | 'failed' | 'error'>): void {
    const { error, ...rest } = outcome;
    this.opts.onReport?.({
      sink: this.sink,
      type: msg.headers['ce-type'] ?? '',
      subject: msg.headers['ce-subject'] ?? msg.headers['ce-source'] ?? '',
      ...rest,
      ...(error ? { error } : {}),
    });
  }
}

/** Waits `ms`, or less when `signal` aborts (never rejects). */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return delay(ms, undefined, { signal }).catch(() => undefined);
}

/** One watched resource and where its events go. */
export interface WatchedResource {
  apiVersion: string;
  kind: string;
  /** API path to list and watch, e.g. `/apis/<group>/<version>/<plural>` or `/api/v1/namespaces`. */
  path: string;
  list: () => Promise<KubernetesListObject<KubernetesObject>>;
  sinks: Delivery[];
}

/**
 * The resources the manifests' ApiServerSources watch, routed as their Triggers route them:
 * consumers and namespaces to mirror-sync; identities to mirror-sync and identity-status.
 */
export function watchedResources(
  kc: KubeConfig,
  kinds: readonly ConsumerKind[],
  mirrorSync: Delivery,
  identityStatus: Delivery,
): WatchedResource[] {
  const custom = kc.makeApiClient(CustomObjectsApi);
  const core = kc.makeApiClient(CoreV1Api);
  const cr = (group: string, version: string, plural: string) => () =>
    custom.listClusterCustomObject({ group, version, plural }) as Promise<KubernetesListObject<KubernetesObject>>;
  return [
    ...kinds.map((k) => ({
      apiVersion: `${k.group}/${k.version}`,
      kind: k.kind,
      path: `/apis/${k.group}/${k.version}/${k.plural}`,
      list: cr(k.group, k.version, k.plural),
      sinks: [mirrorSync],
    })),
    {
      apiVersion: `${GROUP}/${VERSION}`,
      kind: IDENTITY_KIND,
      path: `/apis/${GROUP}/${VERSION}/${IDENTITY_PLURAL}`,
      list: cr(GROUP, VERSION, IDENTITY_PLURAL),
      sinks: [mirrorSync, identityStatus],
    },
    {
      apiVersion: 'v1',
      kind: 'Namespace',
      path: '/api/v1/namespaces',
      list: () => core.listNamespace() as Promise<KubernetesListObject<KubernetesObject>>,
      sinks: [mirrorSync],
    },
  ];
}

/**
 * Waits until the API server can serve a streaming watch of each path: a watch with
 * `sendInitialEvents=true` answers 200 and sends its `k8s.io/initial-events-end` bookmark.
 * Right after a CRD is installed its watch cache is still initialising and such watches fail
 * (429); client-go's reflectors (the adapter's) then back off for a second, and an object
 * created in that second would never produce an event.
 * @throws Error naming the path when it is not served (404: CRD missing) or not watchable within `timeoutMs`.
 */
export async function waitForWatchCaches(kc: KubeConfig, paths: readonly string[], timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (const path of paths) {
    let last = '';
    for (;;) {
      const outcome = await new Promise<'ready' | 'retry' | 'absent'>((resolve) => {
        let settled = false;
        let controller: AbortController | undefined;
        const finish = (o: 'ready' | 'retry' | 'absent', why = '') => {
          if (settled) return;
          settled = true;
          last = why || last;
          clearTimeout(timer);
          controller?.abort();
          resolve(o);
        };
        // A server without streaming lists (before Kubernetes 1.27, or the feature turned off)
        // ignores sendInitialEvents and never sends the bookmark: an open watch is all there is.
        const timer = setTimeout(() => finish('ready'), 5000);
        void new Watch(kc)
          .watch(
            path,
            {
              sendInitialEvents: true,
              resourceVersionMatch: 'NotOlderThan',
              allowWatchBookmarks: true,
              timeoutSeconds: 10,
            },
            (type, obj: { metadata?: { annotations?: Record<string, string> } }) => {
              if (type === 'BOOKMARK' && obj.metadata?.annotations?.['k8s.io/initial-events-end'] === 'true')
                finish('ready');
              else if (type === 'ERROR') finish('retry', `watch error: ${JSON.stringify(obj).slice(0, 200)}`);
            },
            (err: unknown) => {
              const status = (err as { statusCode?: number } | null)?.statusCode;
              const why = err ? String((err as Error).message ?? err) : 'watch closed early';
              if (status === 404) finish('absent', why);
              // 429 (cache still initialising), 5xx, connection errors and early closes: try again.
              else if (!err || status === undefined || status === 429 || status >= 500) finish('retry', why);
              // Another 4xx (e.g. a parameter an older server rejects): nothing to wait for.
              else finish('ready', why);
            },
          )
          .then((c) => {
            controller = c;
            if (settled) c.abort();
          });
      });
      if (outcome === 'ready') break;
      if (outcome === 'absent')
        throw new Error(
          `${path} is not served by this API server: are the CRDs installed? (npm start installs them on a named cluster only with --install)`,
        );
      if (Date.now() > deadline) throw new Error(`${path} is not watchable after ${timeoutMs} ms: ${last}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

/** A running local event source. */
export interface LocalEventSource {
  stop(): Promise<void>;
}

/**
 * Lists and watches each resource with a client-node informer and sends one Reference-mode
 * event per add/update/delete to its sinks. Like the adapter, objects that already exist when
 * it starts produce no event (the resync covers them); after a watch error it re-lists after
 * `restartMs` and reports the differences as add/update/delete, so nothing is lost.
 * @param server the API server URL written into `ce-source`.
 * @param onError called with a short message when a watch fails (it restarts by itself).
 * @returns once every informer has listed and started watching.
 * @throws the first list error (e.g. 403, or a CRD that is not installed).
 */
export async function startLocalEventSource(
  kc: KubeConfig,
  server: string,
  resources: readonly WatchedResource[],
  opts: { restartMs?: number; onError?: (msg: string) => void } = {},
): Promise<LocalEventSource> {
  const informers: Informer<KubernetesObject>[] = [];
  let stopped = false;
  const timers = new Set<NodeJS.Timeout>();
  for (const r of resources) {
    const informer = makeInformer(kc, r.path, r.list);
    let listed = false;
    const emit = (verb: 'add' | 'update' | 'delete') => (obj: KubernetesObject) => {
      // The initial list is not news (the adapter ignores it too).
      if (!listed || stopped) return;
      const msg = refEvent(
        verb,
        { apiVersion: r.apiVersion, kind: r.kind, name: obj.metadata?.name ?? '', namespace: obj.metadata?.namespace },
        server,
      );
      for (const sink of r.sinks) sink.send(msg);
    };
    informer.on('add', emit('add'));
    informer.on('update', emit('update'));
    informer.on('delete', emit('delete'));
    informer.on('error', (err: unknown) => {
      if (stopped) return;
      opts.onError?.(
        `watch of ${r.path} failed (${String((err as Error)?.message ?? err).split('\n')[0]}); re-listing`,
      );
      const t = setTimeout(() => {
        timers.delete(t);
        if (!stopped)
          informer
            .start()
            .catch((e: unknown) => opts.onError?.(`re-list of ${r.path} failed: ${String(e).split('\n')[0]}`));
      }, opts.restartMs ?? 1000);
      timers.add(t);
    });
    // A list can fail while a fresh CRD's cache warms up (429): retry for a while.
    for (let attempt = 1; ; attempt++) {
      try {
        await informer.start();
        break;
      } catch (err) {
        if (attempt >= 30) throw err;
        await new Promise((r) => setTimeout(r, 500));
      }
    }
    listed = true;
    informers.push(informer);
  }
  return {
    async stop() {
      stopped = true;
      for (const t of timers) clearTimeout(t);
      await Promise.all(informers.map((i) => i.stop()));
    },
  };
}

/**
 * Parses a duration such as `500ms`, `30s`, `5m`, `1h` or `1m30s`.
 * @returns milliseconds.
 * @throws Error naming the bad value.
 */
export function parseDuration(text: string): number {
  const re = /(\d+(?:\.\d+)?)(ms|s|m|h)/gy;
  let total = 0;
  let matched = 0;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    total += Number(m[1]) * { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[m[2] as 'ms' | 's' | 'm' | 'h'];
    matched = re.lastIndex;
  }
  if (!text || matched !== text.length || total <= 0)
    throw new Error(`${JSON.stringify(text)} is not a duration (e.g. 30s, 5m, 1h)`);
  return total;
}

/**
 * Sends a PingSource tick to `delivery` every `everyMs` (the first one after `everyMs`, as a
 * PingSource's first scheduled tick).
 * @returns a function that stops the schedule.
 */
export function schedulePing(delivery: Delivery, name: string, everyMs: number): () => void {
  const timer = setInterval(() => delivery.send(pingMessage(name)), everyMs);
  timer.unref();
  return () => clearInterval(timer);
}
