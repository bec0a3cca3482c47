/**
 * The local stand-ins for Knative (scripts/local/events.ts) against the test control plane:
 * the local event source sends the same CloudEvents as Knative's real ApiServerSource
 * adapter (compared header by header and byte by byte, when the adapter is built); delivery
 * retries like a Trigger and keeps a bounded queue; and every document in examples/ is
 * accepted by the API server's CRD schemas.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import type { IncomingHttpHeaders, Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { RbacAuthorizationV1Api } from '@kubernetes/client-node';
import {
  API_VERSION,
  GROUP,
  IDENTITY_KIND,
  IDENTITY_PLURAL,
  VERSION,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import { consumerKindsFromEnv } from '../../functions/lib/consumers.ts';
import { startApiServerSourceAdapter, type RunningAdapter } from '../../scripts/knative.ts';
import {
  Delivery,
  refEvent,
  startLocalEventSource,
  waitForWatchCaches,
  watchedResources,
  type DeliveryReport,
  type LocalEventSource,
} from '../../scripts/local/events.ts';
import { EXAMPLES_DIR, applyExamples } from '../../scripts/local/examples.ts';
import { builtKubectlPath } from '../../scripts/local/kubectl.ts';
import { builtAdapterPath } from '../../scripts/local/system.ts';
import { admin, controlPlaneDir, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { startSink } from '../helpers/events.ts';

const a = admin();
const ns = namespaces('start-events');
const kinds = consumerKindsFromEnv({});

const servers: Server[] = [];
const stops: (() => Promise<void> | void)[] = [];
after(async () => {
  for (const s of stops.reverse()) await s();
  for (const s of servers) s.close();
});

describe('the local event source', () => {
  sameEventsAsTheAdapterTest();

  it('reports adds, updates and deletes after it started, but not what existed before', async () => {
    const sink = await startSink();
    servers.push(sink.server);
    const n = await ns.create();
    await a.custom.createNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: n,
      plural: 'terraformclusters',
      body: { apiVersion: API_VERSION, kind: 'TerraformCluster', metadata: { name: 'before' }, spec: {} },
    });
    const d = new Delivery(sink.url);
    stops.push(() => d.stop());
    const resources = watchedResources(a.kc, kinds, d, d).filter((r) => r.kind === 'TerraformCluster');
    const src = await startLocalEventSource(a.kc, a.kc.getCurrentCluster()!.server, resources);
    stops.push(() => src.stop());
    await a.custom.createNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: n,
      plural: 'terraformclusters',
      body: { apiVersion: API_VERSION, kind: 'TerraformCluster', metadata: { name: 'after' }, spec: {} },
    });
    await a.custom.patchNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: n,
      plural: 'terraformclusters',
      name: 'after',
      body: [{ op: 'add', path: '/metadata/labels', value: { x: '1' } }],
    });
    await a.custom.deleteNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: n,
      plural: 'terraformclusters',
      name: 'after',
    });
    const seen = await eventually('add, update and delete of "after"', async () => {
      const types = sink.received
        .filter((r) => r.headers['ce-namespace'] === n)
        .map((r) => `${r.headers['ce-type']} ${r.headers['ce-name']}`);
      return types.includes('dev.knative.apiserver.ref.delete after') ? types : undefined;
    });
    assert.deepEqual(
      seen,
      ['add', 'update', 'delete'].map((v) => `dev.knative.apiserver.ref.${v} after`),
    );
  });
});

/** The local source against the real adapter, event by event. */
function sameEventsAsTheAdapterTest(): void {
  it("sends the same CloudEvents as Knative's ApiServerSource adapter (Reference mode)", async (t) => {
    if (!builtAdapterPath()) {
      t.skip('the ApiServerSource adapter is not built (npm run knative:build)');
      return;
    }
    const adapterSink = await startSink();
    const localSink = await startSink();
    servers.push(adapterSink.server, localSink.server);
    const n = await ns.create();
    const server = a.kc.getCurrentCluster()!.server;

    const toLocal = new Delivery(localSink.url, { backoffMs: 50 });
    stops.push(() => toLocal.stop());
    const resources = watchedResources(a.kc, kinds, toLocal, toLocal).map((r) => ({ ...r, sinks: [toLocal] }));
    await waitForWatchCaches(
      a.kc,
      resources.map((r) => r.path),
    );
    const local: LocalEventSource = await startLocalEventSource(a.kc, server, resources);
    stops.push(() => local.stop());
    const gvr = (Group: string, Version: string, Resource: string) => ({ gvr: { Group, Version, Resource } });
    const adapter: RunningAdapter = await startApiServerSourceAdapter({
      kubeconfigPath: `${controlPlaneDir()}/admin.kubeconfig`,
      sink: adapterSink.url,
      name: `cmp-${suffix()}`,
      source: {
        namespaces: [],
        allNamespaces: true,
        mode: 'Reference',
        resources: [
          gvr(GROUP, VERSION, 'terraformclusters'),
          gvr(GROUP, VERSION, IDENTITY_PLURAL),
          gvr('', 'v1', 'namespaces'),
        ],
      },
    });
    stops.push(() => adapter.stop());

    // A consumer, an identity and a namespace, changed until the adapter (at-most-once, and
    // possibly still listing) reported each, then deleted.
    const tc = `tc-${suffix()}`;
    const id = `id-${suffix()}`;
    ns.onCleanup(() =>
      a.custom.deleteClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, name: id }),
    );
    await a.custom.createNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: n,
      plural: 'terraformclusters',
      body: {
        apiVersion: API_VERSION,
        kind: 'TerraformCluster',
        metadata: { name: tc, labels: { touch: '0' } },
        spec: { identityRef: { name: id } },
      },
    });
    await a.custom.createClusterCustomObject({
      group: GROUP,
      version: VERSION,
      plural: IDENTITY_PLURAL,
      body: {
        apiVersion: API_VERSION,
        kind: IDENTITY_KIND,
        metadata: { name: id, labels: { touch: '0' } },
        spec: { secretRef: { name: 's', namespace: n } },
      },
    });
    const n2 = await ns.create();
    let touches = 0;
    const touch = async () => {
      const value = String(++touches);
      const patch = [{ op: 'replace', path: '/metadata/labels/touch', value }];
      await a.custom.patchNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace: n,
        plural: 'terraformclusters',
        name: tc,
        body: patch,
      });
      await a.custom.patchClusterCustomObject({
        group: GROUP,
        version: VERSION,
        plural: IDENTITY_PLURAL,
        name: id,
        body: patch,
      });
      await a.core.patchNamespace({
        name: n2,
        body: [{ op: 'add', path: '/metadata/labels', value: { touch: value } }],
      });
    };
    const names = [tc, id, n2];
    await eventually(
      'the adapter to report the consumer, the identity and the namespace',
      async () => {
        if (names.every((x) => adapterSink.received.some((r) => r.headers['ce-name'] === x))) return true;
        await touch();
        return false;
      },
      90_000,
    );
    await a.custom.deleteNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: n,
      plural: 'terraformclusters',
      name: tc,
    });
    await eventually('both to report the delete', async () =>
      [adapterSink, localSink].every((s) =>
        s.received.some(
          (r) => r.headers['ce-name'] === tc && r.headers['ce-type'] === 'dev.knative.apiserver.ref.delete',
        ),
      ),
    );
    await toLocal.idle();

    const ce = (h: IncomingHttpHeaders) =>
      Object.fromEntries(
        Object.entries(h)
          .filter(([k]) => k.startsWith('ce-') || k === 'content-type' || k === 'kn-namespace')
          .sort(([x], [y]) => x.localeCompare(y)),
      );
    const ours = adapterSink.received.filter((r) => names.includes(String(r.headers['ce-name'])));
    let compared = 0;
    for (const ar of ours) {
      const type = ar.headers['ce-type'];
      const subject = ar.headers['ce-subject'];
      const twin = localSink.received.find((l) => l.headers['ce-type'] === type && l.headers['ce-subject'] === subject);
      assert.ok(twin, `the local source also sent ${type} ${subject}`);
      const [ah, lh] = [ce(ar.headers), ce(twin.headers)];
      assert.deepEqual(Object.keys(lh), Object.keys(ah), 'the same CloudEvents attributes');
      for (const k of Object.keys(ah)) {
        if (k === 'ce-id' || k === 'ce-time') continue;
        assert.equal(lh[k], ah[k], `${k} of ${type} ${subject}`);
      }
      assert.ok(!Number.isNaN(Date.parse(String(lh['ce-time']))));
      assert.equal(twin.body, ar.body, `body of ${type} ${subject}, byte for byte`);
      compared++;
    }
    const other = (h: IncomingHttpHeaders) =>
      Object.keys(h).filter(
        (k) =>
          !k.startsWith('ce-') &&
          ![
            'content-type',
            'kn-namespace',
            'content-length',
            'host',
            'connection',
            'user-agent',
            'accept-encoding',
            'accept',
            'accept-language',
            'sec-fetch-mode',
          ].includes(k),
      );
    t.diagnostic(
      `compared ${compared} events; other headers of the adapter (HTTP client's own): ${JSON.stringify(other(ours[0]!.headers))}; example adapter headers ${JSON.stringify(ce(ours[0]!.headers))}`,
    );
    assert.ok(compared >= 4, `compared ${compared} events`);
    assert.ok(
      ours.some((r) => r.headers['ce-kind'] === 'TerraformClusterIdentity') &&
        ours.some((r) => r.headers['ce-kind'] === 'Namespace'),
    );
  });
}

describe('Delivery, like a Trigger with retry 5 and exponential back-off', () => {
  const run = async (statuses: number[], opts: ConstructorParameters<typeof Delivery>[1] = {}, url?: string) => {
    const sink = await startSink(statuses);
    servers.push(sink.server);
    const reports: DeliveryReport[] = [];
    const d = new Delivery(url ?? sink.url, { backoffMs: 5, ...opts, onReport: (r) => reports.push(r) });
    d.send(refEvent('add', { apiVersion: 'v1', kind: 'Namespace', name: 'x' }, 'https://h'));
    await d.idle();
    return { reports, received: sink.received };
  };

  it('retries 5xx and 429 until a 2xx', async () => {
    const { reports, received } = await run([503, 429, 500, 200]);
    assert.equal(received.length, 4);
    assert.deepEqual(
      reports.map((r) => [r.status, r.attempts, r.failed]),
      [[200, 4, false]],
    );
    // Every attempt is the same event.
    assert.equal(new Set(received.map((r) => r.headers['ce-id'])).size, 1);
  });

  it('gives up on a 4xx at once (a dead-letter sink would get it)', async () => {
    const { reports, received } = await run([400]);
    assert.equal(received.length, 1);
    assert.deepEqual(
      reports.map((r) => [r.status, r.attempts, r.failed]),
      [[400, 1, true]],
    );
  });

  it('gives up after 1 + retries attempts when the sink keeps failing or is unreachable', async () => {
    const failing = await run([503, 503, 503, 503], { retries: 2 });
    assert.equal(failing.received.length, 3);
    assert.deepEqual(
      failing.reports.map((r) => [r.status, r.attempts, r.failed]),
      [[503, 3, true]],
    );
    const closed = await startSink();
    closed.server.close();
    const unreachable = await run([], { retries: 1 }, closed.url);
    assert.deepEqual(
      unreachable.reports.map((r) => [r.status, r.attempts, r.failed]),
      [[0, 2, true]],
    );
  });

  it('keeps at most maxQueue events waiting, dropping the oldest', async () => {
    let release!: () => void;
    const hold = new Promise<void>((r) => (release = r));
    const sink = await startSink([], { hold });
    servers.push(sink.server);
    const reports: DeliveryReport[] = [];
    const d = new Delivery(sink.url, { concurrency: 1, maxQueue: 2, onReport: (r) => reports.push(r) });
    for (const name of ['n0', 'n1', 'n2', 'n3'])
      d.send(refEvent('add', { apiVersion: 'v1', kind: 'Namespace', name }, 'https://h'));
    release();
    await d.idle();
    // n0 was in flight; n1 was dropped when n3 arrived; n2 and n3 were delivered.
    assert.deepEqual(
      sink.received.map((r) => r.headers['ce-name']),
      ['n0', 'n2', 'n3'],
    );
    assert.deepEqual(
      reports.filter((r) => r.failed).map((r) => [r.subject.split('/').pop(), r.error]),
      [['n1', 'queue full; dropped the oldest event']],
    );
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
  ns.onCleanup(async () => {
    for (const id of ['aws-prod', 'gcp-dev'])
      await a.custom
        .deleteClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, name: `${id}-${sfx}` })
        .catch(() => undefined);
    for (const name of ['captf-system', 'team-a', 'team-b', 'team-c'])
      await a.core.deleteNamespace({ name: `${name}-${sfx}` }).catch(() => undefined);
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
    const byList = (await a.custom.getClusterCustomObject({
      group: GROUP,
      version: VERSION,
      plural: IDENTITY_PLURAL,
      name: `aws-prod-${sfx}`,
    })) as TerraformClusterIdentity;
    assert.deepEqual(byList.spec.allowedNamespaces, { list: [`team-a-${sfx}`, `team-b-${sfx}`] });
    const bySelector = (await a.custom.getClusterCustomObject({
      group: GROUP,
      version: VERSION,
      plural: IDENTITY_PLURAL,
      name: `gcp-dev-${sfx}`,
    })) as TerraformClusterIdentity;
    assert.deepEqual(bySelector.spec.allowedNamespaces, {
      selector: { matchLabels: { 'captf.example/credentials': 'gcp' } },
    });
    const labelled = await a.core.readNamespace({ name: `team-c-${sfx}` });
    assert.equal(labelled.metadata?.labels?.['captf.example/credentials'], 'gcp');
    // Applying again changes nothing and fails nowhere (kubectl apply is idempotent too).
    assert.equal((await applyExamples(a.kc, dir)).length, applied.length);
  });

  it('a real kubectl applies them client-side (`kubectl apply -f examples/`) and shows the printer columns', async (t) => {
    const kubectl = builtKubectlPath();
    if (!kubectl) {
      t.skip('kubectl is not built (node scripts/local/kubectl.ts)');
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
    const ids = run('get', 'terraformclusteridentities', `aws-prod-${sfx}`, `gcp-dev-${sfx}`);
    t.diagnostic(ids);
    assert.match(ids.split('\n')[0]!, /^NAME\s+READY\s+SECRET-NAMESPACE\s+SECRET\s+NAMESPACES\s+AGE$/);
    assert.match(ids, new RegExp(`aws-prod-${sfx}\\s+captf-system-${sfx}\\s+aws-prod-${sfx}-credentials`));
    const tcs = run('get', 'terraformclusters', '-n', `team-a-${sfx}`);
    assert.match(tcs.split('\n')[0]!, /^NAME\s+IDENTITY\s+MIRRORED\s+REASON\s+AGE$/);
    // The selectable field works from kubectl too.
    const bySelector = run(
      'get',
      'terraformclusters',
      '-A',
      '--field-selector',
      `spec.identityRef.name=aws-prod-${sfx}`,
      '-o',
      'name',
    );
    assert.deepEqual(bySelector.trim().split('\n').sort(), [
      'terraformcluster.infrastructure.cluster.x-k8s.io/prod',
      'terraformcluster.infrastructure.cluster.x-k8s.io/staging',
    ]);
  });
});
