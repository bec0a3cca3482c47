/**
 * Row "event → mirror": one new consumer in a namespace without a mirror; time from its
 * create to the watch event of its mirror's creation, over the delivery path in use
 * (scripts/bench/paths.ts; the row's name ends with it). Baseline: one Secret create round
 * trip, interleaved sample by sample. Then what an echo costs: the update event our status
 * write brings, sent again for each (now decided) consumer straight to mirror-sync, and its
 * API requests counted.
 */
import { secretRoundTrip } from '../baselines.ts';
import {
  consumerBody,
  consumerEvent,
  consumersPath,
  createNamespaces,
  mirrorOf,
  postEvent,
  signedWith,
} from '../fixtures.ts';
import { USERS } from '../../system/users.ts';
import { onPath, type DeliveryPath } from '../paths.ts';
import type { Figure } from '../report.ts';
import { whileAlive, type RowContext } from './context.ts';
import { BURST_IDENTITY } from './fan-in.ts';

/**
 * Measures `samples` consumers, each in its own namespace.
 * @throws Error when a mirror does not appear within the timeout.
 */
export async function eventToMirrorRow(ctx: RowContext, samples: number, path: DeliveryPath): Promise<Figure[]> {
  const { sys } = ctx;
  const namespaces = Array.from({ length: samples }, () => ctx.next('e2m'));
  const baseNs = ctx.next('bl');
  await createNamespaces(sys.admin, namespaces);
  await createNamespaces(sys.admin, [baseNs], {});
  sys.events.fronts['mirror-sync'].mode = { kind: 'deliver', targets: [sys.functions['mirror-sync'].url] };
  await sys.events.settled(Math.min(500, ctx.quietMs), ctx.timeoutMs);
  const times: number[] = [];
  const floor: number[] = [];
  for (const [i, ns] of namespaces.entries()) {
    floor.push(await secretRoundTrip(sys.admin, baseNs, `s-${i}`));
    const t0 = performance.now();
    const seen = ctx.mirrors.until(`mirror in ${ns}`, (m) => m.has(`${ns}/${mirrorOf(BURST_IDENTITY)}`), ctx.timeoutMs);
    await sys.admin.call(
      'POST',
      consumersPath('terraformmachines', ns),
      consumerBody('terraformmachines', 'm-0', BURST_IDENTITY),
    );
    times.push((await whileAlive(seen, [sys.functions['mirror-sync']])) - t0);
    await sys.events.settled(Math.min(300, ctx.quietMs), ctx.timeoutMs);
  }
  const echo = await echoCost(ctx, namespaces);
  return [
    {
      row: onPath('event → mirror', path),
      what: 'consumer create → mirror exists',
      unit: 'ms',
      samples: times,
      baseline: { what: 'Secret create round trip', samples: floor },
    },
    {
      row: onPath('event → mirror', path),
      what: 'API requests per echo of our status write',
      unit: 'count',
      samples: [echo.requests],
    },
    {
      row: onPath('event → mirror', path),
      what: "sender check's TokenReviews per echo",
      unit: 'count',
      samples: [echo.reviews],
    },
  ];
}

/**
 * The echo of our own status write (SPEC §12), once per namespace's consumer: the update
 * event the ApiServerSource sends for it, posted straight to mirror-sync. Its answer names
 * nothing, so an echo is told from a reconcile by its cost: it reads the consumer and stops,
 * where a reconcile also reads the identity, the namespace, the source and the mirror.
 * @returns per event, its API requests apart from the sender check's TokenReviews, and those
 *   (one per signing token while the function caches its answer: when it falls due is timing).
 * @throws Error when an answer is not 200, or an event cost a reconcile's requests.
 */
async function echoCost(
  ctx: RowContext,
  namespaces: readonly string[],
): Promise<{ requests: number; reviews: number }> {
  const { sys } = ctx;
  const total = { requests: 0, reviews: 0 };
  for (const ns of namespaces) {
    const mark = sys.audit.mark();
    const event = signedWith(await sys.sign('mirror-sync'), consumerEvent('terraformmachines', ns, 'm-0'));
    const r = await postEvent(sys.functions['mirror-sync'].url, event);
    const made = sys.audit.countFor(USERS['mirror-sync'], mark);
    const own = made.requests - made.reviews;
    if (r.status !== 200 || own > ECHO_MAX_REQUESTS)
      throw new Error(`the echo in ${ns} was not recognised: HTTP ${r.status}, ${own} API requests`);
    total.requests += own;
    total.reviews += made.reviews;
  }
  return { requests: total.requests / namespaces.length, reviews: total.reviews / namespaces.length };
}

/** The most API requests an echo may make (its read of the consumer); a reconcile makes four or more. */
const ECHO_MAX_REQUESTS = 1;
