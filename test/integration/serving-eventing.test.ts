/**
 * The manifests on Knative Serving and Knative Eventing's own installation on a real node
 * (`startSystem({ serving: true, events: 'knative' })`, scripts/eventing/install.ts): Eventing's
 * upstream controllers, webhook and data plane run as pods from images of the pinned module and
 * reconcile the manifests' Broker, Triggers, PingSources and ApiServerSource as applied, with no
 * stand-in writing a field; a consumer created afterwards is mirrored through Knative's own
 * ApiServerSource adapter pod, Broker and Trigger. One start for the file; needs root.
 */
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { AppsV1Api, CoreV1Api, CustomObjectsApi } from '@kubernetes/client-node';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { SYSTEM_NAMESPACE } from '../../scripts/eventing/dataplane.ts';
import { EVENTING_DEPLOYMENTS } from '../../scripts/eventing/install.ts';
import { startSystem } from '../../scripts/system/system.ts';
import { eventually } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';
import { operatorSource } from '../helpers/mirror-sync.ts';
import { scanNodeLogs, stopNodeSystem } from '../helpers/node.ts';

const work = mkdtempSync(join(tmpdir(), 'captf-serving-eventing-'));
const progress: string[] = [];
const DAY_MS = 24 * 3600_000;
const system = await startSystem({
  dir: work,
  progress: (l) => progress.push(l),
  serving: true,
  events: 'knative',
  pings: { statusEveryMs: DAY_MS, resyncEveryMs: DAY_MS },
});
process.env.CAPTF_TEST_CONTROLPLANE = system.controlPlane!.dir;
const w = fx.world('serving-eventing');
w.onCleanup(() => stopNodeSystem(system, work, progress));
scanNodeLogs(work);

const NAMESPACE = 'captf-system';
const core = system.kc.makeApiClient(CoreV1Api);
const custom = system.kc.makeApiClient(CustomObjectsApi);

type Conditioned = {
  metadata: { name: string; managedFields?: { manager?: string; subresource?: string }[] };
  status?: {
    conditions?: { type: string; status: string; reason?: string; message?: string }[];
    address?: { url?: string };
  };
};

/** Every object of one eventing kind in the manifests' namespace. */
const list = async (group: string, plural: string): Promise<Conditioned[]> =>
  (
    (await custom.listNamespacedCustomObject({ group, version: 'v1', namespace: NAMESPACE, plural })) as {
      items: Conditioned[];
    }
  ).items;

const ready = (o: Conditioned) => o.status?.conditions?.find((c) => c.type === 'Ready');

describe("the manifests on Knative Eventing's own installation", () => {
  it("runs Eventing's controllers, webhook and data plane as pods, Available", async () => {
    const apps = system.kc.makeApiClient(AppsV1Api);
    for (const name of EVENTING_DEPLOYMENTS) {
      // The PingSource adapter is scaled from 0 to 1 by the PingSource reconciler once a PingSource exists.
      const d = await eventually(
        `${name} Available`,
        async () => {
          const got = await apps.readNamespacedDeployment({ namespace: SYSTEM_NAMESPACE, name });
          return got.status?.conditions?.some((c) => c.type === 'Available' && c.status === 'True') && got;
        },
        120_000,
        1000,
      );
      assert.match(d.spec!.template.spec!.containers[0]!.image!, /^ko\.local\/knative-/);
    }
  });

  it("reconciles the manifests' Broker, Triggers, PingSources and ApiServerSource to Ready, with Knative's own status writers", async () => {
    const kinds = [
      ['eventing.knative.dev', 'brokers', 'Broker'],
      ['eventing.knative.dev', 'triggers', 'Trigger'],
      ['sources.knative.dev', 'pingsources', 'PingSource'],
      ['sources.knative.dev', 'apiserversources', 'ApiServerSource'],
    ] as const;
    for (const [group, plural, kind] of kinds) {
      const wanted = system.rendered.filter((o) => o.kind === kind).map((o) => o.metadata!.name!);
      assert.ok(wanted.length > 0, `the manifests hold a ${kind}`);
      const items = await eventually(
        `every ${kind} of the manifests Ready`,
        async () => {
          const all = await list(group, plural);
          const mine = all.filter((o) => wanted.includes(o.metadata.name));
          return mine.length === wanted.length && mine.every((o) => ready(o)?.status === 'True') && mine;
        },
        240_000,
        1000,
      ).catch(async (err: unknown) => {
        const now = (await list(group, plural)).map((o) => `${o.metadata.name}: ${JSON.stringify(ready(o))}`);
        throw new Error(`${(err as Error).message}\n${now.join('\n')}`);
      });
      for (const o of items) {
        const writers = (o.metadata.managedFields ?? [])
          .filter((f) => f.subresource === 'status')
          .map((f) => f.manager);
        assert.ok(writers.length > 0, `${kind} ${o.metadata.name}'s status was written`);
        assert.ok(
          writers.every((m) => !m?.startsWith('captf')),
          `${kind} ${o.metadata.name}'s status is Knative's own, not a stand-in's: ${writers.join(', ')}`,
        );
      }
    }
    const [broker] = await list('eventing.knative.dev', 'brokers');
    assert.equal(
      broker!.status?.address?.url,
      `http://broker-ingress.${SYSTEM_NAMESPACE}.svc.cluster.local/${NAMESPACE}/${broker!.metadata.name}`,
    );
  });

  it("a new consumer is mirrored through Knative's ApiServerSource adapter pod, the Broker and a Trigger", async () => {
    const source = await operatorSource(w, fx.data({ AWS_ACCESS_KEY_ID: 'AKIA-eventing' }));
    const ns = await w.namespace();
    const id = await source.newIdentity(fx.allowList(ns));
    const consumer = await w.create(fx.consumer('c', fx.inNamespace(ns), fx.identityRef(id)));
    const mirror = await eventually(
      `mirror ${ns}/${mirrorName(id)} owned by the consumer`,
      async () => {
        const s = await core.readNamespacedSecret({ namespace: ns, name: mirrorName(id) }).catch(() => undefined);
        return s?.metadata?.ownerReferences?.some((o) => o.uid === consumer.metadata.uid) && s;
      },
      180_000,
      500,
    );
    assert.equal(Buffer.from(mirror.data!.AWS_ACCESS_KEY_ID!, 'base64').toString(), 'AKIA-eventing');
    const adapters = await core.listNamespacedPod({
      namespace: NAMESPACE,
      // The labels Knative's ApiServerSource reconciler puts on its adapter (resources/labels.go).
      labelSelector: `eventing.knative.dev/sourceName=${system.rendered.find((o) => o.kind === 'ApiServerSource')!.metadata!.name}`,
    });
    assert.ok(
      adapters.items.some((p) => p.status?.phase === 'Running'),
      "the ApiServerSource's adapter runs as Knative's controller made it, in a pod",
    );
  });
});
