/**
 * Row "resync scale": K consumers (10 per namespace) of one identity, every mirror current;
 * one resync ping → its wall time (ping sent → answer received), mirror-sync's API requests
 * and peak RSS; then a source rotation (every mirror must change) and one ping → time until
 * the answer and until every mirror holds the new data (seen on the mirror watch).
 * Also identity-status's periodic refresh at the same size (its ping, timed the same way).
 * Baseline: a paginated LIST of every consumer kind and every mirror, as the resync pages.
 *
 * Consumers are created while mirror-sync's front drops events, and a first resync creates their
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
  signedWith,
  postEvent,
  putSourceSecret,
  spreadOver,
} from '../fixtures.ts';
import { responseBytes, samplePeaks } from '../measure.ts';
import type { Figure } from '../report.ts';
import { USERS } from '../../system/users.ts';
import type { RowContext } from './context.ts';

const SOURCE = 'bench-resync-creds';

/** One ping signed with `authorization`, answered 2xx, retried (at most 3 pings) while the answer asks for a retry. */
async function pingUntilDone(
  url: string,
  pingSource: 'captf-resync' | 'captf-identity-status',
  authorization: string,
): Promise<{ ms: number; status: number }> {
  let last = { ms: 0, status: 0 };
  for (let i = 0; i < 3; i++) {
    const r = await postEvent(`${url}/`, signedWith(authorization, pingEvent(pingSource)));
    last = { ms: r.ms, status: r.status };
    if (r.status >= 200 && r.status < 300) return last;
  }
  return last;
}

/** What every measurement at one size shares. */
interface AtSize {
  ctx: RowContext;
  row: string;
  /** Every namespace of the row so far (each with one mirror of {@link IDENTITY}). */
  namespaces: string[];
  /** The paginated LIST of every consumer and mirror, timed. */
  baseline: NonNullable<Figure['baseline']>;
  /** Its pages. */
  pages: number;
  /** Every consumer in the cluster (other rows' too): the resync reconciles them all. */
  consumers: number;
}

const IDENTITY = 'bench-resync';

/**
 * Grows the cluster to each size in turn and measures there.
 * @param sizes consumer counts, ascending.
 * @param figures receives each figure as soon as it is measured (a later size that fails
 *   keeps the earlier ones).
 * @throws Error when a resync never answers 2xx or mirrors do not converge.
 */
export async function resyncRows(ctx: RowContext, sizes: readonly number[], figures: Figure[] = []): Promise<Figure[]> {
  await putSourceSecret(ctx.sys.admin, SOURCE, { token: 'resync-0' });
  await createIdentity(ctx.sys.admin, {
    name: IDENTITY,
    secret: SOURCE,
    allowedNamespaces: { selector: { matchLabels: { 'captf-bench/resync': 'true' } } },
  });
  const namespaces: string[] = [];
  for (const [i, size] of sizes.entries()) {
    await growTo(ctx, namespaces, size);
    const at = { ctx, row: `resync, ${size} consumers`, namespaces, ...(await listFloor(ctx)) };
    figures.push(...(await allCurrent(at)));
    figures.push(...(await rotation(at, i + 1)));
    figures.push(...(await identityStatusRefresh(at)));
  }
  return figures;
}

/**
 * Adds namespaces of 10 consumers each (while mirror-sync's front drops events) until there are
 * `size` consumers, and lets one resync create their mirrors.
 * @throws Error when that resync does not answer 200 or the mirrors do not appear.
 */
async function growTo(ctx: RowContext, namespaces: string[], size: number): Promise<void> {
  const { sys } = ctx;
  sys.events.fronts['mirror-sync'].mode = { kind: 'drop' };
  const added = Array.from({ length: size / 10 - namespaces.length }, () => ctx.next('rs'));
  ctx.log(`resync: growing to ${size} consumers (${added.length} more namespaces)`);
  await createNamespaces(sys.admin, added, { 'captf-bench/resync': 'true' });
  await createConsumers(sys.admin, {
    plural: 'terraformmachines',
    items: spreadOver(added, 10, 'm'),
    identity: IDENTITY,
  });
  namespaces.push(...added);
  const first = await pingUntilDone(sys.functions['mirror-sync'].url, 'captf-resync', await sys.sign('mirror-sync'));
  if (first.status !== 200) throw new Error(`the resync that creates the mirrors answered ${first.status}`);
  await ctx.mirrors.until(
    `${namespaces.length} resync mirrors`,
    (m) => namespaces.every((ns) => m.has(`${ns}/${mirrorOf(IDENTITY)}`)),
    ctx.timeoutMs,
  );
}

/** The baseline: a paginated LIST of every consumer kind and every mirror, as the resync pages. */
async function listFloor(ctx: RowContext): Promise<Pick<AtSize, 'baseline' | 'pages' | 'consumers'>> {
  const floor = await paginatedLists(ctx.sys.admin, [
    [consumersPath('terraformclusters'), ''],
    [consumersPath('terraformmachines'), ''],
    ['/api/v1/secrets', MIRROR_SELECTOR],
  ]);
  return {
    baseline: { what: `LIST consumers + mirrors (${floor.pages} pages)`, samples: [floor.ms] },
    pages: floor.pages,
    consumers: (floor.items[0] ?? 0) + (floor.items[1] ?? 0),
  };
}

/** One resync ping with every mirror current: time, requests, bytes read, writes, peaks. */
async function allCurrent(at: AtSize): Promise<Figure[]> {
  const { sys } = at.ctx;
  const { row, baseline } = at;
  const ms = sys.functions['mirror-sync'];
  const mark = sys.audit.mark();
  const bytes0 = await responseBytes(sys.admin);
  const sampler = samplePeaks({ 'mirror-sync': ms.pid });
  const authorization = await sys.sign('mirror-sync');
  const current = await postEvent(`${ms.url}/`, signedWith(authorization, pingEvent('captf-resync')));
  const peaks = sampler.stop();
  const counts = sys.audit.countFor(USERS['mirror-sync'], mark);
  const bytes = (await responseBytes(sys.admin)) - bytes0;
  if (current.status !== 200) at.ctx.log(`resync, all current, answered ${current.status}`);
  return [
    { row, what: 'resync, all current: ping → answer', unit: 'ms', samples: [current.ms], baseline },
    {
      row,
      what: 'resync, all current: API requests',
      unit: 'count',
      samples: [counts.requests],
      baseline: { what: 'LIST pages', samples: [at.pages] },
    },
    {
      row,
      what: 'resync, all current: API requests per consumer',
      unit: 'count',
      samples: [counts.requests / at.consumers],
    },
    { row, what: 'resync, all current: bytes read (GET+LIST)', unit: 'bytes', samples: [bytes] },
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
  ];
}

/** Rotation number `n` of the source (every mirror must change) and one resync ping. */
async function rotation(at: AtSize, n: number): Promise<Figure[]> {
  const { sys } = at.ctx;
  const { row, baseline, namespaces } = at;
  const ms = sys.functions['mirror-sync'];
  const authorization = await sys.sign('mirror-sync');
  const value = `resync-${n}`;
  const want = Buffer.from(value).toString('base64');
  const mark = sys.audit.mark();
  const sampler = samplePeaks({ 'mirror-sync': ms.pid });
  await putSourceSecret(sys.admin, SOURCE, { token: value });
  const t0 = performance.now();
  const allNew = at.ctx.mirrors.until(
    'every mirror rotated',
    (m) => namespaces.every((ns) => m.get(`${ns}/${mirrorOf(IDENTITY)}`)?.data?.token === want),
    at.ctx.timeoutMs,
  );
  const rotated = await postEvent(`${ms.url}/`, signedWith(authorization, pingEvent('captf-resync')));
  const currentMs = (await allNew) - t0;
  const peaks = sampler.stop();
  const counts = sys.audit.countFor(USERS['mirror-sync'], mark);
  return [
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
  ];
}

/** identity-status's refresh at this size: its ping, timed the same way. */
async function identityStatusRefresh(at: AtSize): Promise<Figure[]> {
  const { sys } = at.ctx;
  const { row, baseline } = at;
  const status = sys.functions['identity-status'];
  const mark = sys.audit.mark();
  const sampler = samplePeaks({ 'identity-status': status.pid });
  const refresh = await pingUntilDone(status.url, 'captf-identity-status', await sys.sign('identity-status'));
  const peaks = sampler.stop();
  const counts = sys.audit.countFor(USERS['identity-status'], mark);
  return [
    { row, what: 'identity-status ping → answer', unit: 'ms', samples: [refresh.ms], baseline },
    { row, what: 'identity-status API requests', unit: 'count', samples: [counts.requests] },
    {
      row,
      what: 'identity-status peak RSS',
      unit: 'bytes',
      samples: [peaks.rss['identity-status'] ?? 0],
      baseline: { what: 'manifest memory limit', samples: [sys.memoryLimits['identity-status']] },
    },
  ];
}
