/**
 * Row "event → mirror": one new consumer in a namespace without a mirror; time from its
 * create to the watch event of its mirror's creation, over the delivery path in use
 * (scripts/bench/paths.ts; the row's name ends with it). Baseline: one Secret create round
 * trip, interleaved sample by sample.
 */
import { secretRoundTrip } from '../baselines.ts';
import { consumerBody, consumersPath, createNamespaces, mirrorOf } from '../fixtures.ts';
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
  return [
    {
      row: onPath('event → mirror', path),
      what: 'consumer create → mirror exists',
      unit: 'ms',
      samples: times,
      baseline: { what: 'Secret create round trip', samples: floor },
    },
  ];
}
