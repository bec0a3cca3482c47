/**
 * The Serving node's pure parts: Serving's and Eventing's objects as installed on the node, the
 * overlay that changes only the manifests' image references, the objects applied, the gateway
 * Service, and the scale lines.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { KubernetesObject, V1Pod } from '@kubernetes/client-node';
import { podView, scaleLine } from '../../scripts/local/scale.ts';
import { servingObjects, TRAEFIK_INGRESS_CLASS } from '../../scripts/serving/manifests.ts';
import { traefikService, TRAEFIK_PORTS } from '../../scripts/serving/serving.ts';
import { CLUSTER_LOCAL_ISSUER } from '../../scripts/serving/tls.ts';
import { eventingObjects } from '../../scripts/eventing/install.ts';
import { LOCAL_FEATURES } from '../../scripts/eventing/dataplane.ts';
import { nodeOverlay, objectsToApply, splitImageRef, withFunctionEnv } from '../../scripts/system/serving.ts';
import { withObservabilityConfig } from '../../scripts/observability/stack.ts';
import { startSystem, type SystemOptions } from '../../scripts/system/system.ts';
import * as fx from '../helpers/fixtures.ts';

const configMap = (name: string, data: Record<string, string>) =>
  ({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name }, data }) as KubernetesObject;

describe("Serving's objects on the node", () => {
  const docs = [
    configMap('config-deployment', { 'queue-sidecar-image': 'ko://knative.dev/serving/cmd/queue' }),
    configMap('config-network', { 'ingress-class': 'kourier.ingress.networking.knative.dev' }),
    configMap('config-certmanager', {}),
    configMap('config-autoscaler', { 'stable-window': '60s', 'container-concurrency-target-default': '100' }),
    {
      apiVersion: 'apps/v1',
      kind: 'Deployment',
      metadata: { name: 'activator' },
      spec: { template: { spec: { containers: [{ image: 'ko://knative.dev/serving/cmd/activator' }] } } },
    } as KubernetesObject,
  ];
  const images = { queue: 'ko.local/q:1', activator: 'ko.local/a:1' };
  const out = servingObjects(docs, { images, autoscaler: { 'stable-window': '6s' } });
  const data = (name: string) => (out.find((o) => o.metadata?.name === name) as { data: Record<string, string> }).data;

  it('names the imported images instead of ko:// references, the queue-proxy sidecar too', () => {
    assert.equal(data('config-deployment')['queue-sidecar-image'], 'ko.local/q:1');
    assert.doesNotMatch(JSON.stringify(out), /ko:\/\//);
  });
  it("sets Traefik's ingress class, cluster-local TLS from the platform's issuer, and merges the autoscaler settings, keeping the others", () => {
    assert.equal(data('config-network')['ingress-class'], TRAEFIK_INGRESS_CLASS);
    assert.equal(data('config-network')['cluster-local-domain-tls'], 'Enabled');
    assert.equal(
      data('config-certmanager').clusterLocalIssuerRef,
      `kind: ClusterIssuer\nname: ${CLUSTER_LOCAL_ISSUER}\n`,
    );
    assert.deepEqual(data('config-autoscaler'), {
      'stable-window': '6s',
      'container-concurrency-target-default': '100',
    });
  });
  it('refuses a ko:// reference it has no image for', () =>
    assert.throws(() => servingObjects(docs, { images: { queue: 'x' } }), /no image for ko:\/\/.*activator/));
  it('leaves the input unchanged', () =>
    assert.equal(
      (docs[4] as { spec: { template: { spec: { containers: { image: string }[] } } } }).spec.template.spec
        .containers[0]!.image,
      'ko://knative.dev/serving/cmd/activator',
    ));
});

describe("Eventing's objects on the node", () => {
  const deployment = (name: string, image: string, env: Record<string, string> = {}) =>
    ({
      apiVersion: 'apps/v1',
      kind: 'Deployment',
      metadata: { name },
      spec: {
        template: {
          spec: { containers: [{ image, env: Object.entries(env).map(([n, value]) => ({ name: n, value })) }] },
        },
      },
    }) as KubernetesObject;
  const images = {
    controller: 'ko.local/c:1',
    apiserver_receive_adapter: 'ko.local/ra:1',
    'broker/filter': 'ko.local/f:1',
  };

  it('names the imported images instead of ko:// references, in images and in the environment, and says which is not built', () => {
    const out = eventingObjects(
      [
        deployment('eventing-controller', 'ko://knative.dev/eventing/cmd/controller', {
          APISERVER_RA_IMAGE: 'ko://knative.dev/eventing/cmd/apiserver_receive_adapter',
          AUTH_PROXY_IMAGE: 'ko://knative.dev/eventing/cmd/auth_proxy',
        }),
        deployment('mt-broker-filter', 'ko://knative.dev/eventing/cmd/broker/filter'),
      ],
      images,
    );
    const text = JSON.stringify(out);
    assert.doesNotMatch(text, /ko:\/\//);
    for (const ref of ['ko.local/c:1', 'ko.local/ra:1', 'ko.local/f:1']) assert.ok(text.includes(ref), ref);
    assert.match(text, /ko\.local\/knative-eventing-auth-proxy:not-built/);
  });
  it('refuses a ko:// reference it has no image for', () =>
    assert.throws(
      () => eventingObjects([deployment('x', 'ko://knative.dev/eventing/cmd/jobsink')], images),
      /no image for ko:\/\/knative\.dev\/eventing\/cmd\/jobsink/,
    ));
  it("merges the local feature flags and sender identity into config-features, keeping upstream's others", () => {
    const upstream = { 'authentication-oidc': 'disabled', 'kreference-group': 'disabled' };
    const [features] = eventingObjects([configMap('config-features', upstream)], images);
    assert.deepEqual((features as { data: Record<string, string> }).data, {
      'kreference-group': 'disabled',
      ...LOCAL_FEATURES,
      'authentication-oidc': 'enabled',
    });
  });
});

describe('the rendered objects applied on the node', () => {
  const rendered = [
    { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'sa' } },
    { apiVersion: 'eventing.knative.dev/v1', kind: 'Broker', metadata: { name: 'b' } },
    { apiVersion: 'eventing.knative.dev/v1', kind: 'Trigger', metadata: { name: 't' } },
    {
      apiVersion: 'sources.knative.dev/v1',
      kind: 'PingSource',
      metadata: { name: 'p' },
      spec: { schedule: '*/5 * * * *', data: 'x' },
    },
    { apiVersion: 'sources.knative.dev/v1', kind: 'ApiServerSource', metadata: { name: 'a' } },
  ] as KubernetesObject[];

  it('all of them, for Knative Eventing to run: a PingSource with the schedule asked for and the rest of its spec', () => {
    const out = objectsToApply(rendered, { schedules: { p: '0 0 * * *' } });
    assert.deepEqual(
      out.map((o) => o.kind),
      rendered.map((o) => o.kind),
    );
    assert.deepEqual((out[3] as { spec: unknown }).spec, { schedule: '0 0 * * *', data: 'x' });
    assert.equal(
      (rendered[3] as { spec: { schedule: string } }).spec.schedule,
      '*/5 * * * *',
      'the input is unchanged',
    );
  });

  it("with the receivers inside the node: every function's container gets their settings, a same-named entry replaced", () => {
    const service = (name: string) => ({
      apiVersion: 'serving.knative.dev/v1',
      kind: 'Service',
      metadata: { name },
      spec: {
        template: {
          spec: {
            containers: [
              {
                env: [
                  { name: 'A', value: '1' },
                  { name: 'B', value: 'old' },
                ],
              },
            ],
          },
        },
      },
    });
    const objects = [...rendered, service('captf-x')] as KubernetesObject[];
    const out = withFunctionEnv(objects, { B: 'new', C: '3' });
    assert.deepEqual((out.at(-1) as ReturnType<typeof service>).spec.template.spec.containers[0]!.env, [
      { name: 'A', value: '1' },
      { name: 'B', value: 'new' },
      { name: 'C', value: '3' },
    ]);
    assert.deepEqual(out.slice(0, -1), rendered, 'nothing else changes');
    assert.equal((objects.at(-1) as ReturnType<typeof service>).spec.template.spec.containers[0]!.env.length, 2);
    const configs: (KubernetesObject & { data: Record<string, string> })[] = [
      { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'config-observability' }, data: { keep: 'k' } },
      { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'config-features' }, data: {} },
    ];
    assert.deepEqual(
      withObservabilityConfig(configs, { 'tracing-sampling-rate': '1' }).map((c) => (c as { data: unknown }).data),
      [{ keep: 'k', 'tracing-sampling-rate': '1' }, {}],
    );
  });
});

describe('the overlay of the manifests', () => {
  fx.rows(
    [
      {
        name: 'a tag',
        ref: 'ko.local/captf-credentials:0.1.0',
        want: { repository: 'ko.local/captf-credentials', tag: '0.1.0' },
      },
      {
        name: "a registry's port",
        ref: 'localhost:5000/captf:1',
        want: { repository: 'localhost:5000/captf', tag: '1' },
      },
    ],
    (r) => assert.deepEqual(splitImageRef(r.ref), r.want),
  );
  fx.rows(
    [
      { name: 'no tag', ref: 'localhost:5000/captf' },
      { name: 'a digest', ref: 'ko.local/captf@sha256:0123' },
    ],
    (r) => assert.throws(() => splitImageRef(r.ref), /repository:tag/),
  );
  it('quotes every scalar it writes, so a folder name cannot end the line', () => {
    const text = nodeOverlay('../a #b/manifests', { product: 'ko.local/p:1' }, ['../c: d']);
    assert.match(text, /^resources:\n {2}- "\.\.\/a #b\/manifests"$/m);
    assert.match(text, /^components:\n {2}- "\.\.\/c: d"$/m);
    assert.match(text, /newName: "ko\.local\/p"\n {4}newTag: "1"/);
  });
});

describe("Traefik's Service", () => {
  it('has no selector, and its EndpointSlice names the node and the private entrypoint', () => {
    const [service, slice] = traefikService('10.240.0.1') as [
      { spec: { selector?: unknown; ports: { port: number; targetPort: number }[] } },
      { metadata: { labels: Record<string, string> }; endpoints: { addresses: string[] }[]; ports: { port: number }[] },
    ];
    assert.equal(service.spec.selector, undefined);
    assert.deepEqual(service.spec.ports, [
      { name: 'http', port: 80, targetPort: TRAEFIK_PORTS.private, protocol: 'TCP' },
      { name: 'https', port: 443, targetPort: TRAEFIK_PORTS.private, protocol: 'TCP' },
    ]);
    assert.equal(slice.metadata.labels['kubernetes.io/service-name'], 'traefik-internal');
    assert.deepEqual(slice.endpoints[0]!.addresses, ['10.240.0.1']);
    assert.equal(slice.ports[0]!.port, TRAEFIK_PORTS.private);
  });
});

describe('the scale lines', () => {
  const pod = (ready: boolean, deleting = false): V1Pod => ({
    metadata: {
      name: 'p',
      labels: { 'serving.knative.dev/service': 'captf-mirror-sync' },
      creationTimestamp: new Date('2026-12-03T10:00:00Z'),
      ...(deleting ? { deletionTimestamp: new Date('2026-12-03T10:01:00Z') } : {}),
    },
    status: {
      conditions: [
        { type: 'Ready', status: ready ? 'True' : 'False', lastTransitionTime: new Date('2026-12-03T10:00:01.500Z') },
      ],
    },
  });
  it('a ready pod knows how long it took; a Terminating one is not ready', () => {
    assert.equal(podView(pod(true)).startMs, 1500);
    assert.equal(podView(pod(true, true)).ready, false);
    assert.equal(podView(pod(false)).startMs, undefined);
  });
  fx.rows(
    [
      { name: 'cold start', before: 0, after: 1, want: /^cold start: pod p ready 1\.5 s after/ },
      { name: 'scale out', before: 1, after: 3, want: /^scaled out to 3 ready pods$/ },
      { name: 'scale in', before: 3, after: 2, want: /^scaled in to 2 ready pods$/ },
      { name: 'scale in to one', before: 2, after: 1, want: /^scaled in to 1 ready pod$/ },
      { name: 'to zero', before: 1, after: 0, want: /^scaled to zero/ },
    ],
    (r) => assert.match(scaleLine('captf-mirror-sync', r.before, r.after, podView(pod(true)))!.text, r.want),
  );
  it('says nothing when the count did not change', () =>
    assert.equal(scaleLine('captf-mirror-sync', 2, 2, podView(pod(true))), undefined));
});

describe('the system options that need Serving or a node', () => {
  // Refused before anything starts: no control plane, no folder written.
  const refused = (opts: Partial<SystemOptions>, why: RegExp) =>
    assert.rejects(startSystem({ dir: '/nonexistent/captf', progress: () => undefined, ...opts }), why);

  it("an empty cluster (product: false), Eventing's own installation and the registry each need what they run on", async () => {
    await refused({ product: false }, /product: false leaves Serving empty: add serving/);
    await refused({ events: 'knative' }, /installs Knative Eventing on the node Serving runs on: add serving/);
    await refused({ registry: true }, /registry runs on the node: add node or serving/);
    await refused({ observability: true }, /observability runs inside the Serving node: add serving/);
    await refused({ serving: true, events: 'knative', functions: 'source' }, /leave functions and webhook out/);
    await refused({ serving: true, events: 'broker' }, /set events: 'knative'/);
  });
});
