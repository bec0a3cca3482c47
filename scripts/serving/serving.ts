/**
 * Knative Serving on the test node (scripts/node/): its four Deployments from the pinned
 * module's `config/core` (./manifests.ts) as pods on the kubelet, with images built here
 * (scripts/image/images.ts), and Traefik's Knative provider as the KIngress.
 *
 * Traefik runs as a process in the node's namespaces (like CoreDNS), not as a pod: it is the
 * cluster's ingress, not something under test; as a process it starts beside Serving's pods
 * instead of after them, needs no image or RBAC of its own, and its log sits in the node's
 * folder. Knative finds it through `traefik-internal`, a Service without a selector whose
 * EndpointSlice names the node's address and Traefik's port (what a LoadBalancer in front of a
 * gateway pod would be in a cluster). Traefik acts as the cluster admin here.
 *
 * Cluster-local TLS is on (./tls.ts): the cert-manager stand-in (scripts/certmanager/) runs for
 * as long as Serving does and issues the routes' certificates, which Traefik serves by SNI on
 * the same entrypoint as plain HTTP.
 */
import type { ChildProcess } from 'node:child_process';
import { mkdirSync, openSync } from 'node:fs';
import { join } from 'node:path';
import {
  AppsV1Api,
  CoreV1Api,
  KubeConfig,
  type KubernetesObject,
  type V1CustomResourceDefinition,
} from '@kubernetes/client-node';
import { startCertManager } from '../certmanager/certmanager.ts';
import { applyCRDs, CERT_MANAGER_CRDS, installThirdPartyCRDs } from '../controlplane/crds.ts';
import { buildImage } from '../image/build.ts';
import { SERVING_PROGRAMS } from '../image/images.ts';
import { serverSideApply } from '../lib/kube.ts';
import { stopProcess } from '../lib/process.ts';
import { eventually } from '../lib/wait.ts';
import type { TestNode } from '../node/node.ts';
import { ensureTool } from '../tools/build.ts';
import { withObservabilityConfig } from '../observability/stack.ts';
import { loadServingObjects, SERVING_NAMESPACE, TEST_AUTOSCALER } from './manifests.ts';
import { CLUSTER_LOCAL_CA, clusterLocalIssuers, trustBundle } from './tls.ts';

/** Traefik's entrypoints on the node's address (`private`: cluster-local routes) and its ping on loopback. */
export const TRAEFIK_PORTS = { private: 8091, public: 8092, ping: 8093 } as const;
/** The Service Knative's cluster-local addresses lead to (an ExternalName to it per Knative Service). */
export const TRAEFIK_SERVICE = { name: 'traefik-internal', namespace: SERVING_NAMESPACE } as const;
/** Field manager of what is applied here. */
const MANAGER = 'captf-serving';
/** How long Serving's pods may take to be Available (image import, several pods on two cores; generous). */
const AVAILABLE_TIMEOUT_MS = 240_000;

/** Running Knative Serving. */
export interface KnativeServing {
  /** Where the installation came from (module@version/folder). */
  sources: string[];
  /** PEM of the CA of cluster-local certificates: what a client of an `https://….svc.cluster.local` address trusts. */
  caPem: string;
  /** Stops Traefik and the cert-manager stand-in (Serving's pods go with the node). */
  stop(): Promise<void>;
}

/** Options of {@link startServing}. */
export interface ServingOptions {
  /** The node's folder (Traefik's log goes to `traefik/` under it). */
  dir: string;
  log: (line: string) => void;
  /** Merged into Serving's `config-observability` before its components start. */
  observability?: Readonly<Record<string, string>>;
}

/**
 * Installs and starts Knative Serving on `node`: builds the programs and images when missing,
 * imports the images, starts the cert-manager stand-in with the cluster-local CA issuer and
 * publishes the CA as Eventing's trust bundle, applies Serving's objects, starts Traefik and
 * waits until Serving's four
 * Deployments are Available (Knative Services applied right after may still meet its webhook
 * starting: ../system/serving.ts retries).
 * @throws Error naming what did not become ready, with where its log is; Traefik and the stand-in are stopped first.
 */
export async function startServing(node: TestNode, opts: ServingOptions): Promise<KnativeServing> {
  opts.log('[serving] programs and images (built when missing)');
  const traefikBin = await ensureTool('traefik', 'traefik', opts.log);
  for (const p of SERVING_PROGRAMS) {
    const image = await buildImage(`serving-${p}`, { log: opts.log });
    await node.containerd.ctr(['images', 'import', image.path]);
  }
  const loaded = await loadServingObjects(TEST_AUTOSCALER);
  const { sources } = loaded;
  const objects = withObservabilityConfig(loaded.objects, opts.observability);
  const kc = new KubeConfig();
  kc.loadFromFile(node.controlPlane.kubeconfigPath);
  const certManager = startCertManager(kc, { dir: join(opts.dir, 'cert-manager'), log: opts.log });
  const stops = [() => certManager.stop()];
  const stop = async () => {
    for (const s of stops.splice(0).reverse()) await s();
  };
  try {
    // Before Serving's controller starts: it reads config-network once and needs cert-manager's CRDs then.
    const caPem = await clusterLocalCA(kc);
    for (const o of trustBundle(caPem)) await serverSideApply(kc, o, MANAGER);
    opts.log(`[serving] applying ${objects.length} objects from ${sources.join(', ')}`);
    await applyCRDs(kc, objects.filter((o) => o.kind === 'CustomResourceDefinition') as V1CustomResourceDefinition[]);
    for (const o of objects) if (o.kind !== 'CustomResourceDefinition') await serverSideApply(kc, o, MANAGER);
    for (const o of traefikService(node.namespace.address)) await serverSideApply(kc, o, MANAGER);
    const traefik = startTraefik(node, { dir: opts.dir, bin: traefikBin });
    stops.push(() => stopProcess(traefik, 5000));
    await servingReady(kc, { traefik, log: join(opts.dir, 'traefik', 'traefik.log') });
    opts.log('[serving] Knative Serving is Available; Traefik is its KIngress, serving cluster-local TLS');
    return { sources, caPem, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * cert-manager's CRDs, the stand-in, and the cluster-local CA ClusterIssuer (./tls.ts).
 * @returns the CA's certificate, PEM, once issued.
 */
async function clusterLocalCA(kc: KubeConfig): Promise<string> {
  await installThirdPartyCRDs(kc, CERT_MANAGER_CRDS);
  for (const o of clusterLocalIssuers())
    await eventually(`applying ${o.kind} ${o.metadata?.name}`, () => serverSideApply(kc, o, MANAGER), 30_000);
  const core = kc.makeApiClient(CoreV1Api);
  return eventually(
    `the cluster-local CA (Secret ${CLUSTER_LOCAL_CA.namespace}/${CLUSTER_LOCAL_CA.secret})`,
    async () => {
      const s = await core.readNamespacedSecret({
        namespace: CLUSTER_LOCAL_CA.namespace,
        name: CLUSTER_LOCAL_CA.secret,
      });
      const ca = s.data?.['ca.crt'];
      return ca ? Buffer.from(ca, 'base64').toString() : undefined;
    },
    30_000,
    250,
  );
}

/** `traefik-internal`: a Service without a selector, and its EndpointSlice to Traefik's private entrypoint. Pure. */
export function traefikService(address: string): KubernetesObject[] {
  const labels = { 'app.kubernetes.io/name': 'traefik', 'app.kubernetes.io/part-of': 'captf-test-node' };
  return [
    {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { ...TRAEFIK_SERVICE, labels },
      // 443: the API server dials an ExternalName Service at the webhook's port, here the Knative Service's 443.
      spec: {
        ports: [
          { name: 'http', port: 80, targetPort: TRAEFIK_PORTS.private, protocol: 'TCP' },
          { name: 'https', port: 443, targetPort: TRAEFIK_PORTS.private, protocol: 'TCP' },
        ],
      },
    } as KubernetesObject,
    {
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: {
        name: `${TRAEFIK_SERVICE.name}-node`,
        namespace: TRAEFIK_SERVICE.namespace,
        labels: { ...labels, 'kubernetes.io/service-name': TRAEFIK_SERVICE.name },
      },
      addressType: 'IPv4',
      endpoints: [{ addresses: [address], conditions: { ready: true } }],
      // One entrypoint answers both: Traefik tells TLS from plain HTTP by the first bytes.
      ports: [
        { name: 'http', port: TRAEFIK_PORTS.private, protocol: 'TCP' },
        { name: 'https', port: TRAEFIK_PORTS.private, protocol: 'TCP' },
      ],
    } as KubernetesObject,
  ];
}

/** Traefik with its Knative provider (experimental in v3.6), on the node's address. */
function startTraefik(node: TestNode, o: { dir: string; bin: string }): ChildProcess {
  const base = join(o.dir, 'traefik');
  mkdirSync(base, { recursive: true });
  const log = openSync(join(base, 'traefik.log'), 'a');
  const { address } = node.namespace;
  return node.namespace.spawn(
    o.bin,
    [
      '--log.level=INFO',
      // Who answered what, and how long it took: what a failed delivery's status came from.
      '--accesslog=true',
      '--accesslog.format=json',
      `--accesslog.filepath=${join(base, 'access.log')}`,
      '--experimental.knative=true',
      '--providers.knative=true',
      '--providers.knative.privateEntrypoints=private',
      '--providers.knative.publicEntrypoints=public',
      `--providers.knative.privateService.name=${TRAEFIK_SERVICE.name}`,
      `--providers.knative.privateService.namespace=${TRAEFIK_SERVICE.namespace}`,
      `--providers.knative.publicService.name=${TRAEFIK_SERVICE.name}`,
      `--providers.knative.publicService.namespace=${TRAEFIK_SERVICE.namespace}`,
      `--entrypoints.private.address=${address}:${TRAEFIK_PORTS.private}`,
      `--entrypoints.public.address=${address}:${TRAEFIK_PORTS.public}`,
      '--ping=true',
      `--entrypoints.ping.address=127.0.0.1:${TRAEFIK_PORTS.ping}`,
      '--ping.entrypoint=ping',
    ],
    { stdio: ['ignore', log, log], env: { ...process.env, KUBECONFIG: node.controlPlane.insideKubeconfigPath } },
  );
}

/**
 * Waits for Serving's Deployments to be Available, all within one deadline.
 * @throws Error naming the first that is not, or that Traefik exited (with its log's path).
 */
async function servingReady(kc: KubeConfig, t: { traefik: ChildProcess; log: string }): Promise<void> {
  const apps = kc.makeApiClient(AppsV1Api);
  const deadline = Date.now() + AVAILABLE_TIMEOUT_MS;
  for (const name of ['activator', 'autoscaler', 'controller', 'webhook'])
    await eventually(
      `Knative Serving's ${name} to be Available (kubectl -n ${SERVING_NAMESPACE} describe pods)`,
      async () => {
        if (t.traefik.exitCode !== null || t.traefik.signalCode !== null)
          throw new Error(`Traefik exited (${t.traefik.exitCode ?? t.traefik.signalCode}); its log: ${t.log}`);
        const d = await apps.readNamespacedDeployment({ namespace: SERVING_NAMESPACE, name });
        return d.status?.conditions?.some((c) => c.type === 'Available' && c.status === 'True');
      },
      Math.max(deadline - Date.now(), 1),
      500,
    );
}
