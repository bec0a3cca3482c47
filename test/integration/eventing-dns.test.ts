/**
 * Nothing of Knative's event path leaves the machine by name: the Broker data plane
 * (scripts/eventing/dataplane.ts) and the ApiServerSource adapter run with
 * `GODEBUG=netdns=go+2`, so Go's resolver prints `go package net: hostLookupOrder(<name>) = …`
 * to stderr before each host name it resolves (the binaries are built with CGO_ENABLED=0:
 * Go's own resolver is the only one). After the processes started, took an event through the
 * Broker and sent one from the adapter, no line may name anything but `localhost`: upstream
 * asks for `kubernetes.default.svc` at start (the OIDC verifier's discovery), which would go to
 * the host's DNS server; the processes' `HTTPS_PROXY` is a loopback proxy that refuses it
 * instead (scripts/eventing/processes.ts startRefusingProxy, docs/eventing-dataplane.md
 * "Nothing leaves the machine").
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { isIP } from 'node:net';
import { CoreV1Api } from '@kubernetes/client-node';
import { startApiServerSourceAdapter, type RunningAdapter } from '../../scripts/eventing/adapter.ts';
import type { EventingDataPlane } from '../../scripts/eventing/dataplane.ts';
import { render } from '../../scripts/tools/kustomize.ts';
import { admin, controlPlaneDir, eventually } from '../helpers/cluster.ts';
import { RENDERED_MANIFESTS, startBroker, startSink } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';

const w = fx.world('eventing-dns');
const GO_DNS_DEBUG = { GODEBUG: 'netdns=go+2' };
/** Go's line for each host name it resolves (net/conf.go hostLookupOrder, debug level 2). */
const LOOKUP = /go package net: hostLookupOrder\(([^)]*)\)/;

let dp: EventingDataPlane;
let adapter: RunningAdapter;
let sink: Awaited<ReturnType<typeof startSink>>;
let namespace: string;

/** The host names a process's log says it resolved. */
const lookedUp = (logs: readonly string[]) => logs.flatMap((l) => LOOKUP.exec(l)?.[1] ?? []);
/** True for a name that resolves on this machine only (/etc/hosts' `localhost`, or no name at all). */
const local = (name: string) => isIP(name) !== 0 || name === 'localhost' || name.endsWith('.localhost');

before(async () => {
  sink = await startSink();
  namespace = await w.namespace();
  // By name, so the filter looks one up (the check below would pass vacuously if nothing did).
  const byName = sink.url.replace('//127.0.0.1:', '//localhost:');
  const sinks = { 'captf-mirror-sync': byName, 'captf-identity-status': byName, 'captf-dead-letters': byName };
  dp = await startBroker({
    objects: await render(RENDERED_MANIFESTS),
    namespace,
    sinks,
    schedules: { 'captf-resync': '*/2 * * * * *' },
    env: GO_DNS_DEBUG,
  });
  adapter = await startApiServerSourceAdapter({
    kubeconfigPath: `${controlPlaneDir()}/admin.kubeconfig`,
    sink: dp.brokerUrl.replace('//127.0.0.1:', '//localhost:'),
    source: {
      namespaces: [namespace],
      allNamespaces: false,
      resources: [{ gvr: { Group: '', Version: 'v1', Resource: 'configmaps' } }],
      mode: 'Reference',
    },
    name: 'captf-dns',
    namespace,
    env: GO_DNS_DEBUG,
  });
});

after(async () => {
  await adapter?.stop();
  await dp?.stop();
  sink?.server.close();
});

describe('the event path resolves no name off the machine', () => {
  it("carries the adapter's events and mtping's pings to a Trigger's subscriber", async () => {
    const core = admin().kc.makeApiClient(CoreV1Api);
    const name = 'captf-dns-probe';
    await core.createNamespacedConfigMap({ namespace, body: { metadata: { name } } });
    // The adapter's first watch may start after its STARTING line: change the object until an event comes.
    await eventually(
      'a ref.update event and a ping at the sink',
      async () => {
        await core.patchNamespacedConfigMap({
          namespace,
          name,
          body: [{ op: 'add', path: '/data', value: { at: String(Date.now()) } }],
        });
        const seen = (type: string, subject = '') =>
          sink.received.some((e) => e.headers['ce-type'] === type && String(e.headers['ce-subject']).endsWith(subject));
        return seen('dev.knative.apiserver.ref.update', `/configmaps/${name}`) && seen('dev.knative.sources.ping');
      },
      30_000,
      500,
    );
  });

  it('sends the OIDC discovery request for kubernetes.default.svc to the loopback proxy, which refuses it', () => {
    assert.ok(dp.refused.includes('kubernetes.default.svc:443'), `refused: ${dp.refused.join(', ')}`);
  });

  it('logs each lookup: the filter and the adapter resolved localhost, their sinks by name', () => {
    for (const [component, logs] of [
      ['filter', dp.logs.filter],
      ['adapter', adapter.logs],
    ] as const)
      assert.ok(
        lookedUp(logs).includes('localhost'),
        `${component} logged no lookup of localhost:\n${logs.join('\n')}`,
      );
  });

  for (const component of ['ingress', 'filter', 'dispatcher', 'mtping', 'adapter'] as const)
    it(`${component}: no lookup of a name that is not local`, () => {
      const logs = component === 'adapter' ? adapter.logs : dp.logs[component];
      const off = lookedUp(logs).filter((n) => !local(n));
      assert.deepEqual(
        off,
        [],
        `${component} resolved ${off.join(', ')}:\n${logs.filter((l) => LOOKUP.test(l)).join('\n')}`,
      );
    });
});
