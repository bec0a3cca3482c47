/**
 * SPEC §13, telemetry, through the real path: admission runs as its container does
 * (`node functions/main.ts admission`, as its ServiceAccount on the shared control plane) with
 * OpenTelemetry's standard variables pointing at a real Prometheus's OTLP receiver; a scripted
 * set of requests is made, the function is stopped with SIGTERM (its last push is part of the
 * drain), and PromQL reads back exactly what was done. A planted value in the reviewed object
 * and user appears in no series.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startPrometheus, type Prometheus, type Sample } from '../../scripts/observability/prometheus.ts';
import { admissionReview, identityRequest } from '../helpers/admission.ts';
import * as fx from '../helpers/fixtures.ts';
import { sentinel } from '../helpers/logs.ts';
import { spawnFunction } from '../helpers/process.ts';

const w = fx.world('telemetry');
const work = mkdtempSync(join(tmpdir(), 'captf-telemetry-'));
let prometheus: Prometheus;

before(async () => {
  prometheus = await startPrometheus({ dir: join(work, 'prometheus') });
});

after(async () => {
  await prometheus?.stop();
  rmSync(work, { recursive: true, force: true });
});

/** The series of `promql` as `labels → value`, with `labels` the values of `keys` joined by `|`. */
async function seriesOf(promql: string, keys: readonly string[]): Promise<Record<string, number>> {
  const samples: Sample[] = await prometheus.query(promql);
  return Object.fromEntries(samples.map((s) => [keys.map((k) => s.metric[k] ?? '').join('|'), s.value]));
}

describe('metrics pushed over OTLP to a real Prometheus (SPEC §13)', () => {
  it('counts exactly the answers and reviews a scripted run made, pushed by the SIGTERM drain, naming nothing', async () => {
    const planted = sentinel();
    const account = await w.account('captf-admission');
    const service = `captf-admission-${w.name('t')}`;
    const fn = await spawnFunction('admission', {
      KUBECONFIG: account.kubeconfigPath,
      CAPTF_ADMISSION_PLAIN_HTTP: 'true',
      OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: prometheus.otlpMetricsEndpoint,
      OTEL_SERVICE_NAME: service,
    });
    let exit: number | null;
    try {
      assert.ok(fn.output().includes('"metrics pushed over OTLP"'), fn.output());
      const base = `http://127.0.0.1:${fn.port}`;
      const post = (path: string, body: string) =>
        fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      // A user with no rights names a Secret: a SubjectAccessReview, then a denial (answered 200).
      const object = fx.identity(`id-${planted}`, fx.secretRef('captf-system', planted), fx.allowList('x'));
      const review = admissionReview(
        identityRequest('CREATE', object, undefined, { name: object.metadata!.name!, userInfo: { username: planted } }),
      );
      const denied = await post('/validate', JSON.stringify(review));
      assert.equal(denied.status, 200);
      assert.equal(((await denied.json()) as { response: { allowed: boolean } }).response.allowed, false);
      assert.equal((await post('/validate', `{"not a review": "${planted}"`)).status, 400);
      for (let i = 0; i < 2; i++) assert.equal((await fetch(`${base}/healthz`)).status, 200);
      assert.equal((await post(`/${planted}`, '{}')).status, 404);
    } finally {
      await fn.stop();
      exit = await fn.exited;
    }
    assert.equal(exit, 0, fn.tail().join('\n'));

    const job = `job="${service}"`;
    assert.deepEqual(
      await seriesOf(`captf_admission_reviews_total{${job}}`, ['captf_operation', 'captf_decision']),
      { 'CREATE|denied': 1 },
      'one review, denied',
    );
    assert.deepEqual(
      await seriesOf(`http_server_request_duration_seconds_count{${job}}`, [
        'http_request_method',
        'http_route',
        'http_response_status_code',
      ]),
      { 'POST|/validate|200': 1, 'POST|/validate|400': 1, 'GET|/healthz|200': 2, 'POST|unmatched|404': 1 },
      'every answer, by route and code',
    );
    const everything = await prometheus.query(`{${job}}`);
    assert.ok(everything.length > 0);
    const text = JSON.stringify(everything);
    assert.ok(!text.includes(planted), `no series names the planted value: ${text.slice(0, 500)}`);
  });
});
