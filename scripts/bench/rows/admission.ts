/**
 * Row "admission overhead": identity creates and widening updates through the API server,
 * half of them reviewed by the admission function (a ValidatingWebhookConfiguration whose
 * objectSelector picks them by label) and half not, interleaved one by one so both halves
 * see the same machine. Each reviewed request costs a SubjectAccessReview (SPEC §10).
 * Baseline: the unreviewed requests of the same run; "added" = reviewed − unreviewed.
 */
import { IDENTITIES, createIdentity, putSourceSecret } from '../fixtures.ts';
import { samplePeaks } from '../measure.ts';
import type { Figure } from '../report.ts';
import { summarize } from '../stats.ts';
import { USERS } from '../system.ts';
import type { RowContext } from './context.ts';

const WEBHOOK = 'captf-bench-admission';
const REVIEWED = 'captf-bench/admission';

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}

/**
 * Registers the webhook, waits until the API server calls it, then measures `requests`
 * requests (creates, then updates; half reviewed).
 * @throws Error when the webhook never takes effect.
 */
export async function admissionRow(ctx: RowContext, requests: number): Promise<Figure[]> {
  const { sys } = ctx;
  const adm = sys.functions.admission;
  sys.relay.setMode({ kind: 'drop' });
  await putSourceSecret(sys.admin, 'bench-admission-creds', { token: 'admission' });
  await sys.admin.call('POST', '/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations', {
    metadata: { name: WEBHOOK },
    webhooks: [
      {
        name: 'identities.captf-bench.local',
        clientConfig: { url: `${adm.url}/validate`, caBundle: Buffer.from(sys.webhookCaPem).toString('base64') },
        rules: [
          {
            apiGroups: ['infrastructure.cluster.x-k8s.io'],
            apiVersions: ['v1beta2'],
            operations: ['CREATE', 'UPDATE', 'DELETE'],
            resources: ['terraformclusteridentities'],
            scope: 'Cluster',
          },
        ],
        objectSelector: { matchLabels: { [REVIEWED]: 'true' } },
        failurePolicy: 'Fail',
        sideEffects: 'None',
        admissionReviewVersions: ['v1'],
        timeoutSeconds: 10,
      },
    ],
  });
  try {
    // The API server picks the configuration up asynchronously: wait until it denies a bad spec.
    const deadline = Date.now() + 30_000;
    for (let i = 0; ; i++) {
      const r = await sys.admin.raw('POST', IDENTITIES, {
        apiVersion: 'infrastructure.cluster.x-k8s.io/v1beta2',
        kind: 'TerraformClusterIdentity',
        metadata: { name: `bench-probe-${i}`, labels: { [REVIEWED]: 'true' } },
        spec: {
          secretRef: { name: 'bench-admission-creds', namespace: 'captf-system' },
          allowedNamespaces: { selector: { matchExpressions: [{ key: 'a', operator: 'In' }] } },
        },
      });
      if (r.status >= 400) break;
      if (Date.now() > deadline) throw new Error('the admission webhook did not take effect within 30 s');
      await new Promise((res) => setTimeout(res, 200));
    }
    const pairs = Math.max(1, Math.floor(requests / 4));
    const reviewed: number[] = [];
    const plain: number[] = [];
    const mark = sys.audit.mark();
    const sampler = samplePeaks({ admission: adm.pid });
    const prefix = ctx.next('adm');
    for (let i = 0; i < pairs; i++) {
      reviewed.push(
        await timed(() =>
          createIdentity(
            sys.admin,
            `${prefix}-r-${i}`,
            'bench-admission-creds',
            { list: ['a'] },
            { [REVIEWED]: 'true' },
          ),
        ),
      );
      plain.push(
        await timed(() => createIdentity(sys.admin, `${prefix}-p-${i}`, 'bench-admission-creds', { list: ['a'] })),
      );
    }
    // Widening updates: each reviewed one needs a SubjectAccessReview.
    const widen = { spec: { allowedNamespaces: { list: ['a', 'b'] } } };
    for (let i = 0; i < pairs; i++) {
      reviewed.push(
        await timed(() =>
          sys.admin.call('PATCH', `${IDENTITIES}/${prefix}-r-${i}`, widen, 'application/merge-patch+json'),
        ),
      );
      plain.push(
        await timed(() =>
          sys.admin.call('PATCH', `${IDENTITIES}/${prefix}-p-${i}`, widen, 'application/merge-patch+json'),
        ),
      );
    }
    const peaks = sampler.stop();
    const counts = sys.audit.countFor(USERS.admission, mark);
    const r = summarize(reviewed);
    const p = summarize(plain);
    const row = `admission overhead, ${reviewed.length + plain.length} requests`;
    return [
      {
        row,
        what: 'identity create/update, reviewed',
        unit: 'ms',
        samples: reviewed,
        baseline: { what: 'not reviewed', samples: plain },
      },
      { row, what: 'added by the webhook, p50', unit: 'ms', samples: [r.median - p.median] },
      { row, what: 'added by the webhook, p99', unit: 'ms', samples: [r.p99 - p.p99] },
      {
        row,
        what: 'SubjectAccessReviews',
        unit: 'count',
        samples: [counts.verbs.create ?? 0],
        baseline: { what: 'reviewed requests', samples: [reviewed.length] },
      },
      {
        row,
        what: 'admission peak RSS',
        unit: 'bytes',
        samples: [peaks.rss.admission ?? 0],
        baseline: { what: 'manifest memory limit', samples: [sys.memoryLimits.admission] },
      },
    ];
  } finally {
    await sys.admin.raw('DELETE', `/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/${WEBHOOK}`);
  }
}
