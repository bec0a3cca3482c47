/**
 * Row "resync scale": K consumers (10 per namespace) of one identity, every mirror current;
 * one resync ping → its wall time (ping sent → answer received), mirror-sync's API requests
 * and peak RSS; then a source rotation (every mirror must change) and one ping → time until
 * the answer and until every mirror holds the new data (seen on the mirror watch).
 * Also identity-status's periodic refresh at the same size (its ping, timed the same way).
 * Baseline: a paginated LIST of every consumer kind and every mirror, as the resync pages.
 *
 * Consumers are created while the relay drops events, and a first resync creates their
 * mirrors, so the event path does not slow the set-up.
 */
import { paginatedLists } from '../baselines.ts';
import {
  MIRROR_SELECTOR,
  consumersPath,
  createConsumers,
  createIdentity,
  createNamespaces,
  mirrorOf,
  pingEvent,
  postEvent,
  putSourceSecret,
  spreadOver,
} from '../fixtures.ts';
import { responseBytes, samplePeaks } from '../measure.ts';
import type { Figure } from '../report.ts';
import { USERS } from '../system.ts';
import type { RowContext } from './context.ts';

const SOURCE = 'bench-resync-creds';

/** One ping answered 2xx, retried (at most 3 pings) while the answer asks for a retry. */
async function pingUntilDone(
  url: string,
  pingSource: 'captf-resync' | 'captf-identity-status',
): Promise<{ ms: number; status: number }> {
  let last = { ms: 0, status: 0 };
  for (let i = 0; i < 3; i++) {
    const r = await postEvent(`${url}/`, pingEvent(pingSource));
    last = { ms: r.ms, status: r.status };
    if (r.status >= 200 && r.status < 300) return last;
  }
  return last;
}

/**
 * Grows the cluster to each size in turn and measures there.
 * @param sizes consumer counts, ascending.
 * @param figures receives each figure as soon as it is measured (a later size that fails
 *   keeps the earlier ones).
 * @throws Error when a resync never answers 2xx or mirrors do not converge.
 */
export async function resyncRows(ctx: RowContext, sizes: readonly number[], figures: Figure[] = []): Promise<Figure[]> {
  const { sys } = ctx;
  const identity = 'bench-resync';
  const ms = sys.functions['mirror-sync'];
  const status = sys.functions['identity-status'];
  await putSourceSecret(sys.admin, SOURCE, { token: 'resync-0' });
  await createIdentity(sys.admin, identity, SOURCE, { selector: { matchLabels: { 'captf-bench/resync': 'true' } } });
  const namespaces: string[] = [];
  let rotation = 0;
  for (const size of sizes) {
    const row = `resync, ${size} consumers`;
    sys.relay.setMode({ kind: 'drop' });
    const added = Array.from({ length: size / 10 - namespaces.length }, () => ctx.next('rs'));
    ctx.log(`resync: growing to ${size} consumers (${added.length} more namespaces)`);
    await createNamespaces(sys.admin, added, { 'captf-bench/resync': 'true' });
    await createConsumers(sys.admin, 'terraformmachines', spreadOver(added, 10, 'm'), identity);
    namespaces.push(...added);
    const first = await pingUntilDone(ms.url, 'captf-resync');
    if (first.status !== 200) throw new Error(`the resync that creates the mirrors answered ${first.status}`);
    await ctx.mirrors.until(
      `${namespaces.length} resync mirrors`,
      (m) => namespaces.every((ns) => m.has(`${ns}/${mirrorOf(identity)}`)),
      ctx.timeoutMs,
    );

    const floor = await paginatedLists(sys.admin, [
      [consumersPath('terraformclusters'), ''],
      [consumersPath('terraformmachines'), ''],
      ['/api/v1/secrets', MIRROR_SELECTOR],
    ]);
    const baseline = { what: `LIST consumers + mirrors (${floor.pages} pages)`, samples: [floor.ms] };
    // Every consumer in the cluster (other rows' too): the resync reconciles them all.
    const consumers = (floor.items[0] ?? 0) + (floor.items[1] ?? 0);

    // All current.
    let mark = sys.audit.mark();
    let bytes0 = await responseBytes(sys.admin);
    let sampler = samplePeaks({ 'mirror-sync': ms.pid });
    const current = await postEvent(`${ms.url}/`, pingEvent('captf-resync'));
    let peaks = sampler.stop();
    let counts = sys.audit.countFor(USERS['mirror-sync'], mark);
    figures.push(
      { row, what: 'resync, all current: ping → answer', unit: 'ms', samples: [current.ms], baseline },
      {
        row,
        what: 'resync, all current: API requests',
        unit: 'count',
        samples: [counts.requests],
        baseline: { what: 'LIST pages', samples: [floor.pages] },
      },
      {
        row,
        what: 'resync, all current: API requests per consumer',
        unit: 'count',
        samples: [counts.requests / consumers],
      },
      {
        row,
        what: 'resync, all current: bytes read (GET+LIST)',
        unit: 'bytes',
        samples: [(await responseBytes(sys.admin)) - bytes0],
      },
      {
        row,
        what: 'resync, all current: writes',
        unit: 'count',
        samples: [counts.requests - (counts.verbs.get ?? 0) - (counts.verbs.list ?? 0)],
      },
      {
        row,
        what: 'mirror-sync peak RSS (resync)',
        unit: 'bytes',
        samples: [peaks.rss['mirror-sync'] ?? 0],
        baseline: { what: 'manifest memory limit', samples: [sys.memoryLimits['mirror-sync']] },
      },
      {
        row,
        what: 'mirror-sync peak open sockets (resync)',
        unit: 'count',
        samples: [peaks.sockets['mirror-sync'] ?? 0],
      },
    );
    if (current.status !== 200) ctx.log(`resync, all current, answered ${current.status}`);

    // Rotation: every mirror must change.
    rotation++;
    const value = `resync-${rotation}`;
    const want = Buffer.from(value).toString('base64');
    mark = sys.audit.mark();
    bytes0 = await responseBytes(sys.admin);
    sampler = samplePeaks({ 'mirror-sync': ms.pid });
    await putSourceSecret(sys.admin, SOURCE, { token: value });
    const t0 = performance.now();
    const allNew = ctx.mirrors.until(
      'every mirror rotated',
      (m) => namespaces.every((ns) => m.get(`${ns}/${mirrorOf(identity)}`)?.data?.token === want),
      ctx.timeoutMs,
    );
    const rotated = await postEvent(`${ms.url}/`, pingEvent('captf-resync'));
    const currentMs = (await allNew) - t0;
    peaks = sampler.stop();
    counts = sys.audit.countFor(USERS['mirror-sync'], mark);
    figures.push(
      { row, what: 'rotation: ping → answer', unit: 'ms', samples: [rotated.ms], baseline },
      { row, what: 'rotation: ping → every mirror current', unit: 'ms', samples: [currentMs], baseline },
      {
        row,
        what: 'rotation: mirror writes',
        unit: 'count',
        samples: [counts.mirrorWrites],
        baseline: { what: 'mirrors', samples: [namespaces.length] },
      },
      { row, what: 'rotation: 409 conflicts', unit: 'count', samples: [counts.conflicts] },
      { row, what: 'rotation: API requests', unit: 'count', samples: [counts.requests] },
      {
        row,
        what: 'mirror-sync peak RSS (rotation)',
        unit: 'bytes',
        samples: [peaks.rss['mirror-sync'] ?? 0],
        baseline: { what: 'manifest memory limit', samples: [sys.memoryLimits['mirror-sync']] },
      },
    );

    // identity-status's refresh at this size.
    mark = sys.audit.mark();
    sampler = samplePeaks({ 'identity-status': status.pid });
    const refresh = await pingUntilDone(status.url, 'captf-identity-status');
    peaks = sampler.stop();
    counts = sys.audit.countFor(USERS['identity-status'], mark);
    figures.push(
      { row, what: 'identity-status ping → answer', unit: 'ms', samples: [refresh.ms], baseline },
      { row, what: 'identity-status API requests', unit: 'count', samples: [counts.requests] },
      {
        row,
        what: 'identity-status peak RSS',
        unit: 'bytes',
        samples: [peaks.rss['identity-status'] ?? 0],
        baseline: { what: 'manifest memory limit', samples: [sys.memoryLimits['identity-status']] },
      },
    );
  }
  return figures;
}
