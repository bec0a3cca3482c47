/**
 * What the local mode (scripts/local/) still does itself around Knative's real Eventing data
 * plane, checked against that data plane (scripts/eventing/dataplane.ts) on the test control plane, and
 * the examples it applies:
 * - `system.ping()` POSTs the same CloudEvent a PingSource tick sends (compared with a real
 *   mtping tick, header for header and byte for byte, both as the Broker delivered them);
 * - dead-letters (the real function, with the sender check it ships) takes Knative's real dead
 *   letters, signed by the filter as the Trigger that gave up, and logs the event, the Trigger,
 *   the function and its answer, Knative's error code — after the retries for a 5xx, at once
 *   for a 400;
 * - every document in examples/ is accepted by the API server's CRD schemas.
 *
 * The data plane runs the rendered Broker, Triggers and PingSources moved into this file's
 * namespace, with two changes to the test's copy (never the manifests): the resync
 * PingSource fires every second, and Trigger `captf-mirror-sync-ref-add` retries once after
 * 0.1 s (the manifests' 5 retries from 1 s would hold the test for 31 s).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import type { IncomingHttpHeaders } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { RbacAuthorizationV1Api, type KubernetesObject } from '@kubernetes/client-node';
import { IDENTITY_RESOURCE, TERRAFORM_CLUSTER } from '../../functions/lib/api.ts';
import { PING_EVENT_TYPE } from '../../functions/lib/cloudevents.ts';
import type { Delivery, EventingDataPlane } from '../../scripts/eventing/dataplane.ts';
import { render } from '../../scripts/tools/kustomize.ts';
import { start as startDeadLetters } from '../../functions/dead-letters/index.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { loadKubeConfig } from '../../functions/lib/kube.ts';
import {
  EVENT_AUDIENCE_ENV,
  EVENT_AUTH_ENV,
  EVENT_SENDERS_ENV,
  oidcServiceAccountName,
} from '../../functions/lib/senders.ts';
import { pingMessage } from '../../scripts/local/events.ts';
import { EXAMPLES_DIR, applyExamples } from '../../scripts/local/examples.ts';
import { builtKubectlPath } from '../../scripts/tools/build.ts';
import { MANIFESTS as EVENTING_MANIFESTS } from '../../scripts/system/system.ts';
import { knativeContainer } from '../../scripts/system/functions.ts';
import { controlPlaneDir, eventually, suffix } from '../helpers/cluster.ts';
import {
  apiServerEvent,
  postEvents,
  startBroker,
  startFunctionStandIn,
  type ReceivedEvent,
} from '../helpers/events.ts';
import { captureLogger } from '../helpers/logs.ts';
import * as fx from '../helpers/fixtures.ts';

const w = fx.world('start-events');
const a = w.clients;

let namespace: string;
let dp: EventingDataPlane;
let dls: FunctionHandle;
const dlsLog = captureLogger('dead-letters');
/** What dead-letters logged of each dead letter. */
const letters = () => dlsLog.entries().filter((e) => e.message === 'dead letter');
const fns = {} as Record<'mirror-sync' | 'identity-status', Awaited<ReturnType<typeof startFunctionStandIn>>>;

/** The test's copy of the rendered objects (see the file comment). */
function testObjects(rendered: KubernetesObject[]): KubernetesObject[] {
  const objects = structuredClone(rendered) as (KubernetesObject & { spec: { delivery?: Delivery } })[];
  const trigger = objects.find((o) => o.kind === 'Trigger' && o.metadata?.name === 'captf-mirror-sync-ref-add')!;
  trigger.spec.delivery = { ...trigger.spec.delivery, retry: 1, backoffPolicy: 'linear', backoffDelay: 'PT0.1S' };
  return objects;
}

before(async () => {
  // Anything but `fail-` and `bad-` is answered 200 with no body (what the functions answer
  // Knative, which sends `Prefer: reply`).
  fns['mirror-sync'] = await startFunctionStandIn(200);
  fns['identity-status'] = await startFunctionStandIn(200);
  namespace = await w.namespace();
  // As shipped, but its senders are the Triggers in this file's namespace.
  const rendered = await render(EVENTING_MANIFESTS);
  const shipped = knativeContainer(rendered, 'dead-letters')!.env!;
  const audience = shipped.find((e) => e.name === EVENT_AUDIENCE_ENV)!.value!;
  dls = await startDeadLetters({
    port: 0,
    host: '127.0.0.1',
    kubeconfig: loadKubeConfig(`${controlPlaneDir()}/admin.kubeconfig`),
    logger: dlsLog.logger,
    env: {
      [EVENT_AUTH_ENV]: 'oidc',
      [EVENT_AUDIENCE_ENV]: audience,
      [EVENT_SENDERS_ENV]: `system:serviceaccount:${namespace}:${oidcServiceAccountName('captf-mirror-sync-ref-add')}`,
    },
  });
  dp = await startBroker({
    objects: testObjects(rendered),
    namespace,
    sinks: {
      'captf-mirror-sync': fns['mirror-sync'].url,
      'captf-identity-status': fns['identity-status'].url,
      'captf-dead-letters': `http://127.0.0.1:${dls.port}/`,
    },
    schedules: { 'captf-resync': '* * * * * *' },
  });
});

after(async () => {
  await dp?.stop();
  await dls?.close();
  for (const f of Object.values(fns)) f.server.close();
});

describe("what npm start sends and receives around Knative's Broker", () => {
  it("system.ping() sends what mtping sends for the manifests' PingSource, header for header", async (t) => {
    const isPing = (h: ReceivedEvent) => h.headers['ce-type'] === PING_EVENT_TYPE;
    const tick = await eventually('a tick of PingSource captf-resync at mirror-sync', async () =>
      fns['mirror-sync'].received.find(isPing),
    );
    const msg = pingMessage('captf-resync', namespace);
    const res = await fetch(dp.brokerUrl, { method: 'POST', headers: msg.headers, body: msg.body });
    assert.equal(res.status, 202);
    // The manifests' Broker answers at once and delivers in the background.
    const ours = await eventually('the Trigger captf-mirror-sync-resync to route our ping to mirror-sync', async () =>
      fns['mirror-sync'].received.find((h) => h.headers['ce-id'] === msg.headers['ce-id']),
    );
    const attrs = (h: IncomingHttpHeaders) =>
      Object.fromEntries(
        Object.entries(h)
          .filter(([k]) => k.startsWith('ce-') || ['content-type', 'kn-namespace', 'prefer'].includes(k))
          .filter(([k]) => !['ce-id', 'ce-time', 'ce-knativearrivaltime'].includes(k))
          .sort(([x], [y]) => x.localeCompare(y)),
      );
    t.diagnostic(`mtping's tick as delivered: ${JSON.stringify(attrs(tick.headers))}`);
    assert.deepEqual(attrs(ours.headers), attrs(tick.headers));
    assert.equal(ours.body, tick.body, 'the same data, byte for byte');
    for (const h of [tick, ours])
      assert.ok(!Number.isNaN(Date.parse(String(h.headers['ce-time']))), 'both carry a time');
    assert.equal(
      fns['identity-status'].received.filter((h) => h.headers['ce-id'] === msg.headers['ce-id']).length,
      0,
      'and no other function got it',
    );
  });

  it("the manifests' Broker answers the sender before the function has answered (the async handler)", async () => {
    const event = apiServerEvent(fx.consumer('held', fx.inNamespace('team-a')), 'ref', 'add', TERRAFORM_CLUSTER.plural);
    // A serial channel would hold this POST until the function answers: it would abort here.
    const sent = await postEvents(
      dp.brokerUrl,
      event.cloneWith({ id: 'hold-1' }),
      'binary',
      AbortSignal.timeout(30_000),
    );
    assert.equal(sent.status, 202, 'answered while the delivery is still open');
    await eventually('the delivery to reach mirror-sync', async () =>
      fns['mirror-sync'].received.some((h) => h.id === 'hold-1'),
    );
    assert.equal(fns['mirror-sync'].release(), 1, 'and it was still held when the sender got its answer');
  });

  it('dead-letters takes what Knative gives up on, signed as the Trigger: after the retries for a 5xx, at once for a 400', async () => {
    const tc = (id: string) =>
      apiServerEvent(fx.consumer('prod', fx.inNamespace('team-a')), 'ref', 'add', TERRAFORM_CLUSTER.plural).cloneWith({
        id,
      });
    for (const id of ['fail-1', 'bad-1']) assert.equal((await postEvents(dp.brokerUrl, tc(id))).status, 202, id);
    // Delivered in the background (the manifests' async handler): the 400's letter comes first.
    await eventually('both dead letters', async () => letters().length >= 2);
    const attempts = (id: string) => fns['mirror-sync'].received.filter((h) => h.headers['ce-id'] === id).length;
    assert.equal(attempts('fail-1'), 2, 'the first try and the one retry of the test copy');
    assert.equal(attempts('bad-1'), 1, 'a 400 is not retried');
    assert.equal(letters().length, 2);
    assert.deepEqual(
      dlsLog.entries().filter((e) => e.message === 'event refused'),
      [],
      'each dead letter came signed by one of its senders',
    );
    const shown = ['id', 'type', 'about', 'code', 'trigger', 'for', 'destination', 'error'] as const;
    const byCode = (code: string) => {
      const l = letters().find((e) => e.code === code)!;
      return Object.fromEntries(shown.filter((k) => k in l).map((k) => [k, l[k]]));
    };
    for (const [letter, id, code, error] of [
      [byCode('500'), 'fail-1', '500', 'the API server is unavailable'],
      [byCode('400'), 'bad-1', '400', 'not an event this function takes'],
    ] as const) {
      assert.deepEqual(letter, {
        id,
        type: 'dev.knative.apiserver.ref.add',
        about: 'TerraformCluster team-a/prod',
        code,
        trigger: 'captf-mirror-sync-ref-add',
        for: 'mirror-sync',
        destination: fns['mirror-sync'].url,
        error,
      });
    }
  });
});

/**
 * A copy of examples/ with a fresh suffix on every namespace, identity and cluster-scoped
 * RBAC name, so the shared test control plane keeps other files' objects apart; its objects
 * are deleted after the file.
 */
function renamedExamples(): { dir: string; sfx: string } {
  const sfx = suffix();
  const dir = mkdtempSync(join(tmpdir(), 'captf-examples-'));
  const renamed =
    /\b(captf-system|team-a|team-b|team-c|aws-prod|gcp-dev|captf-example-terraform-objects|captf-example-identity-author|tenants-identity-author)\b/g;
  for (const f of readdirSync(EXAMPLES_DIR).filter((x) => x.endsWith('.yaml'))) {
    writeFileSync(join(dir, f), readFileSync(join(EXAMPLES_DIR, f), 'utf8').replace(renamed, `$1-${sfx}`));
  }
  w.onCleanup(async () => {
    for (const id of ['aws-prod', 'gcp-dev']) await w.delete(fx.identity(`${id}-${sfx}`));
    for (const name of ['captf-system', 'team-a', 'team-b', 'team-c']) await w.delete(fx.namespace(`${name}-${sfx}`));
    const rbac = a.kc.makeApiClient(RbacAuthorizationV1Api);
    for (const name of ['captf-example-terraform-objects', 'captf-example-identity-author'])
      await rbac.deleteClusterRole({ name: `${name}-${sfx}` }).catch(() => undefined);
    await rbac.deleteClusterRoleBinding({ name: `tenants-identity-author-${sfx}` }).catch(() => undefined);
    rmSync(dir, { recursive: true, force: true });
  });
  return { dir, sfx };
}

describe('examples/', () => {
  it('every document is accepted by the API server (server-side apply against the CRDs), in file order', async () => {
    const { dir, sfx } = renamedExamples();
    const applied = await applyExamples(a.kc, dir);
    assert.equal(applied[0], `Namespace captf-system-${sfx}`, 'namespaces come first');
    assert.deepEqual(
      applied.map((x) => x.split(' ')[0]),
      [
        'Namespace',
        'Namespace',
        'Namespace',
        'Namespace',
        'Secret',
        'Secret',
        'TerraformClusterIdentity',
        'TerraformClusterIdentity',
        'TerraformCluster',
        'TerraformMachine',
        'TerraformCluster',
        'TerraformCluster',
        'TerraformMachine',
        'ClusterRole',
        'RoleBinding',
        'ClusterRole',
        'ClusterRoleBinding',
      ],
    );
    const byList = (await w.read(fx.identity(`aws-prod-${sfx}`)))!;
    assert.deepEqual(byList.spec.allowedNamespaces, { list: [`team-a-${sfx}`, `team-b-${sfx}`] });
    const bySelector = (await w.read(fx.identity(`gcp-dev-${sfx}`)))!;
    assert.deepEqual(bySelector.spec.allowedNamespaces, {
      selector: { matchLabels: { 'captf.example/credentials': 'gcp' } },
    });
    const labelled = (await w.read(fx.namespace(`team-c-${sfx}`)))!;
    assert.equal(labelled.metadata?.labels?.['captf.example/credentials'], 'gcp');
    // Applying again changes nothing and fails nowhere (kubectl apply is idempotent too).
    assert.equal((await applyExamples(a.kc, dir)).length, applied.length);
  });

  it('a real kubectl applies them client-side (`kubectl apply -f examples/`) and shows the printer columns', async (t) => {
    const kubectl = builtKubectlPath();
    if (!kubectl) {
      t.skip('kubectl is not built (npm run tools -- kubectl)');
      return;
    }
    const { dir, sfx } = renamedExamples();
    const run = (...args: string[]) =>
      execFileSync(kubectl, ['--kubeconfig', `${controlPlaneDir()}/admin.kubeconfig`, ...args], { encoding: 'utf8' });
    const first = run('apply', '-f', dir).trim().split('\n');
    assert.equal(first.length, 17);
    assert.ok(
      first.every((l) => l.endsWith(' created')),
      first.join('\n'),
    );
    const again = run('apply', '-f', dir).trim().split('\n');
    // Secrets written with stringData always differ from what is stored (the server keeps
    // only data), so kubectl re-sends them; everything else is unchanged.
    assert.ok(
      again.every((l) => l.endsWith(' unchanged') || (l.startsWith('secret/') && l.endsWith(' configured'))),
      again.join('\n'),
    );
    const ids = run('get', IDENTITY_RESOURCE.plural, `aws-prod-${sfx}`, `gcp-dev-${sfx}`);
    t.diagnostic(ids);
    assert.match(ids.split('\n')[0]!, /^NAME\s+READY\s+SECRET-NAMESPACE\s+SECRET\s+NAMESPACES\s+AGE$/);
    assert.match(ids, new RegExp(`aws-prod-${sfx}\\s+captf-system-${sfx}\\s+aws-prod-${sfx}-credentials`));
    const tcs = run('get', TERRAFORM_CLUSTER.plural, '-n', `team-a-${sfx}`);
    assert.match(tcs.split('\n')[0]!, /^NAME\s+IDENTITY\s+MIRRORED\s+REASON\s+AGE$/);
    // The selectable field works from kubectl too.
    const bySelector = run(
      'get',
      TERRAFORM_CLUSTER.plural,
      '-A',
      '--field-selector',
      `spec.identityRef.name=aws-prod-${sfx}`,
      '-o',
      'name',
    );
    const named = (name: string) => `${TERRAFORM_CLUSTER.kind.toLowerCase()}.${TERRAFORM_CLUSTER.group}/${name}`;
    assert.deepEqual(bySelector.trim().split('\n').sort(), [named('prod'), named('staging')]);
  });
});
