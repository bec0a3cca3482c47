/**
 * End to end with the real event source: Knative Eventing's ApiServerSource
 * receive adapter, built from its pinned Go module, watches the test control plane and
 * delivers its CloudEvents straight to mirror-sync. Creating a consumer makes its mirror
 * appear; deleting it cleans up — in Reference and in Resource mode.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { TERRAFORM_CLUSTER } from '../../functions/lib/api.ts';
import { startApiServerSourceAdapter, type RunningAdapter } from '../../scripts/eventing/adapter.ts';
import { controlPlaneDir, eventually } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';
import {
  mirrorSyncUnderTest,
  operatorSource,
  type MirrorSyncUnderTest,
  type OperatorSource,
} from '../helpers/mirror-sync.ts';

const w = fx.world('adapter');
let ms: MirrorSyncUnderTest;
let source: OperatorSource;
const adapters: RunningAdapter[] = [];

before(async () => {
  source = await operatorSource(w, fx.data({ token: 'adapter-e2e' }));
  ms = await mirrorSyncUnderTest(w);
});
after(async () => {
  for (const ad of adapters) await ad.stop();
});

for (const mode of ['Reference', 'Resource'] as const) {
  describe(`the real ApiServerSource adapter in ${mode} mode`, () => {
    it('creating a consumer makes its mirror appear; deleting it cleans up', async (t) => {
      const n = await w.namespace();
      const id = await source.newIdentity(fx.allowList(n));
      const { group, version, plural } = TERRAFORM_CLUSTER;
      const adapter = await startApiServerSourceAdapter({
        kubeconfigPath: `${controlPlaneDir()}/admin.kubeconfig`,
        sink: ms.url,
        source: {
          namespaces: [n],
          allNamespaces: false,
          mode,
          resources: [{ gvr: { Group: group, Version: version, Resource: plural } }],
        },
        name: `e2e-${mode.toLowerCase()}`,
      });
      adapters.push(adapter);
      // The adapter is at-most-once and its first watch may still be starting: touch the
      // object until an event arrives, as a user would not need to but a test must. What
      // shows an event arrived is this instance's reconcile of the object (only the adapter
      // sends it events), not the mirror: other test files' resyncs, cluster-wide on the
      // same control plane, may create the mirror before any event is delivered.
      const e2e = await w.create(fx.consumer('e2e', fx.inNamespace(n), fx.identityRef(id)));
      let touch = 0;
      let polls = 0;
      const line = await eventually(
        'an adapter-driven reconcile',
        async () => {
          const found = ms.log
            .entries()
            .find((e) => e.message === 'reconcile' && e.object === `${n}/e2e` && e.outcome === 'mirrored');
          if (found) return found;
          // About once a second: a reconcile takes a moment after the event that caused it.
          if (polls++ % 5 === 0) {
            await w.put(
              fx.consumer('e2e', fx.inNamespace(n), fx.identityRef(id), fx.labels({ touch: String(++touch) })),
            );
          }
          return undefined;
        },
        90_000,
      );
      t.diagnostic(`reconcile log line: ${JSON.stringify(line)}`);
      // The mirror is written before the reconcile logs its line.
      const mirror = fx.mirrorOf(id, fx.inNamespace(n));
      assert.equal((await w.read(mirror))?.metadata!.ownerReferences![0]!.name, 'e2e');

      await w.delete(e2e);
      await eventually(
        'mirror-sync to see the delete event',
        async () =>
          ms.log.entries().some((e) => e.message === 'reconcile' && e.object === `${n}/e2e` && e.outcome === 'gone'),
        90_000,
      );
      await eventually('the mirror to be gone', async () => (await w.read(mirror)) === undefined, 90_000);
      await adapter.stop();
    });
  });
}
