/**
 * Row "prepare": what one `POST /prepare` costs (SPEC §5) for a consumer whose mirror is
 * already current, called the way the provider's manager calls it: with its review cache
 * (one token, call after call: the TokenReview and the SubjectAccessReview are reused for up
 * to 10 s) and without (a new token for every call, so both reviews are made each time).
 * Time per call beside one Secret create round trip interleaved call by call; mirror-sync's
 * API requests (and of them the reviews), from the audit log, beside the number of calls.
 */
import { loadKubeConfig } from '../../../functions/lib/kube.ts';
import { DEFAULT_PREPARE_AUDIENCE } from '../../../functions/mirror-sync/authorize.ts';
import { prepareCaller, serviceAccountToken } from '../../lib/serviceaccount.ts';
import { secretRoundTrip } from '../baselines.ts';
import { consumerBody, consumersPath, createNamespaces, GROUP_VERSION } from '../fixtures.ts';
import type { RequestCounts } from '../measure.ts';
import type { Figure } from '../report.ts';
import { USERS } from '../../system/users.ts';
import type { BenchSystem, RowContext } from './context.ts';
import { BURST_IDENTITY } from './fan-in.ts';

/** The namespace of the manager's ServiceAccount (the manifests bind the prepare role there). */
const MANAGER_NAMESPACE = 'captf-system';

/** One phase: per-call times, the interleaved floor, and mirror-sync's requests over it. */
interface Phase {
  ms: number[];
  floor: number[];
  counts: RequestCounts;
}

/**
 * Measures `calls` prepare calls with the cache and `calls` without it.
 * @throws Error when a prepare call does not answer 200.
 */
export async function prepareRow(ctx: RowContext, calls: number): Promise<Figure[]> {
  const { sys } = ctx;
  // Consumer events would land in the measured window: the front drops them (prepare reconciles itself).
  sys.events.fronts['mirror-sync'].mode = { kind: 'drop' };
  const namespace = ctx.next('prep');
  const baseNs = ctx.next('bl');
  await createNamespaces(sys.admin, [namespace]);
  await createNamespaces(sys.admin, [baseNs], {});
  await sys.admin.call(
    'POST',
    consumersPath('terraformclusters', namespace),
    consumerBody('terraformclusters', 'c-0', BURST_IDENTITY),
  );
  const kc = loadKubeConfig(sys.cp.kubeconfigPath);
  const sa = { namespace: MANAGER_NAMESPACE, name: ctx.next('manager') };
  const manager = await prepareCaller(kc, { ...sa, suffix: 'bench' });
  try {
    // A new token of the manager's ServiceAccount for each uncached call.
    const fresh: string[] = [];
    const audience = DEFAULT_PREPARE_AUDIENCE;
    for (let i = 0; i < calls; i++) fresh.push(await serviceAccountToken(kc, { ...sa, audience }));
    const body = JSON.stringify({ apiVersion: GROUP_VERSION, kind: 'TerraformCluster', namespace, name: 'c-0' });
    const call = (token: string) => timedPrepare(sys, body, token);
    await call(manager.token); // creates the mirror; the calls measured find it current
    const cached = await phase(sys, calls, { baseNs, prefix: 'pc', call: () => call(manager.token) });
    const uncached = await phase(sys, calls, { baseNs, prefix: 'pu', call: (i) => call(fresh[i]!) });
    return figures(calls, cached, uncached);
  } finally {
    await manager.cleanup();
  }
}

/** One prepare call, timed. @throws Error unless it answers 200. */
async function timedPrepare(sys: BenchSystem, body: string, token: string): Promise<number> {
  const t0 = performance.now();
  const res = await fetch(`${sys.functions['mirror-sync'].url}/prepare`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body,
  });
  const text = await res.text();
  const ms = performance.now() - t0;
  if (res.status !== 200) throw new Error(`prepare answered ${res.status}: ${text.slice(0, 200)}`);
  return ms;
}

/** `calls` calls, each after one Secret create round trip; mirror-sync's requests over the phase. */
async function phase(
  sys: BenchSystem,
  calls: number,
  p: { baseNs: string; prefix: string; call: (i: number) => Promise<number> },
): Promise<Phase> {
  const ms: number[] = [];
  const floor: number[] = [];
  const mark = sys.audit.mark();
  for (let i = 0; i < calls; i++) {
    floor.push(await secretRoundTrip(sys.admin, p.baseNs, `${p.prefix}-${i}`));
    ms.push(await p.call(i));
  }
  // The audit log is written after the answer: give its last lines a moment.
  await new Promise((r) => setTimeout(r, 500));
  return { ms, floor, counts: sys.audit.countFor(USERS['mirror-sync'], mark) };
}

/** The row's figures: time per call and requests, with and without the cache. */
function figures(calls: number, cached: Phase, uncached: Phase): Figure[] {
  const row = `prepare, ${calls} calls, mirror current`;
  const perCall = { what: 'prepare calls', samples: [calls] };
  const timeFigure = (what: string, p: Phase): Figure => ({
    row,
    what,
    unit: 'ms',
    samples: p.ms,
    baseline: { what: 'Secret create round trip', samples: p.floor },
  });
  const countFigures = (label: string, p: Phase): Figure[] => [
    { row, what: `mirror-sync API requests, ${label}`, unit: 'count', samples: [p.counts.requests], baseline: perCall },
    {
      row,
      what: `of them TokenReviews + SARs, ${label}`,
      unit: 'count',
      samples: [p.counts.reviews],
      baseline: perCall,
    },
  ];
  return [
    timeFigure('per call, reviews cached', cached),
    timeFigure('per call, reviews not cached (new token each call)', uncached),
    ...countFigures('cached', cached),
    ...countFigures('not cached', uncached),
  ];
}
