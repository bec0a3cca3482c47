/**
 * Pieces of the churn storm: a seeded random source, a chaos proxy that
 * duplicates, reorders and drops the events Knative's Broker delivers to a function (each
 * decision derived from the seed and the event, so a run replays), and a watch that keeps the
 * timeline of every mirror Secret.
 */
import { createHash } from 'node:crypto';
import { createServer, request, type IncomingHttpHeaders, type Server } from 'node:http';
import { Watch, type KubeConfig, type V1Secret } from '@kubernetes/client-node';
import { ANNOTATION_IDENTITY, LABEL_MIRRORED } from '../../functions/lib/mirror.ts';
import { listen } from './events.ts';

/** A seeded pseudo-random source in [0, 1) (mulberry32): the same seed gives the same storm. */
export function seeded(seed: number): () => number {
  let t = seed >>> 0;
  return () => {
    t = (t + 0x6d2b79f5) >>> 0;
    let r = Math.imul(t ^ (t >>> 15), 1 | t);
    r ^= r + Math.imul(r ^ (r >>> 7), 61 | r);
    return ((r ^ (r >>> 14)) >>> 0) / 4294967296;
  };
}

/** A number in [0, 1) from the seed and a text, independent of the order things happen in. */
function hashed(seed: number, text: string): number {
  return createHash('sha256').update(`${seed}/${text}`).digest().readUInt32BE(0) / 4294967296;
}

/** What the chaos proxy did with one delivery. */
export interface ChaosRecord {
  /** `performance.now()` when it arrived (the storm, the proxy and the watch share this clock). */
  at: number;
  type: string;
  subject: string;
  fate: 'forwarded' | 'duplicated' | 'delayed' | 'dropped';
}

/** Probabilities of each fate (the rest is forwarded as is). */
export interface ChaosRates {
  drop: number;
  duplicate: number;
  delay: number;
  /** Longest delay of a delayed event, in ms (others overtake it: reordering). */
  maxDelayMs: number;
}

/** A running chaos proxy. */
export interface ChaosProxy {
  url: string;
  records: ChaosRecord[];
  /** ms since the last request arrived. */
  idleMs(): number;
  close(): void;
}

/** Forwards one request body to the target; resolves with the target's status. */
function forward(
  target: URL,
  req: { method: string; url: string; headers: IncomingHttpHeaders },
  body: Buffer,
): Promise<number> {
  return new Promise((resolve) => {
    const up = request(
      { host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers },
      (r) => {
        r.resume();
        r.on('end', () => resolve(r.statusCode ?? 502));
      },
    );
    up.on('error', () => resolve(502));
    up.end(body);
  });
}

/**
 * Starts a proxy in front of `target` that decides each delivery's fate from `seed` and the
 * event (its id and the attempt number, so a retried event is decided again). A dropped event
 * is answered 200 without being forwarded (it is lost, as an at-most-once source would lose
 * it); a duplicated one is forwarded twice; a delayed one waits before it is forwarded.
 */
export async function startChaosProxy(target: string, seed: number, rates: ChaosRates): Promise<ChaosProxy> {
  let last = performance.now();
  const records: ChaosRecord[] = [];
  const attempts = new Map<string, number>();
  const to = new URL(target);
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      last = performance.now();
      const header = (name: string) => String(req.headers[name] ?? '');
      const id = header('ce-id');
      const attempt = (attempts.get(id) ?? 0) + 1;
      attempts.set(id, attempt);
      const r = hashed(seed, `${id}#${attempt}`);
      const fate: ChaosRecord['fate'] =
        r < rates.drop
          ? 'dropped'
          : r < rates.drop + rates.duplicate
            ? 'duplicated'
            : r < rates.drop + rates.duplicate + rates.delay
              ? 'delayed'
              : 'forwarded';
      records.push({ at: last, type: header('ce-type'), subject: header('ce-subject'), fate });
      const body = Buffer.concat(chunks);
      const meta = { method: req.method ?? 'POST', url: req.url ?? '/', headers: req.headers };
      const go = async (): Promise<number> => {
        if (fate === 'dropped') return 200;
        if (fate === 'delayed') await new Promise((w) => setTimeout(w, hashed(seed, `${id}@`) * rates.maxDelayMs));
        const status = await forward(to, meta, body);
        return fate === 'duplicated' ? forward(to, meta, body) : status;
      };
      void go().then((status) => res.writeHead(status).end());
    });
  });
  return {
    url: await listen(server),
    records,
    idleMs: () => performance.now() - last,
    close: () => server.close(),
  };
}

/** One mirror's presence over time: `[from, to)` in `performance.now()` ms; `to` undefined while it exists. */
export interface MirrorSpan {
  namespace: string;
  identity: string;
  from: number;
  to: number | undefined;
  /** `<Kind>/<name>/<uid>` of its owner references when it was deleted. */
  ownersAtDelete?: string[];
}

/** A watch of mirrors (label `captf.io/mirrored=true`) that keeps their spans. */
export interface MirrorTimeline {
  spans: MirrorSpan[];
  stop(): void;
}

/** Starts a {@link MirrorTimeline} over the Secrets of `namespaces`. */
export async function watchMirrorTimeline(kc: KubeConfig, namespaces: readonly string[]): Promise<MirrorTimeline> {
  const now = () => performance.now();
  const spans: MirrorSpan[] = [];
  const open = new Map<string, MirrorSpan>();
  const mine = new Set(namespaces);
  const req = await new Watch(kc).watch(
    '/api/v1/secrets',
    { labelSelector: `${LABEL_MIRRORED}=true` },
    (type: string, s: V1Secret) => {
      const namespace = s.metadata?.namespace ?? '';
      const identity = s.metadata?.annotations?.[ANNOTATION_IDENTITY] ?? '';
      if (!mine.has(namespace)) return;
      const key = `${namespace}/${identity}`;
      if (type === 'DELETED') {
        const span = open.get(key);
        if (span) {
          span.to = now();
          span.ownersAtDelete = (s.metadata?.ownerReferences ?? []).map((o) => `${o.kind}/${o.name}/${o.uid}`);
          open.delete(key);
        }
      } else if (!open.has(key)) {
        const span: MirrorSpan = { namespace, identity, from: now(), to: undefined };
        spans.push(span);
        open.set(key, span);
      }
    },
    () => undefined,
  );
  return { spans, stop: () => req.abort() };
}
