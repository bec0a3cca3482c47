/**
 * The floors every figure is compared with, measured in the same run on the same machine.
 *
 * FROZEN: these functions use only the bench's own client (scripts/bench/client.ts), a page
 * size set here, and Node built-ins, so no change to the product can move them. Changing
 * one invalidates comparisons with earlier result files: bump {@link BASELINE_VERSION} (it is
 * written into every result file) and say why in the commit.
 */
import { spawn } from 'node:child_process';
import { CLIENT_CONCURRENCY, inParallel, type BenchClient, type KubeObject } from './client.ts';
import { WatchedCollection } from './collection.ts';
import { rssBytes } from './measure.ts';

/** Version of the baseline definitions below. */
export const BASELINE_VERSION = 1;
/** Objects per page of the LIST baseline (the product's resync pages by 250 too). */
export const BASELINE_PAGE_SIZE = 250;

const secret = (name: string, labels: Record<string, string> = {}) => ({
  metadata: { name, labels },
  type: 'Opaque',
  data: { token: Buffer.from('bench').toString('base64') },
});

/**
 * N plain Secret creates in one namespace at the bench's client concurrency.
 * @returns milliseconds from the first request to the last answer.
 */
export async function secretCreates(admin: BenchClient, namespace: string, n: number, prefix: string): Promise<number> {
  const t0 = performance.now();
  await inParallel(n, CLIENT_CONCURRENCY, (i) =>
    admin.call('POST', `/api/v1/namespaces/${namespace}/secrets`, secret(`${prefix}-${i}`)),
  );
  return performance.now() - t0;
}

/** One Secret create round trip, in milliseconds. */
export async function secretRoundTrip(admin: BenchClient, namespace: string, name: string): Promise<number> {
  const t0 = performance.now();
  await admin.call('POST', `/api/v1/namespaces/${namespace}/secrets`, secret(name));
  return performance.now() - t0;
}

/**
 * Creates one Secret in each namespace, then deletes them all at once and waits on a watch
 * until every one is gone.
 * @returns milliseconds from the first DELETE to the last DELETED event.
 */
export async function secretDeletes(admin: BenchClient, namespaces: readonly string[], name: string): Promise<number> {
  const label = `captf-bench/baseline=${name}`;
  for (const ns of namespaces)
    await admin.call('POST', `/api/v1/namespaces/${ns}/secrets`, secret(name, { 'captf-bench/baseline': name }));
  const watched = await new WatchedCollection<KubeObject>(
    admin,
    '/api/v1/secrets',
    `labelSelector=${encodeURIComponent(label)}`,
  ).start();
  try {
    const t0 = performance.now();
    const gone = watched.until('baseline Secrets deleted', (m) => m.size === 0, 60_000);
    await inParallel(namespaces.length, CLIENT_CONCURRENCY, (i) =>
      admin.call('DELETE', `/api/v1/namespaces/${namespaces[i]}/secrets/${name}`),
    );
    return (await gone) - t0;
  } finally {
    watched.stop();
  }
}

/**
 * Paginated LISTs of each collection, one after the other, at {@link BASELINE_PAGE_SIZE}.
 * @param collections `[path, query]` pairs.
 * @returns milliseconds for all of them, the pages read and the items of each collection.
 */
export async function paginatedLists(
  admin: BenchClient,
  collections: readonly [string, string][],
): Promise<{ ms: number; pages: number; items: number[] }> {
  const t0 = performance.now();
  let pages = 0;
  const items: number[] = [];
  for (const [path, query] of collections) {
    const l = await admin.list(path, BASELINE_PAGE_SIZE, query);
    pages += l.pages;
    items.push(l.items.length);
  }
  return { ms: performance.now() - t0, pages, items };
}

const BARE_SERVER = `
const http = require('node:http');
const s = http.createServer((req, res) => res.end('ok'));
s.listen(0, '127.0.0.1', () => console.log(JSON.stringify({ port: s.address().port })));
process.on('SIGTERM', () => s.close(() => process.exit(0)));
`;

/**
 * A bare Node HTTP server: spawn → first answered request.
 * @returns milliseconds to the first answer, and its RSS once idle (bytes) after `idleMs`.
 */
export async function bareNodeServer(idleMs = 0): Promise<{ ms: number; rss: number }> {
  const t0 = performance.now();
  const child = spawn(process.execPath, ['-e', BARE_SERVER], { stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    const port = await new Promise<number>((res, rej) => {
      child.stdout.once('data', (d: Buffer) => res((JSON.parse(d.toString()) as { port: number }).port));
      child.once('exit', () => rej(new Error('bare server exited')));
    });
    await (await fetch(`http://127.0.0.1:${port}/`)).text();
    const ms = performance.now() - t0;
    if (idleMs) await new Promise((r) => setTimeout(r, idleMs));
    return { ms, rss: rssBytes(child.pid!) };
  } finally {
    child.kill('SIGKILL');
  }
}
