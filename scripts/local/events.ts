/**
 * What the local mode still does itself around Knative's real Eventing data plane
 * (scripts/eventing/dataplane.ts runs the Broker's ingress, filter, in-memory channel and mtping; the
 * ApiServerSource adapter sends the API events): nothing here delivers, retries or schedules
 * events — Knative's code does. What is left is what those parts cannot do:
 * - {@link pingMessage}: the CloudEvent a PingSource tick sends, for `system.ping()` — the
 *   demo (and a user in a hurry) needs a resync or status refresh *now*, and a PingSource
 *   only fires on its schedule, so the same event is POSTed to the Broker, whose Triggers
 *   route it like any tick;
 * - {@link cronSchedule}: `--status`/`--resync` durations as the PingSource schedules mtping
 *   runs;
 * - {@link waitForWatchCaches}: the adapter is at-most-once, so it must not start watching
 *   CRDs whose watch cache is still warming up.
 */
import { CloudEvent, HTTP } from 'cloudevents';
import { Watch, type KubeConfig } from '@kubernetes/client-node';
import { PING_EVENT_TYPE } from '../../functions/lib/cloudevents.ts';
import type { SourceConfig } from '../eventing/adapter.ts';

/** An HTTP request carrying one CloudEvent in binary mode. */
export interface EventMessage {
  headers: Record<string, string>;
  body: string;
}

/**
 * A PingSource tick as mtping sends the manifests' PingSources: type
 * `dev.knative.sources.ping`, source `/apis/v1/namespaces/<namespace>/pingsources/<name>`,
 * `ce-time`, data `{}` (application/json) and the `Kn-Namespace` header
 * (test/integration/start-events.test.ts compares it with a real tick, through the Broker).
 */
export function pingMessage(name: string, namespace = 'captf-system'): EventMessage {
  const msg = HTTP.binary(
    new CloudEvent<unknown>({
      specversion: '1.0',
      type: PING_EVENT_TYPE,
      source: `/apis/v1/namespaces/${namespace}/pingsources/${name}`,
      time: new Date().toISOString(),
      datacontenttype: 'application/json',
      data: {},
    }),
  );
  return {
    headers: { ...(msg.headers as Record<string, string>), 'kn-namespace': namespace },
    body: typeof msg.body === 'string' ? msg.body : JSON.stringify(msg.body),
  };
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
      if (outcome === 'absent') throw new Error(`${path} is not served by this API server: is its CRD installed?`);
      if (Date.now() > deadline) throw new Error(`${path} is not watchable after ${timeoutMs} ms: ${last}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

/** The API path of each resource an adapter with this configuration lists and watches. */
export function watchPaths(source: SourceConfig): string[] {
  return source.resources.map(({ gvr: { Group, Version, Resource } }) =>
    Group ? `/apis/${Group}/${Version}/${Resource}` : `/api/${Version}/${Resource}`,
  );
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

/** Why an interval cannot be a PingSource schedule. */
function notACron(ms: number): Error {
  return new Error(
    `every ${ms / 1000}s cannot be a PingSource schedule (cron fires at wall-clock multiples): use seconds that divide a minute (e.g. 2s, 15s, 30s), minutes that divide an hour (1m, 5m, 10m), hours that divide a day, or 24h`,
  );
}

/** `*\/n` for an interval of `n` units, when `n` divides `per` evenly (cron fires at multiples). */
function every(n: number, per: number, ms: number): string {
  if (!Number.isInteger(n) || per % n !== 0) throw notACron(ms);
  return `*/${n}`;
}

/**
 * The PingSource schedule that fires every `ms`, as mtping takes it: seconds as
 * `*\/N * * * * *` (mtping's cron parser, like the PingSource webhook's, accepts an optional
 * seconds field; the manifests use minutes, and a sub-minute schedule is a local and test
 * convenience, not something to deploy), minutes as `*\/N * * * *` (5m gives the manifests'
 * `*\/5 * * * *`), hours as `0 *\/N * * *`, a day as `0 0 * * *`. Cron fires at wall-clock
 * multiples, so only intervals that divide the next unit evenly are possible, and the first
 * tick comes at the next multiple, not one interval after the start.
 * @throws Error for anything else (500ms, 45s, 1m30s, 7m, 5h, 2d).
 */
export function cronSchedule(ms: number): string {
  const seconds = ms / 1000;
  if (!Number.isInteger(seconds) || seconds < 1) throw notACron(ms);
  if (seconds < 60) return `${every(seconds, 60, ms)} * * * * *`;
  const minutes = seconds / 60;
  if (minutes < 60) return `${every(minutes, 60, ms)} * * * *`;
  const hours = minutes / 60;
  if (hours === 24) return '0 0 * * *';
  if (hours < 24) return `0 ${every(hours, 24, ms)} * * *`;
  throw notACron(ms);
}
