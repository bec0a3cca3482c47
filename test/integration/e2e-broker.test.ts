/**
 * End to end through Knative's real event path: the ApiServerSource
 * adapter configured from the rendered `captf-objects`, Knative's Broker data plane
 * (scripts/eventing/dataplane.ts) with the rendered Broker, Triggers and PingSources unchanged (moved
 * into this file's namespace), and the real mirror-sync and identity-status. Consumers,
 * identities and namespaces reach exactly the functions their Triggers name; both
 * PingSources deliver (schedules shortened on the applied objects, never the manifests); a
 * consumer that waits for a person is answered as handled, so the Triggers' retries never
 * start; and a dispatcher SIGKILLed mid-stream loses nothing the resync does not repair.
 *
 * The adapter watches only this file's namespaces (the rendered source watches every
 * namespace; on a control plane shared with other test files that would send them here too).
 */
import assert from 'node:assert/strict';
import type { Server } from 'node:http';
import { after, before, describe, it } from 'node:test';
import { IDENTITY_RESOURCE, type AllowedNamespaces, type Consumer } from '../../functions/lib/api.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { start as startIdentityStatus } from '../../functions/identity-status/index.ts';
import { start as startMirrorSync } from '../../functions/mirror-sync/index.ts';
import { eventually, suffix } from '../helpers/cluster.ts';
import {
  startEventPath,
  startRecordingProxy,
  startSink,
  UNSIGNED_EVENTS,
  type EventPath,
  type Relayed,
} from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';
import { invariantViolations } from '../helpers/invariant.ts';
import { captureLogger } from '../helpers/logs.ts';

const w = fx.world('e2e-broker');
const a = w.clients;
const mirrorLog = captureLogger('mirror-sync');
const statusLog = captureLogger('identity-status');
const SCOPE = { key: 'captf-test/e2e-broker', value: suffix() };
const functions: FunctionHandle[] = [];
let sourceNamespace: string;
let deadLetters: Awaited<ReturnType<typeof startSink>>;
let path: EventPath;
let tenant: string;

/** What a function was sent: the CloudEvent id, type and subject of each delivery (and its answer). */
const sent = { 'mirror-sync': [] as Relayed[], 'identity-status': [] as Relayed[] };
const proxies: Server[] = [];

/** A recording pass-through in front of a function (events.ts), so the test sees what the Broker delivered. */
async function recordingProxy(fn: keyof typeof sent, port: number): Promise<string> {
  const proxy = await startRecordingProxy(port);
  sent[fn] = proxy.relayed;
  proxies.push(proxy.server);
  return proxy.url;
}

/** This file's identity `id` of the source Secret, allowing its tenant namespace (or `allowed`), scoped to its identity-status. */
const scoped = (id: string, allowed: AllowedNamespaces = { list: [tenant] }) =>
  fx.identity(
    id,
    fx.secretRef(sourceNamespace, 'creds'),
    fx.allowedNamespaces(allowed),
    fx.labels({ [SCOPE.key]: SCOPE.value }),
  );

before(async () => {
  sourceNamespace = await w.namespace();
  tenant = await w.namespace();
  await w.create(fx.sourceSecret('creds', fx.inNamespace(sourceNamespace)));
  deadLetters = await startSink();
  const ms = await startMirrorSync({
    port: 0,
    host: '127.0.0.1',
    kubeconfig: a.kc,
    logger: mirrorLog.logger,
    env: UNSIGNED_EVENTS,
  });
  // Its pings refresh only this file's identities: others' statuses are other files' to assert.
  const is = await startIdentityStatus({
    port: 0,
    host: '127.0.0.1',
    kubeconfig: a.kc,
    logger: statusLog.logger,
    env: { ...UNSIGNED_EVENTS, CAPTF_STATUS_IDENTITY_SELECTOR: `${SCOPE.key}=${SCOPE.value}` },
  });
  functions.push(ms, is);
  path = await startEventPath({
    namespace: sourceNamespace,
    sinks: {
      'captf-mirror-sync': await recordingProxy('mirror-sync', ms.port),
      'captf-identity-status': await recordingProxy('identity-status', is.port),
      'captf-dead-letters': deadLetters.url,
    },
    schedules: { 'captf-resync': '*/3 * * * * *', 'captf-identity-status': '*/3 * * * * *' },
    watch: [tenant],
    name: w.name('adapter'),
  });
});

after(async () => {
  await path?.stop();
  for (const f of functions) await f.close();
  deadLetters?.server.close();
  for (const p of proxies) p.close();
});

describe("through Knative's Broker, on the rendered eventing manifests", () => {
  it('consumer, identity and namespace events reach exactly the functions their Triggers name', async () => {
    const id = w.name('id');
    await w.create(scoped(id));
    // The adapter is at-most-once and may still be starting its watches: touch until seen.
    let touch = 0;
    const consumerAdds = () =>
      sent['mirror-sync'].filter(
        (e) => e.type === 'dev.knative.apiserver.ref.add' && e.subject.includes(`/${tenant}/`),
      );
    await eventually(
      "a consumer's add event delivered to mirror-sync by the Broker",
      async () => {
        await w.create(fx.consumer(`c-${++touch}`, fx.inNamespace(tenant), fx.identityRef(id)));
        return consumerAdds().length > 0;
      },
      90_000,
    );
    await eventually('its mirror', async () => (await w.read(fx.mirrorOf(id, fx.inNamespace(tenant)))) !== undefined);
    // The identity's own update event reaches identity-status (its Trigger) and mirror-sync (its own).
    await w.put(scoped(id, { list: [tenant], selector: { matchLabels: { never: 'x' } } }));
    const identityUpdates = (fn: keyof typeof sent) =>
      sent[fn].filter((e) => e.type === 'dev.knative.apiserver.ref.update' && e.subject.endsWith(`/${id}`));
    await eventually(
      'the identity update delivered to both functions',
      async () => identityUpdates('mirror-sync').length > 0 && identityUpdates('identity-status').length > 0,
    );
    await eventually('identity-status refreshed the identity on its event', async () =>
      statusLog.entries().some((e) => e.message === 'identity refreshed' && e.identity === id),
    );
    // A namespace's event reaches mirror-sync only.
    await a.core.patchNamespace({
      name: tenant,
      body: [{ op: 'add', path: '/metadata/labels/touched', value: 'yes' }],
    });
    await eventually('the namespace update delivered to mirror-sync', async () =>
      sent['mirror-sync'].some(
        (e) => e.type === 'dev.knative.apiserver.ref.update' && e.subject.endsWith(`/namespaces/${tenant}`),
      ),
    );
    // identity-status is sent identity events and its pings, never consumers or namespaces.
    const foreign = sent['identity-status'].filter(
      (e) => e.type !== 'dev.knative.sources.ping' && !e.subject.includes(`/${IDENTITY_RESOURCE.plural}/`),
    );
    assert.deepEqual(foreign, []);
    assert.deepEqual(
      statusLog.entries().filter((e) => e.message === 'bad event'),
      [],
    );
    assert.deepEqual(
      mirrorLog.entries().filter((e) => e.message === 'bad event'),
      [],
    );
    assert.deepEqual(
      deadLetters.received.map((e) => e.headers['ce-type']),
      [],
      'nothing was dead-lettered',
    );
  });

  it('retries only what a retry can fix: a consumer whose source is missing is reconciled a few times, and no delivery is retried', async (t) => {
    const id = w.name('id');
    await w.create(fx.identity(id, fx.secretRef(sourceNamespace, 'not-yet'), fx.allowList(tenant)));
    const name = `waiting-${suffix()}`;
    const waiting = (...mods: fx.Modifier<Consumer>[]) =>
      fx.consumer(name, fx.inNamespace(tenant), fx.identityRef(id), ...mods);
    await w.create(waiting());
    const reconciles = () =>
      mirrorLog.entries().filter((e) => e.message === 'reconcile' && e.object === `${tenant}/${name}`);
    let touch = 0;
    await eventually(
      'a first Broker-driven reconcile',
      async () => {
        if (reconciles().length > 0) return true;
        // The adapter is at-most-once: touch the object until one of its events arrives.
        await w.put(waiting(fx.labels({ touch: String(++touch) })));
        return false;
      },
      90_000,
    );
    const first = reconciles().length;
    // The Triggers retry a 5xx five times, exponentially from 1 s: 20 s covers all of them.
    await new Promise((r) => setTimeout(r, 20_000));
    const lines = reconciles();
    const ids = sent['mirror-sync'].filter((e) => e.subject.endsWith(`/${name}`)).map((e) => e.id);
    t.diagnostic(`reconciles: ${lines.length} (${first} before the wait); deliveries: ${ids.length}`);
    assert.equal(lines.at(-1)!.reason, 'SourceNotFound');
    assert.ok(
      lines.every((e) => e.retry === false),
      'never asks for a retry',
    );
    assert.equal(new Set(ids).size, ids.length, 'the Broker delivered no event twice (nothing was retried)');
    assert.ok(lines.length - first <= 8, `${lines.length - first} reconciles after the first`);
  });

  it('both PingSources deliver, each to its own function (schedules shortened on the applied objects)', async () => {
    const pings = (fn: keyof typeof sent) => sent[fn].filter((e) => e.type === 'dev.knative.sources.ping');
    await eventually(
      'pings to both functions',
      async () => pings('mirror-sync').length > 0 && pings('identity-status').length > 0,
    );
    await eventually(
      'a resync and a status refresh done',
      async () =>
        mirrorLog.entries().some((e) => e.message === 'resync') &&
        statusLog.entries().some((e) => e.message === 'refresh done' && e.trigger === 'ping'),
    );
  });

  it('a dispatcher SIGKILLed mid-stream loses nothing the resync does not repair', async () => {
    const id = w.name('id');
    await w.create(scoped(id));
    // A stream of creations; the dispatcher is killed after the 10th and restarted after the 25th.
    const names = Array.from({ length: 40 }, (_, i) => `burst-${i}`);
    for (const [i, n] of names.entries()) {
      if (i === 10) await path.dp.kill('dispatcher');
      if (i === 25) await path.dp.restart('dispatcher');
      await w.create(fx.consumer(n, fx.inNamespace(tenant), fx.identityRef(id)));
      await new Promise((r) => setTimeout(r, 30));
    }
    // Events sent while the channel was down are lost (the adapter is at-most-once); the
    // PingSource's resync, every 3 s here, repairs them.
    await eventually(
      'every burst consumer on the mirror',
      async () => {
        const m = await w.read(fx.mirrorOf(id, fx.inNamespace(tenant)));
        const owners = new Set((m?.metadata?.ownerReferences ?? []).map((o) => o.name));
        return names.every((n) => owners.has(n));
      },
      90_000,
    );
    // The conditions are written right after the mirror, in the same reconcile.
    let violations: string[] = [];
    await eventually(
      'the invariant',
      async () => (violations = await invariantViolations(a, [tenant])).length === 0,
      15_000,
    ).catch(() => assert.deepEqual(violations, []));
  });
});
