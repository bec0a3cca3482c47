/**
 * End to end with the real event source: Knative Eventing's ApiServerSource
 * receive adapter, built from its pinned Go module, watches the test control plane and
 * delivers its CloudEvents straight to mirror-sync. Creating a consumer makes its mirror
 * appear; deleting it cleans up — in Reference and in Resource mode.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { GROUP, VERSION } from '../../functions/lib/api.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { start } from '../../functions/mirror-sync/index.ts';
import { startApiServerSourceAdapter, type RunningAdapter } from '../../scripts/eventing/adapter.ts';
import { admin, controlPlaneDir, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { captureLogger } from '../helpers/logs.ts';
import { createConsumer, deleteConsumer, deleteIdentity, getMirror, putIdentity } from '../helpers/mirror-sync.ts';

const a = admin();
const ns = namespaces('adapter');
const log = captureLogger('mirror-sync');
let fn: FunctionHandle;
const adapters: RunningAdapter[] = [];
const source = { name: 'creds', namespace: '' };

before(async () => {
  source.namespace = await ns.create();
  await a.core.createNamespacedSecret({
    namespace: source.namespace,
    body: { metadata: { name: source.name }, stringData: { token: 'adapter-e2e' } },
  });
  fn = await start({ port: 0, host: '127.0.0.1', kubeconfig: a.kc, logger: log.logger, env: {} });
});
after(async () => {
  for (const ad of adapters) await ad.stop();
  await fn?.close();
});

for (const mode of ['Reference', 'Resource'] as const) {
  describe(`the real ApiServerSource adapter in ${mode} mode`, () => {
    it('creating a consumer makes its mirror appear; deleting it cleans up', async (t) => {
      const n = await ns.create();
      const id = `id-${suffix()}`;
      ns.onCleanup(() => deleteIdentity(a, id));
      await putIdentity(a, id, source, { list: [n] });
      const adapter = await startApiServerSourceAdapter({
        kubeconfigPath: `${controlPlaneDir()}/admin.kubeconfig`,
        sink: `http://127.0.0.1:${fn.port}/`,
        source: {
          namespaces: [n],
          allNamespaces: false,
          mode,
          resources: [{ gvr: { Group: GROUP, Version: VERSION, Resource: 'terraformclusters' } }],
        },
        name: `e2e-${mode.toLowerCase()}`,
      });
      adapters.push(adapter);
      // The adapter is at-most-once and its first watch may still be starting: touch the
      // object until an event arrives, as a user would not need to but a test must. What
      // shows an event arrived is this instance's reconcile of the object (only the adapter
      // sends it events), not the mirror: other test files' resyncs, cluster-wide on the
      // same control plane, may create the mirror before any event is delivered.
      await createConsumer(a, n, 'e2e', id);
      let touch = 0;
      let polls = 0;
      const line = await eventually(
        'an adapter-driven reconcile',
        async () => {
          const found = log
            .entries()
            .find((e) => e.message === 'reconcile' && e.object === `${n}/e2e` && e.outcome === 'mirrored');
          if (found) return found;
          // About once a second: a reconcile takes a moment after the event that caused it.
          if (polls++ % 5 === 0) {
            await a.custom.patchNamespacedCustomObject({
              group: GROUP,
              version: VERSION,
              plural: 'terraformclusters',
              namespace: n,
              name: 'e2e',
              body: [{ op: 'add', path: '/metadata/labels', value: { touch: String(++touch) } }],
            });
          }
          return undefined;
        },
        90_000,
      );
      t.diagnostic(`reconcile log line: ${JSON.stringify(line)}`);
      // The mirror is written before the reconcile logs its line.
      const mirror = await getMirror(a, n, id);
      assert.equal(mirror?.metadata!.ownerReferences![0]!.name, 'e2e');

      await deleteConsumer(a, n, 'e2e');
      await eventually(
        'mirror-sync to see the delete event',
        async () =>
          log.entries().some((e) => e.message === 'reconcile' && e.object === `${n}/e2e` && e.outcome === 'gone'),
        90_000,
      );
      await eventually('the mirror to be gone', async () => (await getMirror(a, n, id)) === undefined, 90_000);
      await adapter.stop();
    });
  });
}
