/**
 * SPEC §13, telemetry, through the real path: each function runs as its container does
 * (`node functions/main.ts <function>`, as its ServiceAccount on the shared control plane) with
 * OpenTelemetry's standard variables pointing at a real Prometheus's OTLP receiver; a scripted
 * set of requests and events is sent, the function is stopped with SIGTERM (its last push is
 * part of the drain), and PromQL reads back exactly what was done. A planted value in the
 * objects' names, the Secret's data and the reviewed user appears in no series. Then the shipped
 * dashboard and alerts (components/observability) are read against what the runs left: no
 * panel is dead, every alert reads metrics that exist, the dead letters' alert fires for them and
 * nothing else does, and the alert for an unreadable source fires once identity-status cannot
 * read one.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { startPrometheus, type Prometheus, type Sample } from '../../scripts/observability/prometheus.ts';
import { OBSERVABILITY_COMPONENT, shippedRuleGroups } from '../../scripts/observability/stack.ts';
import { IDENTITY_SELECTOR_ENV } from '../../functions/identity-status/index.ts';
import { admissionReview, identityRequest } from '../helpers/admission.ts';
import { eventually } from '../helpers/cluster.ts';
import { pingEvent } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';
import { sentinel } from '../helpers/logs.ts';
import { consumerEvent, createConsumers, deliver, identityEvent, operatorSource } from '../helpers/mirror-sync.ts';
import { spawnFunction, type FunctionProcess } from '../helpers/process.ts';

const w = fx.world('telemetry');
const work = mkdtempSync(join(tmpdir(), 'captf-telemetry-'));
let prometheus: Prometheus;

const ruleGroups = shippedRuleGroups();
const dashboard = JSON.parse(readFileSync(join(OBSERVABILITY_COMPONENT, 'dashboard.json'), 'utf8')) as {
  panels: { title: string; targets?: { expr: string }[] }[];
};

before(async () => {
  prometheus = await startPrometheus({ dir: join(work, 'prometheus'), ruleGroups });
});

after(async () => {
  await prometheus?.stop();
  rmSync(work, { recursive: true, force: true });
});

/** Runs `fn` against a spawned function, stops it with SIGTERM and asserts it exited 0 (its last push done). */
async function stopAfter(fn: FunctionProcess, work: () => Promise<void>): Promise<void> {
  try {
    assert.ok(fn.output().includes('"telemetry pushed over OTLP"'), fn.output());
    await work();
  } finally {
    await fn.stop();
  }
  assert.equal(await fn.exited, 0, fn.tail().join('\n'));
}

/** Asserts that no series of `job` holds `planted`. */
async function assertNothingPlanted(job: string, planted: string): Promise<void> {
  const everything = await prometheus.query(`{${job}}`);
  assert.ok(everything.length > 0);
  const text = JSON.stringify(everything);
  assert.ok(!text.includes(planted), `no series names the planted value: ${text.slice(0, 500)}`);
}

/**
 * The environment that points a function at the test's Prometheus as `service`, pushing every
 * 200 ms: a few samples per series, so the dashboard's rate() sees these short-lived processes.
 */
const otel = (service: string) => ({
  OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: prometheus.otlpMetricsEndpoint,
  OTEL_SERVICE_NAME: service,
  OTEL_METRIC_EXPORT_INTERVAL: '200',
});

/** The labels an API request's count is keyed by. */
const API_LABELS = ['captf_verb', 'captf_resource', 'http_response_status_code'] as const;

/** The series of `promql` as `labels → value`, with `labels` the values of `keys` joined by `|`. */
async function seriesOf(promql: string, keys: readonly string[]): Promise<Record<string, number>> {
  const samples: Sample[] = await prometheus.query(promql);
  return Object.fromEntries(samples.map((s) => [keys.map((k) => s.metric[k] ?? '').join('|'), s.value]));
}

describe('dead letters pushed over OTLP to a real Prometheus (SPEC §13)', () => {
  it('dead-letters: each dead letter counted by the function it was for, its type and code, naming nothing', async () => {
    const planted = sentinel();
    const service = `captf-dead-letters-${w.name('t')}`;
    const fn = await spawnFunction('dead-letters', {
      KUBECONFIG: (await w.account('captf-dead-letters')).kubeconfigPath,
      ...otel(service),
    });
    const letter = (id: string, code: string, dest: string) => ({
      'content-type': 'application/json',
      'ce-specversion': '1.0',
      'ce-id': id,
      'ce-source': 'https://127.0.0.1:6443',
      'ce-type': 'dev.knative.apiserver.ref.add',
      'ce-knativeerrorcode': code,
      'ce-knativeerrordest': dest,
      'ce-name': planted,
    });
    await stopAfter(fn, async () => {
      const post = async (headers: Record<string, string>) =>
        (await fetch(`http://127.0.0.1:${fn.port}/`, { method: 'POST', headers, body: '{}' })).status;
      const ms = 'http://captf-mirror-sync.captf-system.svc.cluster.local';
      assert.equal(await post(letter(`a-${planted}`, '500', ms)), 202);
      assert.equal(await post(letter('b', '500', ms)), 202);
      assert.equal(await post(letter('c', '400', 'http://captf-identity-status.captf-system.svc.cluster.local')), 202);
      assert.equal(await post(letter('d', planted, `http://${planted}.example/`)), 202);
    });
    const job = `job="${service}"`;
    assert.deepEqual(
      await seriesOf(`captf_dead_letters_total{${job}}`, ['captf_function', 'captf_event_type', 'captf_code']),
      {
        'mirror-sync|dev.knative.apiserver.ref.add|500': 2,
        'identity-status|dev.knative.apiserver.ref.add|400': 1,
        'other|dev.knative.apiserver.ref.add|none': 1,
      },
    );
    await assertNothingPlanted(job, planted);
  });
});

describe('metrics pushed over OTLP to a real Prometheus (SPEC §13)', () => {
  it('admission: counts exactly the answers and reviews a scripted run made, naming nothing', async () => {
    const planted = sentinel();
    const account = await w.account('captf-admission');
    const service = `captf-admission-${w.name('t')}`;
    const fn = await spawnFunction('admission', {
      KUBECONFIG: account.kubeconfigPath,
      CAPTF_ADMISSION_PLAIN_HTTP: 'true',
      ...otel(service),
    });
    await stopAfter(fn, async () => {
      const base = `http://127.0.0.1:${fn.port}`;
      const post = (path: string, body: string) =>
        fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      // A user with no rights names a Secret: a SubjectAccessReview, then a denial (answered 200).
      const lower = planted.toLowerCase();
      const object = fx.identity(`id-${lower}`, fx.secretRef('captf-system', lower), fx.allowList('x'));
      const review = admissionReview(
        identityRequest('CREATE', object, undefined, { name: object.metadata!.name!, userInfo: { username: planted } }),
      );
      const denied = await post('/validate', JSON.stringify(review));
      assert.equal(denied.status, 200);
      assert.equal(((await denied.json()) as { response: { allowed: boolean } }).response.allowed, false);
      assert.equal((await post('/validate', `{"not a review": "${planted}"`)).status, 400);
      for (let i = 0; i < 2; i++) assert.equal((await fetch(`${base}/healthz`)).status, 200);
      assert.equal((await post(`/${planted}`, '{}')).status, 404);
    });

    const job = `job="${service}"`;
    assert.deepEqual(
      await seriesOf(`captf_admission_reviews_total{${job}}`, ['captf_operation', 'captf_decision']),
      { 'CREATE|denied': 1 },
      'one review, denied',
    );
    assert.deepEqual(
      await seriesOf(`captf_access_checks_total{${job}}`, ['captf_check', 'captf_decision']),
      { 'SubjectAccessReview|denied': 1 },
      'the review asked one SubjectAccessReview',
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
    assert.deepEqual(
      await seriesOf(`captf_api_request_duration_seconds_count{${job}}`, API_LABELS),
      { 'create|subjectaccessreviews|201': 1 },
      'its one API request',
    );
    assert.equal((await seriesOf(`captf_process_startup_duration_seconds_count{${job}}`, []))[''], 1);
    await assertNothingPlanted(job, planted);
    await assertNothingPlanted(job, planted.toLowerCase());
  });

  it('mirror-sync and identity-status: mirrors, revocations, events and identities counted as the run made them', async () => {
    const planted = sentinel();
    const run = w.name('run');
    const source = await operatorSource(w, fx.data({ token: planted }));
    const [n1, n2] = [await w.namespace(), await w.namespace()];
    const id = await source.newIdentity(fx.allowList(n1, n2), fx.labels({ 'captf.test/run': run }));
    const consumers = [
      ...(await createConsumers(w, n1, id, `c-${planted.toLowerCase()}`, 3)),
      ...(await createConsumers(w, n2, id, 'd', 2)),
    ];
    const mirrorSync = `captf-mirror-sync-${run}`;
    const ms = await spawnFunction('mirror-sync', {
      KUBECONFIG: (await w.account('captf-mirror-sync')).kubeconfigPath,
      ...otel(mirrorSync),
    });
    await stopAfter(ms, async () => {
      const url = `http://127.0.0.1:${ms.port}/`;
      // One at a time, so each count is what one event did.
      for (const c of consumers) assert.equal((await deliver(url, consumerEvent(c))).status, 200);
      // The echo of a decision already written: nothing to do.
      assert.equal((await deliver(url, consumerEvent(consumers[0]!))).status, 200);
      // Narrowed to n1: n2's mirror is revoked, its two consumers told so.
      const narrowed = (await w.read(fx.identity(id)))!;
      narrowed.spec.allowedNamespaces = { list: [n1] };
      await w.put(narrowed);
      assert.equal((await deliver(url, identityEvent(narrowed))).status, 200);
      const bad = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
      assert.equal(bad.status, 400);
      // A Job's prepare without its token: refused before any work.
      assert.equal((await fetch(`${url}prepare`, { method: 'POST' })).status, 401);
    });
    const msJob = `job="${mirrorSync}"`;
    assert.deepEqual(
      await seriesOf(`captf_events_total{${msJob}}`, ['captf_event', 'captf_result']),
      { 'consumer|done': 5, 'consumer|skipped': 1, 'identity|done': 1, 'unusable|bad': 1 },
      'every event, by what it asked and how it ended',
    );
    assert.deepEqual(
      await seriesOf(`captf_mirror_writes_total{${msJob}}`, ['captf_write', 'captf_result']),
      { 'create|ok': 2, 'merge|ok': 3, 'revoke|ok': 1 },
      "a mirror per namespace, each later consumer's owner reference merged in, then one mirror revoked",
    );
    assert.deepEqual(
      await seriesOf(`captf_consumer_status_writes_total{${msJob}}`, ['captf_outcome']),
      { mirrored: 5, 'not-allowed': 2 },
      "five consumers mirrored, then n2's two told they are no longer allowed",
    );
    assert.deepEqual(await seriesOf(`captf_reconciles_total{${msJob}}`, ['captf_result']), { done: 6 });
    assert.deepEqual(await seriesOf(`captf_reconcile_duration_seconds_count{${msJob}}`, ['captf_result']), { done: 5 });
    assert.deepEqual(await seriesOf(`captf_queue_depth{${msJob}}`, []), { '': 0 }, 'nothing left in the queue');
    const api = await seriesOf(`captf_api_request_duration_seconds_count{${msJob}}`, API_LABELS);
    assert.equal(api['create|secrets|201'], 2, JSON.stringify(api));
    assert.equal(api['delete|secrets|200'], 1, JSON.stringify(api));
    await assertNothingPlanted(msJob, planted.toLowerCase());

    const status = `captf-identity-status-${run}`;
    const is = await spawnFunction('identity-status', {
      KUBECONFIG: (await w.account('captf-identity-status')).kubeconfigPath,
      [IDENTITY_SELECTOR_ENV]: `captf.test/run=${run}`,
      ...otel(status),
    });
    await stopAfter(is, async () => {
      assert.equal((await deliver(`http://127.0.0.1:${is.port}/`, pingEvent())).status, 200);
    });
    const isJob = `job="${status}"`;
    assert.deepEqual(await seriesOf(`captf_identity_ready{${isJob}}`, ['captf_identity']), { [id]: 1 });
    // n2's consumers still name it (SPEC §9: namespaces holding a consumer or its mirror).
    assert.deepEqual(await seriesOf(`captf_identity_namespaces{${isJob}}`, ['captf_identity']), { [id]: 2 });
    assert.deepEqual(await seriesOf(`captf_identities{${isJob}}`, ['captf_reason']), {
      SecretFound: 1,
      SecretNotFound: 0,
      SecretUnreadable: 0,
      SecretIsMirror: 0,
    });
    await assertNothingPlanted(isJob, planted);
  });
  it('the shipped dashboard and alerts: no dead panel, every alert reads metrics that exist, and an unreadable source fires its alert until the identity is gone', async () => {
    const dead: string[] = [];
    for (const panel of dashboard.panels) {
      if (!panel.targets) continue;
      const answers = await Promise.all(
        panel.targets.map((t) => prometheus.query(t.expr.replaceAll('$__rate_interval', '5m'))),
      );
      if (!answers.some((samples) => samples.some((x) => Number.isFinite(x.value)))) dead.push(panel.title);
    }
    assert.deepEqual(dead, [], 'every panel shows a number after the runs above');
    const rules = ruleGroups.flatMap((g) => g.rules);
    const missing = rules.flatMap((r) => metricNames(r.expr).map((name) => [r.alert, name] as const));
    for (const [alert, name] of missing)
      assert.ok((await prometheus.query(`count(${name})`)).length > 0, `${alert} reads ${name}, which exists`);
    // The runs above dead-lettered events for three destinations, and did nothing else an alert names.
    const firing = async () =>
      (await prometheus.alerts()).map((a) => `${a.labels.alertname} ${a.labels.captf_function ?? ''}`).sort();
    const deadLetters = ['identity-status', 'mirror-sync', 'other'].map((f) => `CaptfDeadLetters ${f}`);
    await eventually('CaptfDeadLetters to fire for the dead letters, and nothing else', async () =>
      (await firing()).join() === deadLetters.join() ? true : undefined,
    );

    // identity-status may no longer get Secrets: the source it reads answers 403.
    const run = w.name('unreadable');
    const source = await operatorSource(w, fx.data({ token: 't' }));
    const id = await source.newIdentity(fx.allowList(source.namespace), fx.labels({ 'captf.test/run': run }));
    const noGet = await w.account('captf-identity-status', (rules) =>
      rules.map((r) => (r.resources?.includes('secrets') ? { ...r, verbs: r.verbs.filter((v) => v !== 'get') } : r)),
    );
    const is = await spawnFunction('identity-status', {
      KUBECONFIG: noGet.kubeconfigPath,
      [IDENTITY_SELECTOR_ENV]: `captf.test/run=${run}`,
      ...otel(`captf-identity-status-${run}`),
    });
    let refreshedWithoutIt = 0;
    await stopAfter(is, async () => {
      const ping = async () => assert.equal((await deliver(`http://127.0.0.1:${is.port}/`, pingEvent())).status, 200);
      await ping();
      await eventually('CaptfIdentitySourceUnreadable to fire', async () =>
        (await prometheus.alerts()).some(
          (a) => a.labels.alertname === 'CaptfIdentitySourceUnreadable' && a.state === 'firing',
        ),
      );
      const notReady = (await prometheus.alerts()).find((a) => a.labels.alertname === 'CaptfIdentityNotReady');
      assert.equal(notReady?.labels.captf_identity, id, 'the identity is named, pending its 10 minutes');
      // Deleted: the next refresh no longer sees it, and its series end (no gauge left at 0 to alert on).
      await w.delete(fx.identity(id));
      await ping();
      refreshedWithoutIt = Date.now() / 1000;
      await sleep(1_000);
    });
    const last = await prometheus.query(`timestamp(captf_identity_ready{captf_identity="${id}"})`);
    assert.ok(
      last.length === 1 && last[0]!.value <= refreshedWithoutIt,
      `no sample after the refresh that found it gone: ${JSON.stringify(last)} vs ${refreshedWithoutIt}`,
    );
  });
});

/** The metric names an expression reads (the product's, and the HTTP server's). */
const metricNames = (expr: string): string[] => [
  ...new Set([...expr.matchAll(/\b(captf_[a-z_]+|http_server_[a-z_]+)(?=[{[])/g)].map((m) => m[1]!)),
];
