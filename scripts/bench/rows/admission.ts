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
import { USERS } from '../../system/users.ts';
import type { BenchSystem, RowContext } from './context.ts';
import { webhookConfiguration } from '../../system/webhook.ts';
import { sleep } from '../../lib/wait.ts';

const WEBHOOKS = '/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations';
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
  sys.events.fronts['mirror-sync'].mode = { kind: 'drop' };
  await putSourceSecret(sys.admin, 'bench-admission-creds', { token: 'admission' });
  await sys.admin.call(
    'POST',
    WEBHOOKS,
    webhookConfiguration({
      url: sys.functions.admission.url,
      caBundlePem: sys.webhookCaPem,
      name: WEBHOOK,
      matchLabels: { [REVIEWED]: 'true' },
    }),
  );
  try {
    await webhookActive(sys);
    const mark = sys.audit.mark();
    const sampler = samplePeaks({ admission: sys.functions.admission.pid });
    const { reviewed, plain } = await measure(sys, ctx.next('adm'), Math.max(1, Math.floor(requests / 4)));
    const peaks = sampler.stop();
    return figures(sys, {
      reviewed,
      plain,
      sars: sys.audit.countFor(USERS.admission, mark).verbs.create ?? 0,
      peakRss: peaks.rss.admission ?? 0,
    });
  } finally {
    await sys.admin.raw('DELETE', `${WEBHOOKS}/${WEBHOOK}`);
  }
}

/**
 * The API server picks the configuration up asynchronously: waits until it denies a bad spec.
 * @throws Error after 30 s.
 */
async function webhookActive(sys: BenchSystem): Promise<void> {
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
    if (r.status >= 400) return;
    if (Date.now() > deadline) throw new Error('the admission webhook did not take effect within 30 s');
    await sleep(200);
  }
}

/** `pairs` creates, then `pairs` widening updates, each a reviewed one and an unreviewed one in turn. */
async function measure(
  sys: BenchSystem,
  prefix: string,
  pairs: number,
): Promise<{ reviewed: number[]; plain: number[] }> {
  const reviewed: number[] = [];
  const plain: number[] = [];
  const create = (name: string, labels?: Record<string, string>) =>
    timed(() =>
      createIdentity(sys.admin, {
        name,
        secret: 'bench-admission-creds',
        allowedNamespaces: { list: ['a'] },
        ...(labels ? { labels } : {}),
      }),
    );
  for (let i = 0; i < pairs; i++) {
    reviewed.push(await create(`${prefix}-r-${i}`, { [REVIEWED]: 'true' }));
    plain.push(await create(`${prefix}-p-${i}`));
  }
  // Widening updates: each reviewed one needs a SubjectAccessReview.
  const widen = { spec: { allowedNamespaces: { list: ['a', 'b'] } } };
  const update = (name: string) =>
    timed(() => sys.admin.call('PATCH', `${IDENTITIES}/${name}`, widen, 'application/merge-patch+json'));
  for (let i = 0; i < pairs; i++) {
    reviewed.push(await update(`${prefix}-r-${i}`));
    plain.push(await update(`${prefix}-p-${i}`));
  }
  return { reviewed, plain };
}

/** The row's figures from the timings, the SubjectAccessReviews counted and the peak RSS. */
function figures(
  sys: BenchSystem,
  m: { reviewed: number[]; plain: number[]; sars: number; peakRss: number },
): Figure[] {
  const r = summarize(m.reviewed);
  const p = summarize(m.plain);
  const row = `admission overhead, ${m.reviewed.length + m.plain.length} requests`;
  return [
    {
      row,
      what: 'identity create/update, reviewed',
      unit: 'ms',
      samples: m.reviewed,
      baseline: { what: 'not reviewed', samples: m.plain },
    },
    { row, what: 'added by the webhook, p50', unit: 'ms', samples: [r.median - p.median] },
    { row, what: 'added by the webhook, p99', unit: 'ms', samples: [r.p99 - p.p99] },
    {
      row,
      what: 'SubjectAccessReviews',
      unit: 'count',
      samples: [m.sars],
      baseline: { what: 'reviewed requests', samples: [m.reviewed.length] },
    },
    {
      row,
      what: 'admission peak RSS',
      unit: 'bytes',
      samples: [m.peakRss],
      baseline: { what: 'manifest memory limit', samples: [sys.memoryLimits.admission] },
    },
  ];
}
