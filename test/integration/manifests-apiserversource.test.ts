/**
 * The real event source: Knative Eventing's ApiServerSource receive adapter (built from its
 * pinned Go module) runs against the test control plane as the manifests' event-source
 * ServiceAccount (its rendered RBAC, a TokenRequest token) and sends CloudEvents to a local
 * HTTP sink. The functions' CloudEvents parser accepts what it sends (SPEC §12).
 */
import assert from 'node:assert/strict';
import type { IncomingHttpHeaders } from 'node:http';
import { after, before, describe, it } from 'node:test';
import type { KubernetesObject } from '@kubernetes/client-node';
import { IDENTITY_RESOURCE, TERRAFORM_CLUSTER, TERRAFORM_MACHINE, type ResourceKind } from '../../functions/lib/api.ts';
import { classifyEvent, parseCloudEvents } from '../../functions/lib/cloudevents.ts';
import { consumerKindsFromEnv } from '../../functions/lib/consumers.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import {
  ensureApiServerSourceAdapter,
  sourceConfigFor,
  startApiServerSourceAdapter,
  type ApiServerSourceSpec,
  type RunningAdapter,
} from '../../scripts/eventing/adapter.ts';
import { render } from '../../scripts/tools/kustomize.ts';
import { eventually, suffix } from '../helpers/cluster.ts';
import { startSink, UNSIGNED_EVENTS, type ReceivedEvent } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';
import { captureLogger } from '../helpers/logs.ts';

const w = fx.world('apiserversource');
const a = w.clients;
const kinds = consumerKindsFromEnv({});
/** How the adapter's configuration names a resource. */
const gvr = (k: ResourceKind) => ({ gvr: { Group: k.group, Version: k.version, Resource: k.plural } });

const ceHeaders = (h: IncomingHttpHeaders) =>
  Object.fromEntries(
    Object.entries(h)
      .filter(([k]) => k.startsWith('ce-') || k === 'content-type')
      .sort(([x], [y]) => x.localeCompare(y)),
  );

let sink: Awaited<ReturnType<typeof startSink>>;
/** The event-source ServiceAccount's kubeconfig. */
let kubeconfigPath: string;
let target: string;
let rendered: KubernetesObject[];
const adapters: RunningAdapter[] = [];
const functions: FunctionHandle[] = [];

before(async () => {
  await ensureApiServerSourceAdapter();
  sink = await startSink();
  target = await w.namespace();
  rendered = await render('manifests/overlays/without-crds');
  // The adapter runs as the manifests' event-source ServiceAccount with its rendered RBAC.
  ({ kubeconfigPath } = await w.account('captf-event-sources'));
});

after(async () => {
  for (const ad of adapters) await ad.stop();
  for (const f of functions) await f.close();
  sink?.server.close();
});

/** Changes an object (via `touch`) until an event matching `match` arrives. */
async function awaitEvent(
  what: string,
  match: (r: ReceivedEvent) => boolean,
  touch: () => Promise<unknown>,
): Promise<ReceivedEvent> {
  let n = 0;
  return eventually(
    what,
    async () => {
      const hit = sink.received.find(match);
      if (hit) return hit;
      if (n++ % 5 === 0) await touch();
      return undefined;
    },
    60_000,
  );
}

describe('the real ApiServerSource adapter, as the event-source ServiceAccount', () => {
  referenceModeTests();
  resourceModeAndEndToEndTests();
});

/** Reference mode, as the manifests configure the adapter. */
function referenceModeTests(): void {
  it('Reference mode, configured as the manifests configure it: consumer, identity and namespace events reach the sink and parse as the functions expect', async (t) => {
    const manifest = rendered.find(
      (o) => o.kind === 'ApiServerSource' && o.metadata?.name === 'captf-objects',
    ) as unknown as ApiServerSourceSpec;
    const source = await sourceConfigFor(a.kc, manifest);
    assert.deepEqual(source, {
      namespaces: [],
      allNamespaces: true,
      mode: 'Reference',
      resources: [
        ...kinds.map(gvr),
        gvr(IDENTITY_RESOURCE),
        { gvr: { Group: '', Version: 'v1', Resource: 'namespaces' } },
      ],
    });
    const adapter = await startApiServerSourceAdapter({
      kubeconfigPath,
      sink: sink.url,
      source,
      name: 'captf-objects',
      namespace: target,
    });
    adapters.push(adapter);

    // A consumer: created, then deleted.
    const name = `tc-${suffix()}`;
    const touched = (n: number) =>
      fx.consumer(name, fx.inNamespace(target), fx.identityRef('aws'), fx.annotations({ touch: String(n) }));
    const c = await w.create(touched(0));
    let touches = 0;
    const subject = `/apis/${c.apiVersion}/namespaces/${target}/${TERRAFORM_CLUSTER.plural}/${name}`;
    const first = await awaitEvent(
      `an event about ${subject}`,
      (r) => r.headers['ce-subject'] === subject,
      () => w.put(touched(++touches)),
    );
    t.diagnostic(`consumer event headers: ${JSON.stringify(ceHeaders(first.headers))}`);
    t.diagnostic(`consumer event body: ${first.body}`);
    assert.equal(first.headers['ce-specversion'], '1.0');
    assert.match(String(first.headers['ce-type']), /^dev\.knative\.apiserver\.ref\.(add|update)$/);
    assert.equal(first.headers['ce-source'], a.kc.getCurrentCluster()!.server);
    assert.equal(first.headers['ce-kind'], 'TerraformCluster');
    assert.equal(first.headers['ce-name'], name);
    assert.equal(first.headers['ce-namespace'], target);
    assert.match(String(first.headers['content-type']), /^application\/json/);
    assert.deepEqual(JSON.parse(first.body), {
      apiVersion: c.apiVersion,
      kind: TERRAFORM_CLUSTER.kind,
      name,
      namespace: target,
    });
    const [ev] = parseCloudEvents(first.headers as Record<string, string>, first.body);
    const req = classifyEvent(ev!, kinds);
    assert.equal(req.type, 'object');
    assert.ok(
      req.type === 'object' &&
        req.target === 'consumer' &&
        req.mode === 'ref' &&
        req.ref.name === name &&
        req.ref.namespace === target,
    );

    await w.delete(c);
    const del = await eventually('the consumer delete event', async () =>
      sink.received.find(
        (r) => r.headers['ce-subject'] === subject && r.headers['ce-type'] === 'dev.knative.apiserver.ref.delete',
      ),
    );
    const delReq = classifyEvent(parseCloudEvents(del.headers as Record<string, string>, del.body)[0]!, kinds);
    assert.ok(delReq.type === 'object' && delReq.verb === 'delete' && delReq.target === 'consumer');

    // An identity (cluster-scoped).
    const idName = w.name('id');
    const id = await w.create(fx.identity(idName));
    // Each resource has its own watch, which may start a moment after the consumers' one.
    let idTouches = 0;
    const idEv = await awaitEvent(
      'the identity event',
      (r) => r.headers['ce-name'] === idName,
      () => w.put(fx.identity(idName, fx.labels({ touch: String(++idTouches) }))),
    );
    t.diagnostic(`identity event headers: ${JSON.stringify(ceHeaders(idEv.headers))}`);
    // Upstream quirk (v0.49): a cluster-scoped object's subject keeps an empty namespace
    // segment and the `namespace` extension is present but empty.
    assert.equal(
      idEv.headers['ce-subject'],
      `/apis/${id.apiVersion}/namespaces//${IDENTITY_RESOURCE.plural}/${idName}`,
    );
    assert.equal(idEv.headers['ce-namespace'], '');
    const idReq = classifyEvent(parseCloudEvents(idEv.headers as Record<string, string>, idEv.body)[0]!, kinds);
    assert.ok(
      idReq.type === 'object' &&
        idReq.target === 'identity' &&
        idReq.ref.name === idName &&
        idReq.ref.namespace === undefined,
    );

    // A namespace.
    const n2 = await w.namespace(fx.labels({ 'captf.io/tenant': 'true' }));
    let nsTouches = 0;
    const nsEv = await awaitEvent(
      'the namespace event',
      (r) => r.headers['ce-kind'] === 'Namespace' && r.headers['ce-name'] === n2,
      () =>
        a.core.patchNamespace({
          name: n2,
          body: [{ op: 'replace', path: '/metadata/labels/captf.io~1tenant', value: `t${++nsTouches}` }],
        }),
    );
    t.diagnostic(`namespace event headers: ${JSON.stringify(ceHeaders(nsEv.headers))} body: ${nsEv.body}`);
    const nsReq = classifyEvent(parseCloudEvents(nsEv.headers as Record<string, string>, nsEv.body)[0]!, kinds);
    assert.ok(nsReq.type === 'object' && nsReq.target === 'namespace' && nsReq.ref.name === n2);

    // Least privilege held: the adapter never logged a permission error.
    assert.deepEqual(
      adapter.logs.filter((l) => /forbidden/i.test(l)),
      [],
    );
  });
}

/** Resource mode, and the adapter driving mirror-sync end to end. */
function resourceModeAndEndToEndTests(): void {
  it('Resource mode: the event carries the whole object', async (t) => {
    const n = await w.namespace();
    const adapter = await startApiServerSourceAdapter({
      kubeconfigPath,
      sink: sink.url,
      name: 'captf-resources',
      namespace: target,
      source: { namespaces: [n], allNamespaces: false, mode: 'Resource', resources: [gvr(TERRAFORM_MACHINE)] },
    });
    adapters.push(adapter);
    const name = `tm-${suffix()}`;
    const touched = (t: number) =>
      fx.consumer(
        name,
        fx.inNamespace(n),
        fx.ofKind(TERRAFORM_MACHINE),
        fx.identityRef('aws'),
        fx.labels({ touch: String(t) }),
      );
    await w.create(touched(0));
    let touches = 0;
    const ev = await awaitEvent(
      'a Resource-mode event',
      (r) =>
        r.headers['ce-name'] === name && String(r.headers['ce-type']).startsWith('dev.knative.apiserver.resource.'),
      () => w.put(touched(++touches)),
    );
    t.diagnostic(`resource event headers: ${JSON.stringify(ceHeaders(ev.headers))}`);
    const data = JSON.parse(ev.body) as { kind: string; metadata: { name: string; uid: string }; spec: unknown };
    assert.equal(data.kind, TERRAFORM_MACHINE.kind);
    assert.deepEqual(data.spec, { identityRef: { name: 'aws' } });
    const req = classifyEvent(parseCloudEvents(ev.headers as Record<string, string>, ev.body)[0]!, kinds);
    assert.ok(
      req.type === 'object' &&
        req.mode === 'resource' &&
        req.target === 'consumer' &&
        req.ref.uid === data.metadata.uid,
    );
  });

  it('end to end: the adapter drives mirror-sync (both as their ServiceAccounts): a new consumer gets its mirror, and it goes when the consumer goes', async () => {
    const [operator, tenant] = [await w.namespace(), await w.namespace()];
    const idName = w.name('e2e');
    await w.create(fx.sourceSecret('creds', fx.inNamespace(operator)));
    await w.create(fx.identity(idName, fx.secretRef(operator, 'creds'), fx.allowList(tenant)));
    const { clients } = await w.account('captf-mirror-sync');
    const fn = await (
      await import('../../functions/mirror-sync/index.ts')
    ).start({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: clients.kc,
      env: UNSIGNED_EVENTS,
      logger: captureLogger('mirror-sync').logger,
    });
    functions.push(fn);
    // Only this test's namespace: a mirror-sync acting on other test files' objects would disturb them.
    adapters.push(
      await startApiServerSourceAdapter({
        kubeconfigPath,
        sink: `http://127.0.0.1:${fn.port}/`,
        name: 'captf-e2e',
        namespace: target,
        source: { namespaces: [tenant], allNamespaces: false, mode: 'Reference', resources: kinds.map(gvr) },
      }),
    );
    const name = `tc-${suffix()}`;
    const touched = (t: number) =>
      fx.consumer(name, fx.inNamespace(tenant), fx.identityRef(idName), fx.labels({ touch: String(t) }));
    const c = await w.create(touched(0));
    const mirrorAt = fx.mirrorOf(idName, fx.inNamespace(tenant));
    let touches = 0;
    const mirror = await eventually("the mirror made from the adapter's event", async () => {
      const m = await w.read(mirrorAt);
      if (m) return m;
      // The adapter's first watch may start after the create: a change makes a new event.
      if (++touches % 10 === 0) await w.put(touched(touches));
      return undefined;
    });
    assert.deepEqual(
      mirror.metadata?.ownerReferences?.map((r) => r.name),
      [name],
    );
    await w.delete(c);
    await eventually('the mirror deleted after the consumer', async () => (await w.read(mirrorAt)) === undefined);
  });
}
