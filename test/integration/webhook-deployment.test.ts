/**
 * The webhook's fallback path (docs/deploy-knative.md): admission as a Deployment + Service on a
 * real node, serving the manifests' own certificate, registered by the rendered
 * ValidatingWebhookConfiguration (a service reference, `caBundle` injected by the cert-manager
 * stand-in from `cert-manager.io/inject-ca-from`). The API server calls it through the Service's
 * ClusterIP; a renewed certificate is served without a restart; with no pod ready, identity
 * writes are refused (`failurePolicy: Fail`). Deployed with `components/admission-client-ca`
 * and the control plane's webhook client CA, as an operator whose API server presents a client
 * certificate to webhooks would: the API server's reviews pass, a review posted straight to a pod
 * is refused. With `components/admission-network-policy` on a node that enforces NetworkPolicy
 * (kube-router): a tenant's pod cannot even connect, until the policy goes. One node for the
 * file, its own control plane; root.
 */
import assert from 'node:assert/strict';
import { readFileSync, rmSync } from 'node:fs';
import { request } from 'node:https';
import { X509Certificate } from 'node:crypto';
import { connect } from 'node:tls';
import { describe, it } from 'node:test';
import {
  AdmissionregistrationV1Api,
  AppsV1Api,
  CoreV1Api,
  CustomObjectsApi,
  DiscoveryV1Api,
  NetworkingV1Api,
  PatchStrategy,
  setHeaderOptions,
} from '@kubernetes/client-node';
import { CALLER_REFUSED } from '../../functions/admission/callers.ts';
import { identities } from '../../functions/lib/objects.ts';
import { createCA, createLeaf, type CertPair } from '../../scripts/controlplane/pki.ts';
import { applyAsRendered } from '../../scripts/lib/kube.ts';
import { deployAdmissionDeployment } from '../../scripts/system/admission-deployment.ts';
import { identityThroughWebhook, refusal } from '../helpers/admission.ts';
import { eventually } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';
import { assertNoSecret } from '../helpers/logs.ts';
import { nodeWorld } from '../helpers/node.ts';

const { system, w, work, progress } = await nodeWorld('fallback', { node: true, networkPolicies: true });
const node = system.node!;
// A failure here ends the file before its cleanups are registered with the runner: stop the node first.
// The control plane runs inside the node: it connects from the node's own address.
const POLICY_RANGE = `${node.namespace.address}/32`;
const clientCaPem = readFileSync(system.controlPlane!.webhookClientCaPath, 'utf8');
const fallback = await deployAdmissionDeployment(system.kc, {
  dir: work,
  log: (l) => progress.push(l),
  clientCaPem,
  networkPolicyCidr: POLICY_RANGE,
}).catch(async (err: unknown) => {
  await system.stop();
  rmSync(work, { recursive: true, force: true });
  throw err;
});
w.onCleanup(() => fallback.stop());

const NAMESPACE = 'captf-system';
const NAME = 'captf-admission';
const core = system.kc.makeApiClient(CoreV1Api);
const apps = system.kc.makeApiClient(AppsV1Api);

/** The fingerprint of the certificate admission's Secret holds now (the leaf, first in the chain). */
const secretLeaf = async () => {
  const s = await core.readNamespacedSecret({ namespace: NAMESPACE, name: 'captf-admission-tls' });
  return new X509Certificate(Buffer.from(s.data!['tls.crt']!, 'base64')).fingerprint256;
};

/** One forward per pod address, from this machine into the node. */
const forwards = new Map<string, Promise<number>>();

/** The fingerprint of the certificate a pod serves, read over TLS from this machine. */
async function servedBy(podIP: string): Promise<string> {
  if (!forwards.has(podIP)) forwards.set(podIP, node.forward({ host: podIP, port: 8443 }));
  const port = await forwards.get(podIP)!;
  return new Promise((resolve, reject) => {
    const socket = connect(
      { host: '127.0.0.1', port, servername: `${NAME}.${NAMESPACE}.svc`, rejectUnauthorized: false },
      () => {
        const fingerprint = socket.getPeerX509Certificate()!.fingerprint256;
        socket.end();
        resolve(fingerprint);
      },
    );
    socket.on('error', reject);
  });
}

/** Admission's pods that are not being deleted. */
const admissionPods = async () =>
  (
    await core.listNamespacedPod({ namespace: NAMESPACE, labelSelector: `app.kubernetes.io/name=${NAME}` })
  ).items.filter((p) => !p.metadata?.deletionTimestamp);

/**
 * Endpoints of the webhook's Service: `ready` ones, or all (a terminating pod stays an endpoint,
 * `serving`, through its preStop and drain, and kube-proxy still sends to it while none is ready).
 */
const endpoints = async (which: 'ready' | 'all') =>
  (
    await system.kc
      .makeApiClient(DiscoveryV1Api)
      .listNamespacedEndpointSlice({ namespace: NAMESPACE, labelSelector: `kubernetes.io/service-name=${NAME}` })
  ).items.flatMap((s) => (s.endpoints ?? []).filter((e) => which === 'all' || e.conditions?.ready));

/** What one TCP connection attempt came to: `connected`, `timeout` (3 s) or the error's code. */
type Reach = 'connected' | 'timeout' | string;

/** The probe's program (the product image's `node`): one attempt per target, all at once, one JSON line. */
const PROBE = `const net = require('node:net');
Promise.all(JSON.parse(process.argv[1]).map((t) => new Promise((done) => {
  const s = net.connect({ host: t.host, port: t.port, timeout: 3000 });
  s.on('connect', () => { s.destroy(); done('connected'); });
  s.on('timeout', () => { s.destroy(); done('timeout'); });
  s.on('error', (e) => done(e.code));
}))).then((r) => console.log(JSON.stringify(r)));`;

let probes = 0;
/**
 * What a pod in `namespace` (a tenant's, no policy of its own) reaches: a pod of the product
 * image, non-root, that tries each target once and exits.
 */
async function reachFrom(namespace: string, targets: { host: string; port: number }[]): Promise<Reach[]> {
  const name = `probe-${++probes}`;
  await core.createNamespacedPod({
    namespace,
    body: {
      metadata: { name },
      spec: {
        restartPolicy: 'Never',
        securityContext: { runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532 },
        containers: [
          {
            name: 'probe',
            image: node.image.ref,
            imagePullPolicy: 'Never',
            command: ['node', '-e', PROBE, JSON.stringify(targets)],
          },
        ],
      },
    },
  });
  try {
    await eventually(
      `probe ${namespace}/${name} to finish`,
      async () => (await core.readNamespacedPod({ namespace, name })).status?.phase === 'Succeeded',
      120_000,
      500,
    );
    return JSON.parse(await core.readNamespacedPodLog({ namespace, name })) as Reach[];
  } finally {
    await core.deleteNamespacedPod({ namespace, name, gracePeriodSeconds: 0 });
  }
}

/**
 * With the policy, a pod of a tenant's namespace cannot connect to admission's pod or Service;
 * with the policy gone it can (the control); back, it cannot, and the API server still can.
 */
async function policyKeepsTenantsOut(): Promise<void> {
  const tenant = await w.namespace();
  const service = await core.readNamespacedService({ namespace: NAMESPACE, name: NAME });
  const targets = [
    { host: (await admissionPods())[0]!.status!.podIP!, port: 8443 },
    { host: service.spec!.clusterIP!, port: 443 },
  ];
  const policy = fallback.applied.find((x) => x.kind === 'NetworkPolicy')!;
  const networking = system.kc.makeApiClient(NetworkingV1Api);
  const stored = await networking.readNamespacedNetworkPolicy({ namespace: NAMESPACE, name: NAME });
  assert.equal(stored.spec?.ingress?.[0]?._from?.[0]?.ipBlock?.cidr, POLICY_RANGE, 'stored with its range');
  const blocked = await reachFrom(tenant, targets);
  assert.ok(
    blocked.every((r) => r !== 'connected'),
    `no connection with the policy: ${blocked.join(', ')}`,
  );
  await networking.deleteNamespacedNetworkPolicy({ namespace: NAMESPACE, name: NAME });
  try {
    // The control: the same pod's attempts connect once the policy is gone (kube-router's next sync).
    await eventually(
      'connections from the tenant once the policy is gone',
      async () => (await reachFrom(tenant, targets)).every((r) => r === 'connected'),
      120_000,
      1000,
    );
  } finally {
    await applyAsRendered(system.kc, policy, 'kubectl');
  }
  await eventually(
    'no connection once the policy is back',
    async () => (await reachFrom(tenant, targets)).every((r) => r !== 'connected'),
    120_000,
    1000,
  );
  // The API server connects from the node (the policy's range), and still gets its reviews answered.
  const name = w.name('behind-policy');
  await identities(w.clients).create(fx.identity(name, fx.secretRef(NAMESPACE, 'none'), fx.allowList('x')));
  await identities(w.clients).delete({ name });
}

describe('the webhook as a Deployment + Service (the fallback path)', () => {
  it('applies the overlay as rendered: a Deployment, a Service on 443, the webhook by service reference with the injected CA', async () => {
    const kinds = fallback.applied.map((o) => `${o.kind}/${o.metadata?.name}`);
    for (const k of [
      'Deployment/captf-admission',
      'Service/captf-admission',
      'ValidatingWebhookConfiguration/captf-admission',
    ])
      assert.ok(kinds.includes(k), `${k} in ${kinds.join(', ')}`);
    const vwc = await system.kc
      .makeApiClient(AdmissionregistrationV1Api)
      .readValidatingWebhookConfiguration({ name: NAME });
    const hook = vwc.webhooks![0]!;
    assert.deepEqual(
      { ...hook.clientConfig.service },
      { name: NAME, namespace: NAMESPACE, path: '/validate', port: 443 },
    );
    assert.equal(hook.failurePolicy, 'Fail');
    const ca = Buffer.from(hook.clientConfig.caBundle!, 'base64').toString();
    const secret = await core.readNamespacedSecret({ namespace: NAMESPACE, name: 'captf-admission-tls' });
    assert.equal(ca, Buffer.from(secret.data!['ca.crt']!, 'base64').toString(), "caBundle is the Secret's ca.crt");
  });

  it('the API server calls it through the Service: a create, a widening update, a refused delete', async () => {
    const walk = await identityThroughWebhook(w);
    assertNoSecret(walk.messages.join('\n'), [walk.planted], 'what the users saw');
  });

  it("a review posted straight to a pod is refused unless it carries the API server's client certificate", async () => {
    const pods = await admissionPods();
    const pod = pods[0]!;
    const port = await node.forward({ host: pod.status!.podIP!, port: 8443 });
    const foreignCa = await createCA(work, 'foreign-ca', 'captf-test-foreign-ca');
    const foreign = await createLeaf({
      ca: foreignCa,
      dir: work,
      name: 'foreign',
      cn: 'kube-apiserver-webhook-client',
      usage: 'client',
    });
    // The SubjectAccessReview it asks for, had it been answered: may user "mallory" read the Secret?
    const forged = JSON.stringify({
      apiVersion: 'admission.k8s.io/v1',
      kind: 'AdmissionReview',
      request: {
        uid: 'forged',
        operation: 'CREATE',
        name: 'probe',
        userInfo: { username: 'mallory' },
        object: fx.identity('probe', fx.secretRef(NAMESPACE, 'captf-admission-tls'), fx.allowList('x')),
      },
    });
    const post = (client?: CertPair) =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = request(
          {
            host: '127.0.0.1',
            port,
            path: '/validate',
            method: 'POST',
            servername: `${NAME}.${NAMESPACE}.svc`,
            rejectUnauthorized: false,
            agent: false,
            headers: { 'content-type': 'application/json' },
            ...(client ? { cert: readFileSync(client.cert), key: readFileSync(client.key) } : {}),
          },
          (res) => {
            let body = '';
            res.on('data', (d: Buffer) => (body += d.toString()));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
          },
        );
        req.on('error', reject);
        req.end(forged);
      });
    for (const client of [undefined, foreign]) {
      const r = await post(client);
      assert.equal(r.status, 403, r.body);
      assert.deepEqual(JSON.parse(r.body), { error: CALLER_REFUSED });
    }
    const log = await eventually(
      "the pod's log to say why",
      async () => {
        const l = await core.readNamespacedPodLog({ namespace: NAMESPACE, name: pod.metadata!.name! });
        return /admission caller refused.*not signed by the client CA/.test(l) ? l : undefined;
      },
      30_000,
    );
    assert.match(log, /admission caller refused.*no client certificate/);
    assert.doesNotMatch(log, /"uid":"forged"/, 'no review was made');
    // And the API server, presenting its certificate, is still answered.
    const name = w.name('through-api-server');
    await identities(w.clients).create(fx.identity(name, fx.secretRef(NAMESPACE, 'none'), fx.allowList('x')));
    await identities(w.clients).delete({ name });
  });

  it("with the NetworkPolicy a tenant's pod cannot connect to the webhook, by pod or Service; without it, it can", () =>
    policyKeepsTenantsOut());

  it('a renewed certificate is served by the running pods, without a restart, and reviews go on', async () => {
    const before = await admissionPods();
    const old = await secretLeaf();
    for (const p of before)
      assert.equal(await servedBy(p.status!.podIP!), old, `${p.metadata!.name} serves the issued certificate`);
    // What `cmctl renew` does: the Issuing condition, through the status subresource.
    const custom = system.kc.makeApiClient(CustomObjectsApi);
    const ref = {
      group: 'cert-manager.io',
      version: 'v1',
      namespace: NAMESPACE,
      plural: 'certificates',
      name: 'captf-admission-tls',
    };
    const cert = (await custom.getNamespacedCustomObject(ref)) as { status: { conditions?: unknown[] } };
    cert.status.conditions = [
      ...(cert.status.conditions ?? []),
      { type: 'Issuing', status: 'True', reason: 'ManuallyTriggered', message: 'renewal asked by the test' },
    ];
    await custom.replaceNamespacedCustomObjectStatus({ ...ref, body: cert });
    const renewed = await eventually(
      'a new certificate in the Secret',
      async () => ((await secretLeaf()) !== old ? secretLeaf() : undefined),
      60_000,
    );
    // The kubelet refreshes Secret volumes on its sync (about a minute), then admission's reload (10 s).
    for (const p of before)
      await eventually(
        `${p.metadata!.name} to serve the renewed certificate`,
        async () => (await servedBy(p.status!.podIP!)) === renewed,
        180_000,
        1000,
      );
    const after = await admissionPods();
    assert.deepEqual(
      after.map((p) => [p.metadata!.uid, p.status!.containerStatuses![0]!.restartCount]).sort(),
      before.map((p) => [p.metadata!.uid, 0]).sort(),
      'the same pods, never restarted',
    );
    const name = w.name('after-renewal');
    await identities(w.clients).create(fx.identity(name, fx.secretRef(NAMESPACE, 'none'), fx.allowList('x')));
    await identities(w.clients).delete({ name });
  });

  it('with no pod ready the webhook fails closed: identity writes are refused, then admitted again once a pod is back', async () => {
    const scale = (replicas: number) =>
      apps.patchNamespacedDeploymentScale(
        { namespace: NAMESPACE, name: NAME, body: { spec: { replicas } } },
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      );
    await scale(0);
    try {
      await eventually(
        'no endpoint at all behind the webhook Service (every pod gone)',
        async () => (await endpoints('all')).length === 0,
        120_000,
      );
      const name = w.name('closed');
      const r = await refusal(
        identities(w.clients).create(fx.identity(name, fx.secretRef(NAMESPACE, 'none'), fx.allowList('x'))),
      );
      assert.match(r.message, /failed calling webhook "identities\.captf-admission/);
      await assert.rejects(identities(w.clients).get({ name }), 'nothing was stored');
    } finally {
      await scale(2);
    }
    await eventually('a ready endpoint again', async () => (await endpoints('ready')).length > 0, 120_000);
    const name = w.name('reopened');
    await eventually(
      'an identity write admitted again',
      () =>
        identities(w.clients)
          .create(fx.identity(name, fx.secretRef(NAMESPACE, 'none'), fx.allowList('x')))
          .then(() => true),
      60_000,
    );
    await identities(w.clients).delete({ name });
  });
});
