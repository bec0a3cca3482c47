/**
 * SPEC §13, traces, through the real path: mirror-sync and admission run as their containers do,
 * pushing spans over OTLP to a real Jaeger v2. Each request carries a W3C `traceparent` as the
 * Broker's dispatcher (or an API server) would send it; Jaeger's query API then shows one trace
 * per request that continues it: the answer, the event or review, the key's reconcile, and each
 * API request under them, with the mirror's create and the consumer's status write. The log
 * lines written under it carry the same trace id, and no span holds a planted value. Last, a
 * consumer's event goes the whole real way (ApiServerSource adapter → Knative's Broker data plane,
 * its own tracing on through `config-observability` → mirror-sync), and its trace holds Knative's
 * spans above mirror-sync's.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { HTTP, type CloudEvent } from 'cloudevents';
import { startJaeger, type Jaeger, type StoredSpan } from '../../scripts/observability/jaeger.ts';
import { admissionReview, identityRequest } from '../helpers/admission.ts';
import { eventually, suffix } from '../helpers/cluster.ts';
import { startEventPath, startFunctionStandIn } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';
import { sentinel } from '../helpers/logs.ts';
import { consumerEvent, createConsumers, operatorSource } from '../helpers/mirror-sync.ts';
import { manager, prepareTarget } from '../helpers/prepare.ts';
import { spawnFunction, type FunctionProcess } from '../helpers/process.ts';

const w = fx.world('tracing');
const work = mkdtempSync(join(tmpdir(), 'captf-tracing-'));
let jaeger: Jaeger;

before(async () => {
  jaeger = await startJaeger({ dir: join(work, 'jaeger') });
});

after(async () => {
  await jaeger?.stop();
  rmSync(work, { recursive: true, force: true });
});

/** A caller's span: a fresh trace id and span id, and the `traceparent` header naming them (sampled). */
function callerSpan(sampled = true): { traceId: string; spanId: string; traceparent: string } {
  const traceId = randomBytes(16).toString('hex');
  const spanId = randomBytes(8).toString('hex');
  return { traceId, spanId, traceparent: `00-${traceId}-${spanId}-${sampled ? '01' : '00'}` };
}

/** Spawns `fn` exporting traces only, to the test's Jaeger, as `service`. */
const spawnTraced = (fn: string, service: string, env: NodeJS.ProcessEnv): Promise<FunctionProcess> =>
  spawnFunction(fn, {
    ...env,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: jaeger.otlpTracesEndpoint,
    OTEL_SERVICE_NAME: service,
  });

/** Stops `fn` with SIGTERM (its last spans are exported in the drain) and asserts it exited 0. */
async function stop(fn: FunctionProcess): Promise<void> {
  await fn.stop();
  assert.equal(await fn.exited, 0, fn.tail().join('\n'));
}

/** The trace's spans once Jaeger has at least `min` of them. */
async function traceOf(traceId: string, min: number): Promise<StoredSpan[]> {
  let spans: StoredSpan[] = [];
  await eventually(`trace ${traceId} in Jaeger`, async () => (spans = await jaeger.trace(traceId)).length >= min);
  return spans;
}

/** The names from `span` up to the root, e.g. `['create secrets', 'reconcile key', 'event consumer', 'POST /']`. */
function ancestry(spans: readonly StoredSpan[], span: StoredSpan): string[] {
  const byId = new Map(spans.map((s) => [s.spanId, s]));
  const names: string[] = [];
  for (let s: StoredSpan | undefined = span; s; s = byId.get(s.parentSpanId)) names.push(s.name);
  return names;
}

/** The one span named `name`. */
function only(spans: readonly StoredSpan[], name: string): StoredSpan {
  const found = spans.filter((s) => s.name === name);
  assert.equal(found.length, 1, `one span ${name} in ${spans.map((s) => s.name).join(', ')}`);
  return found[0]!;
}

describe('traces pushed over OTLP to a real Jaeger (SPEC §13)', () => {
  it("mirror-sync: a consumer's event and a Job's prepare each continue the caller's trace down to the API requests, and its log lines carry the trace id", async () => {
    const planted = sentinel();
    const source = await operatorSource(w, fx.data({ token: planted }));
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    const [consumer, second, third] = await createConsumers(w, n, id, 'c', 3);
    const service = `captf-mirror-sync-${w.name('t')}`;
    const fn = await spawnTraced('mirror-sync', service, {
      KUBECONFIG: (await w.account('captf-mirror-sync')).kubeconfigPath,
    });
    const event = callerSpan();
    const prepare = callerSpan();
    const unsampled = callerSpan(false);
    const caller = await manager(w);
    try {
      assert.ok(fn.output().includes('"telemetry pushed over OTLP"'), fn.output());
      const url = `http://127.0.0.1:${fn.port}/`;
      for (const [c, span] of [
        [consumer!, event],
        [third!, unsampled],
      ] as const) {
        const message = HTTP.binary(consumerEvent(c) as CloudEvent<unknown>);
        const answer = await fetch(url, {
          method: 'POST',
          headers: { ...(message.headers as Record<string, string>), traceparent: span.traceparent },
          body: message.body as string,
        });
        assert.equal(answer.status, 200);
      }
      const prepared = await fetch(`${url}prepare`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          authorization: caller.authorization,
          traceparent: prepare.traceparent,
        },
        body: JSON.stringify(prepareTarget(second!)),
      });
      assert.equal(prepared.status, 200, await prepared.text());
    } finally {
      await stop(fn);
    }

    const spans = await traceOf(event.traceId, 5);
    const root = only(spans, 'POST /');
    assert.equal(root.parentSpanId, event.spanId, "the answer's span continues the caller's");
    assert.equal(root.kind, 2);
    assert.equal(root.service, service);
    assert.equal(root.attributes['http.response.status_code'], 200);
    const reconcile = only(spans, 'reconcile key');
    assert.deepEqual(ancestry(spans, reconcile), ['reconcile key', 'event consumer', 'POST /']);
    assert.equal(reconcile.attributes['k8s.namespace.name'], n);
    assert.equal(reconcile.attributes['captf.identity'], id);
    assert.equal(reconcile.attributes['captf.result'], 'done');
    const create = only(spans, 'create secrets');
    assert.deepEqual(ancestry(spans, create).slice(1), ['reconcile key', 'event consumer', 'POST /']);
    assert.equal(create.kind, 3);
    assert.equal(create.attributes['http.response.status_code'], 201);
    assert.ok(
      spans.some((s) => /terraformclusters\/status$/.test(s.name) && ancestry(spans, s).includes('reconcile key')),
      `the consumer's status write is in the trace: ${spans.map((s) => s.name).join(', ')}`,
    );

    const prepareSpans = await traceOf(prepare.traceId, 3);
    assert.equal(only(prepareSpans, 'POST /prepare').parentSpanId, prepare.spanId);
    for (const name of ['create tokenreviews', 'create subjectaccessreviews'])
      assert.deepEqual(ancestry(prepareSpans, only(prepareSpans, name)), [name, 'POST /prepare']);

    const logged = fn.entries().filter((e) => e.trace_id === event.traceId);
    assert.ok(
      logged.some((e) => e.message === 'reconcile'),
      `a reconcile line carries the event's trace id: ${JSON.stringify(fn.entries().slice(-5))}`,
    );
    // A caller that did not sample: nothing of its trace is exported, its log lines still name it.
    assert.deepEqual(await jaeger.trace(unsampled.traceId), [], 'an unsampled trace exports no span');
    assert.ok(fn.entries().some((e) => e.message === 'reconcile' && e.trace_id === unsampled.traceId));
    const text = JSON.stringify([...spans, ...prepareSpans]);
    assert.ok(!text.includes(planted), 'no span holds the Secret data');
    assert.ok(!text.includes(caller.authorization.slice(7, 40)), 'no span holds the token');
  });

  it("admission: a review continues the API server's trace, with its SubjectAccessReview", async () => {
    const planted = sentinel();
    const service = `captf-admission-${w.name('t')}`;
    const fn = await spawnTraced('admission', service, {
      KUBECONFIG: (await w.account('captf-admission')).kubeconfigPath,
      CAPTF_ADMISSION_PLAIN_HTTP: 'true',
    });
    const caller = callerSpan();
    try {
      const object = fx.identity(w.name('id'), fx.secretRef('captf-system', 'creds'), fx.allowList('x'));
      const review = admissionReview(
        identityRequest('CREATE', object, undefined, { name: object.metadata!.name!, userInfo: { username: planted } }),
      );
      const r = await fetch(`http://127.0.0.1:${fn.port}/validate`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', traceparent: caller.traceparent },
        body: JSON.stringify(review),
      });
      assert.equal(r.status, 200);
    } finally {
      await stop(fn);
    }
    const spans = await traceOf(caller.traceId, 3);
    assert.equal(only(spans, 'POST /validate').parentSpanId, caller.spanId);
    const reviewSpan = only(spans, 'review CREATE');
    assert.equal(reviewSpan.attributes['captf.decision'], 'denied');
    assert.deepEqual(ancestry(spans, only(spans, 'create subjectaccessreviews')), [
      'create subjectaccessreviews',
      'review CREATE',
      'POST /validate',
    ]);
    assert.ok(!JSON.stringify(spans).includes(planted), 'no span names the user');
  });
  it("a consumer's event through Knative's Broker: one trace from Knative's own spans down to mirror-sync's mirror write", async () => {
    const tenant = await w.namespace();
    const source = await operatorSource(w, fx.data({ token: 't' }));
    const id = await source.newIdentity(fx.allowList(tenant));
    const service = `captf-mirror-sync-${w.name('b')}`;
    const fn = await spawnTraced('mirror-sync', service, {
      KUBECONFIG: (await w.account('captf-mirror-sync')).kubeconfigPath,
    });
    const others = await startFunctionStandIn();
    const systemNamespace = `knative-eventing-${suffix()}`;
    w.onCleanup(() => w.clients.core.deleteNamespace({ name: systemNamespace }).catch(() => undefined));
    const path = await startEventPath({
      namespace: await w.namespace(),
      sinks: {
        'captf-mirror-sync': `http://127.0.0.1:${fn.port}/`,
        'captf-identity-status': others.url,
        'captf-dead-letters': others.url,
      },
      schedules: { 'captf-resync': '0 0 1 1 *', 'captf-identity-status': '0 0 1 1 *' },
      watch: [tenant],
      name: w.name('adapter'),
      // Knative's own tracing, on for this data plane only (its own system namespace).
      observability: {
        'tracing-protocol': 'http/protobuf',
        'tracing-endpoint': jaeger.otlpTracesEndpoint,
        'tracing-sampling-rate': '1',
      },
      systemNamespace,
    });
    const consumers: string[] = [];
    try {
      // The adapter is at-most-once and may still be starting its watches: a consumer more until one is seen.
      await eventually(
        'a consumer mirrored through the Broker',
        async () => {
          const [c] = await createConsumers(w, tenant, id, `c${consumers.length}`, 1);
          consumers.push(`${tenant}/${c!.metadata.name}`);
          await new Promise((r) => setTimeout(r, 1000));
          return fn.entries().some((e) => e.message === 'reconcile' && consumers.includes(String(e.object)));
        },
        90_000,
      );
    } finally {
      // Both flush their spans as they stop.
      await path.stop();
      await stop(fn);
      others.server.close();
    }
    const line = fn
      .entries()
      .find((e) => e.message === 'reconcile' && consumers.includes(String(e.object)) && e.trace_id);
    assert.ok(line, `mirror-sync's reconcile line carries a trace id: ${JSON.stringify(fn.entries().slice(-5))}`);
    // Knative's processes export on their own schedule: wait for mirror-sync's answer under one of their spans.
    let spans: StoredSpan[] = [];
    const answerUnderKnative = () =>
      spans.find(
        (s) =>
          s.name === 'POST /' &&
          s.service === service &&
          spans.some((p) => p.spanId === s.parentSpanId && !p.service.startsWith('captf-')),
      );
    await eventually("mirror-sync's answer under the Broker's delivery span", async () => {
      spans = await jaeger.trace(String(line.trace_id));
      return answerUnderKnative() !== undefined;
    }).catch((err: unknown) => {
      throw new Error(`${(err as Error).message}: ${shown(spans)}`);
    });
    const create = only(spans, 'create secrets');
    assert.ok(ancestry(spans, create).includes('POST /'), shown(spans));
  });
});

/** A trace as `service: name ← parent name` lines, for a failing assertion. */
function shown(spans: readonly StoredSpan[]): string {
  const byId = new Map(spans.map((s) => [s.spanId, s]));
  return spans.map((s) => `${s.service}: ${s.name} ← ${byId.get(s.parentSpanId)?.name ?? '(root)'}`).join('; ');
}
