/**
 * Rows "identity grant" and "identity revoke": an identity that allows none of N namespaces,
 * one consumer in each (decided `NamespaceNotAllowed` before the window opens), is updated
 * to list all N: time until every mirror exists and every consumer is `CredentialsMirrored=True`,
 * and mirror-sync's API requests per namespace, everything included (the identity's pass, the
 * conditions and Events, the echoes of its own status writes). Then the list goes back to none:
 * time until every mirror is gone, and requests per namespace again. Over the delivery path
 * in use (scripts/bench/paths.ts; the row's name ends with it). Baselines: N plain Secret
 * creates in one namespace, and deleting a Secret in each of the N namespaces.
 */
import { secretCreates, secretDeletes } from '../baselines.ts';
import { WatchedCollection } from '../collection.ts';
import {
  IDENTITIES,
  consumersPath,
  createConsumers,
  createIdentity,
  createNamespaces,
  hasTrue,
  mirrorOf,
  putSourceSecret,
  spreadOver,
  type Consumer,
} from '../fixtures.ts';
import { onPath, type DeliveryPath } from '../paths.ts';
import type { Figure } from '../report.ts';
import { USERS } from '../../system/users.ts';
import { whileAlive, type RowContext } from './context.ts';

/** What one identity update measured. */
interface Change {
  ms: number;
  requests: number;
  mirrorWrites: number;
  conflicts: number;
  events: number;
  retried: number;
}

/**
 * Runs the grant and revoke rows at each of `sizes` on the delivery path in use.
 * @throws Error when a change does not converge within the timeout.
 */
export async function grantRows(ctx: RowContext, sizes: readonly number[], path: DeliveryPath): Promise<Figure[]> {
  const figures: Figure[] = [];
  for (const n of sizes) figures.push(...(await grantAndRevoke(ctx, n, path)));
  return figures;
}

async function grantAndRevoke(ctx: RowContext, n: number, path: DeliveryPath): Promise<Figure[]> {
  const { sys } = ctx;
  const identity = ctx.next('grant');
  const none = { list: [`${identity}-nowhere`] };
  const namespaces = Array.from({ length: n }, () => ctx.next('gr'));
  ctx.log(`identity grant and revoke [${path}]: ${n} namespaces, one consumer each`);
  await putSourceSecret(sys.admin, 'bench-grant-creds', { token: 'grant' });
  await createIdentity(sys.admin, { name: identity, secret: 'bench-grant-creds', allowedNamespaces: none });
  await createNamespaces(sys.admin, namespaces, {});
  sys.events.fronts['mirror-sync'].mode = { kind: 'deliver', targets: [sys.functions['mirror-sync'].url] };
  const consumers = await new WatchedCollection<Consumer>(
    sys.admin,
    consumersPath('terraformmachines'),
    `labelSelector=${encodeURIComponent(`captf-bench/grant=${identity}`)}`,
  ).start();
  try {
    await createConsumers(sys.admin, {
      plural: 'terraformmachines',
      items: spreadOver(namespaces, 1, 'g'),
      identity,
      labels: { 'captf-bench/grant': identity },
    });
    await alive(
      ctx,
      consumers.until(
        `${n} consumers decided not allowed`,
        (m) => m.size === n && [...m.values()].every((c) => hasCondition(c, 'IdentityAllowed', 'False')),
        ctx.timeoutMs,
      ),
    );
    await sys.events.settled(ctx.quietMs, ctx.timeoutMs);
    const mirrorsOf = (m: ReadonlyMap<string, unknown>) =>
      namespaces.filter((ns) => m.has(`${ns}/${mirrorOf(identity)}`));
    const granted = await change(ctx, identity, { list: namespaces }, () =>
      Promise.all([
        ctx.mirrors.until(`${n} mirrors created`, (m) => mirrorsOf(m).length === n, ctx.timeoutMs),
        consumers.until(
          `${n} consumers mirrored`,
          (m) => [...m.values()].every((c) => hasTrue(c, 'CredentialsMirrored')),
          ctx.timeoutMs,
        ),
      ]).then((ts) => Math.max(...ts)),
    );
    const revoked = await change(ctx, identity, none, () =>
      ctx.mirrors.until(`${n} mirrors deleted`, (m) => mirrorsOf(m).length === 0, ctx.timeoutMs),
    );
    return [
      ...changeFigures(onPath(`identity grant N=${n}`, path), granted, n, await createsFloor(ctx, n)),
      ...changeFigures(onPath(`identity revoke N=${n}`, path), revoked, n, {
        what: `delete a Secret in each of ${n} namespaces`,
        ms: await secretDeletes(sys.admin, namespaces, `bl-${identity}`),
      }),
    ];
  } finally {
    consumers.stop();
  }
}

/** `wait`, failing at once if mirror-sync exits meanwhile. */
const alive = <T>(ctx: RowContext, wait: Promise<T>): Promise<T> =>
  whileAlive(wait, [ctx.sys.functions['mirror-sync']]);

/** Whether a consumer carries condition `type` with `status`. */
const hasCondition = (c: Consumer, type: string, status: string): boolean =>
  (c.status?.conditions ?? []).some((x) => x.type === type && x.status === status);

/**
 * Sets the identity's `allowedNamespaces` and measures until `done` resolves (the time of the
 * watch event after which the change holds), then until deliveries settle: mirror-sync's requests.
 */
async function change(
  ctx: RowContext,
  identity: string,
  allowedNamespaces: unknown,
  done: () => Promise<number>,
): Promise<Change> {
  const { sys } = ctx;
  const mark = sys.audit.mark();
  sys.events.resetCounts();
  const t0 = performance.now();
  const reached = done();
  await sys.admin.call(
    'PATCH',
    `${IDENTITIES}/${identity}`,
    { spec: { allowedNamespaces } },
    'application/merge-patch+json',
  );
  const ms = (await alive(ctx, reached)) - t0;
  await sys.events.settled(ctx.quietMs, ctx.timeoutMs);
  const counts = sys.audit.countFor(USERS['mirror-sync'], mark);
  const front = sys.events.fronts['mirror-sync'].counts;
  return {
    ms,
    requests: counts.requests,
    mirrorWrites: counts.mirrorWrites,
    conflicts: counts.conflicts,
    events: front.events,
    retried: front.retried,
  };
}

/** N Secret creates in a fresh namespace: the floor of N mirrors. */
async function createsFloor(ctx: RowContext, n: number): Promise<{ what: string; ms: number }> {
  const ns = ctx.next('bl');
  await createNamespaces(ctx.sys.admin, [ns], {});
  return { what: `${n} Secret creates`, ms: await secretCreates(ctx.sys.admin, ns, n, 's') };
}

function changeFigures(row: string, c: Change, n: number, floor: { what: string; ms: number }): Figure[] {
  return [
    {
      row,
      what: 'time until every namespace is done',
      unit: 'ms',
      samples: [c.ms],
      baseline: { what: floor.what, samples: [floor.ms] },
    },
    {
      row,
      what: 'mirror-sync API requests per namespace',
      unit: 'count',
      samples: [c.requests / n],
      baseline: { what: 'one Secret write per namespace', samples: [1] },
    },
    {
      row,
      what: 'mirror writes',
      unit: 'count',
      samples: [c.mirrorWrites],
      baseline: { what: 'mirrors to write', samples: [n] },
    },
    { row, what: '409 conflicts', unit: 'count', samples: [c.conflicts] },
    { row, what: 'events delivered to mirror-sync', unit: 'count', samples: [c.events] },
    { row, what: 'deliveries retried', unit: 'count', samples: [c.retried] },
  ];
}
