/**
 * Row "revocation": an identity used by consumers in 10 namespaces (listed by name) is
 * narrowed to drop 5; time from the identity update to the watch events of the 5 mirrors'
 * deletion, and the DELETEs mirror-sync issued, over the delivery path in use
 * (scripts/bench/paths.ts; the row's name ends with it). Baseline: deleting 5 Secrets in
 * those namespaces directly, seen on a watch the same way.
 */
import { secretDeletes } from '../baselines.ts';
import { IDENTITIES, createIdentity, mirrorOf, putSourceSecret } from '../fixtures.ts';
import { onPath, type DeliveryPath } from '../paths.ts';
import type { Figure } from '../report.ts';
import { USERS } from '../../system/users.ts';
import { burst, whileAlive, type RowContext } from './context.ts';

/**
 * @param perNamespace consumers in each of the 10 namespaces.
 * @throws Error when the mirrors are not gone within the timeout.
 */
export async function revocationRow(ctx: RowContext, perNamespace: number, path: DeliveryPath): Promise<Figure[]> {
  const { sys } = ctx;
  const identity = ctx.next('revoke');
  const namespaces = Array.from({ length: 10 }, () => ctx.next('rv'));
  await putSourceSecret(sys.admin, 'bench-revoke-creds', { token: 'revocation' });
  await createIdentity(sys.admin, {
    name: identity,
    secret: 'bench-revoke-creds',
    allowedNamespaces: { list: namespaces },
  });
  ctx.log(`revocation [${path}]: ${10 * perNamespace} consumers over 10 namespaces`);
  await burst(ctx, { identity, namespaces, perNamespace, pids: { 'mirror-sync': sys.functions['mirror-sync'].pid } });
  const dropped = namespaces.slice(5);
  const mark = sys.audit.mark();
  sys.events.resetCounts();
  const t0 = performance.now();
  const gone = ctx.mirrors.until(
    'revoked mirrors deleted',
    (m) => dropped.every((ns) => !m.has(`${ns}/${mirrorOf(identity)}`)),
    ctx.timeoutMs,
  );
  await sys.admin.call(
    'PATCH',
    `${IDENTITIES}/${identity}`,
    { spec: { allowedNamespaces: { list: namespaces.slice(0, 5) } } },
    'application/merge-patch+json',
  );
  const revokedMs = (await whileAlive(gone, [sys.functions['mirror-sync']])) - t0;
  await sys.events.settled(ctx.quietMs, ctx.timeoutMs);
  const counts = sys.audit.countFor(USERS['mirror-sync'], mark);
  const deliveries = { ...sys.events.fronts['mirror-sync'].counts };
  const deadLetters = sys.events.deadLetters.counts.requests;
  const floor = await secretDeletes(sys.admin, dropped, 'bl-revoke');
  const row = onPath(`revocation, 5 of 10 namespaces, ${10 * perNamespace} consumers`, path);
  return [
    {
      row,
      what: 'identity narrowed → 5 mirrors gone',
      unit: 'ms',
      samples: [revokedMs],
      baseline: { what: 'delete 5 Secrets', samples: [floor] },
    },
    {
      row,
      what: 'Secret DELETEs by mirror-sync',
      unit: 'count',
      samples: [counts.secretDeletes],
      baseline: { what: 'mirrors to delete', samples: [5] },
    },
    { row, what: 'mirror-sync API requests', unit: 'count', samples: [counts.requests] },
    { row, what: 'events delivered to mirror-sync', unit: 'count', samples: [deliveries.events] },
    { row, what: 'deliveries retried', unit: 'count', samples: [deliveries.retried] },
    { row, what: 'dead letters', unit: 'count', samples: [deadLetters] },
  ];
}
