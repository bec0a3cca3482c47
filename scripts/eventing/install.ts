/**
 * Knative Eventing's own installation on the test node, read from the pinned module's `config/`
 * folders as Serving's is (scripts/serving/manifests.ts): the core (controller, webhook and the
 * PingSource adapter, with their roles, CRDs and ConfigMaps), the MT channel broker (its
 * controller, ingress and filter) and the InMemoryChannel (controller and dispatcher), each
 * program a pod from an image built from the same module (scripts/image/images.ts). With it the
 * node reconciles whatever is applied, as a cluster does: `kubectl apply -k manifests/` needs
 * nothing else. What is left out and what is changed is listed here and nowhere else;
 * {@link eventingObjects} is pure.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  AppsV1Api,
  KubeConfig,
  loadAllYaml,
  type KubernetesObject,
  type V1CustomResourceDefinition,
} from '@kubernetes/client-node';
import { applyCRDs, downloadModule } from '../controlplane/crds.ts';
import { buildImage } from '../image/build.ts';
import { IMAGES } from '../image/images.ts';
import { serverSideApply } from '../lib/kube.ts';
import { eventually } from '../lib/wait.ts';
import type { TestNode } from '../node/node.ts';
import { REPO_ROOT } from '../tools/build.ts';
import { withObservabilityConfig } from '../observability/stack.ts';
import { EVENTING_PROGRAMS } from '../tools/registry.ts';
import { LOCAL_FEATURES, SYSTEM_NAMESPACE } from './dataplane.ts';

/** Field manager of the installation. */
const MANAGER = 'captf-eventing-install';

/** The wrapper module that pins Eventing for the node's programs. */
const KNATIVE_WRAPPER = join(REPO_ROOT, 'scripts', 'tools', 'go', 'knative');

/** `cmd/<path>` of upstream's `ko://knative.dev/eventing/cmd/<path>` references → the image the node imports. */
const IMAGE_OF_CMD: Readonly<Record<string, keyof typeof IMAGES>> = {
  ...(Object.fromEntries(Object.entries(EVENTING_PROGRAMS).map(([image, cmd]) => [cmd, image])) as Record<
    string,
    keyof typeof IMAGES
  >),
  apiserver_receive_adapter: 'apiserver-receive-adapter',
};

/**
 * Programs upstream's controller names in its environment for features the manifests do not
 * use (EventTransform and IntegrationSink's auth proxy): not built, so a name that says so.
 */
const NOT_BUILT = new Set(['auth_proxy']);

/**
 * The flags the node's installation sets beyond {@link LOCAL_FEATURES}: sender identity
 * (`authentication-oidc`, SPEC §12), which the shipped functions need to take any event.
 * Eventing's own controllers then make each Trigger's and source's OIDC ServiceAccount, its
 * data plane signs every delivery and its Broker ingress verifies them. The process world's
 * stand-in controllers make no such accounts, so its data plane keeps the flag off.
 */
export const NODE_FEATURES: Readonly<Record<string, string>> = { 'authentication-oidc': 'enabled' };

/** The Deployments of the installation (in `knative-eventing`), each waited for until Available. */
export const EVENTING_DEPLOYMENTS = [
  'eventing-controller',
  'eventing-webhook',
  'pingsource-mt-adapter',
  'mt-broker-controller',
  'mt-broker-ingress',
  'mt-broker-filter',
  'imc-controller',
  'imc-dispatcher',
] as const;

/**
 * The files installed, in order (namespace, accounts and roles before the CRDs, ConfigMaps
 * before the webhooks that validate them, the Deployments last), with the two image
 * ConfigMaps upstream's release adds from `third_party/` (its controller does not start without them). Left out: `core-tls/`
 * (transport encryption stays off, upstream's default), the JobSink and RequestReply
 * Deployments (kinds the manifests do not use), the `*hpa.yaml` autoscalers (no metrics server).
 */
function eventingFiles(config: string): string[] {
  const yaml = (sub: string, skip: (f: string) => boolean = () => false) =>
    readdirSync(join(config, sub))
      .filter((f) => f.endsWith('.yaml') && !skip(f))
      .sort()
      .map((f) => join(config, sub, f));
  const noHpa = (f: string) => f.includes('hpa');
  return [
    ...yaml('core'),
    ...yaml('core/roles'),
    ...yaml('core/resources'),
    ...yaml('core/configmaps'),
    // The controller's environment reads two image ConfigMaps kept outside config/ upstream.
    ...yaml('../third_party/eventing-integrations-latest'),
    ...yaml('core/webhooks'),
    ...yaml('core/deployments', (f) => noHpa(f) || f === 'job-sink.yaml' || f === 'request-reply.yaml'),
    ...yaml('brokers/mt-channel-broker/roles'),
    ...yaml('brokers/mt-channel-broker/deployments', noHpa),
    ...yaml('channels/in-memory-channel'),
    ...yaml('channels/in-memory-channel/roles'),
    ...yaml('channels/in-memory-channel/resources'),
    ...yaml('channels/in-memory-channel/configmaps'),
    ...yaml('channels/in-memory-channel/webhooks'),
    ...yaml('channels/in-memory-channel/deployments'),
  ];
}

/**
 * Eventing's objects with the changes an installation on the node needs: each `ko://` reference
 * (Deployment images, and the images the controllers pass on in their environment) replaced by
 * the image the node imported (`images`: upstream `cmd/` path → reference), the auth proxy's by
 * a name that says it is not built; `config-features` with {@link LOCAL_FEATURES} and
 * {@link NODE_FEATURES} merged (the flags a cluster operator sets for the manifests). Pure.
 * @throws Error naming a `ko://` reference with no image.
 */
export function eventingObjects(
  docs: readonly KubernetesObject[],
  images: Readonly<Record<string, string>>,
): KubernetesObject[] {
  const text = JSON.stringify(docs).replace(/ko:\/\/knative\.dev\/eventing\/cmd\/([a-z_/]+)/g, (ref, cmd: string) => {
    if (NOT_BUILT.has(cmd)) return `ko.local/knative-eventing-${cmd.replace(/_/g, '-')}:not-built`;
    const image = images[cmd];
    if (!image) throw new Error(`no image for ${ref}`);
    return image;
  });
  return (JSON.parse(text) as (KubernetesObject & { data?: Record<string, string> })[]).map((o) =>
    o.kind === 'ConfigMap' && o.metadata?.name === 'config-features'
      ? { ...o, data: { ...o.data, ...LOCAL_FEATURES, ...NODE_FEATURES } }
      : o,
  );
}

/**
 * Reads Eventing's installation from the pinned module (downloaded when missing) with the
 * node's images.
 * @returns the objects in install order, and where they came from.
 * @throws Error when `go mod download` fails or a file is missing.
 */
export async function loadEventingObjects(): Promise<{ objects: KubernetesObject[]; source: string }> {
  const eventing = await downloadModule('knative.dev/eventing', KNATIVE_WRAPPER);
  const docs = eventingFiles(join(eventing.Dir, 'config')).flatMap((f) =>
    (loadAllYaml(readFileSync(f, 'utf8')) as (KubernetesObject | null)[]).filter(
      (d): d is KubernetesObject => !!d?.kind,
    ),
  );
  const images = Object.fromEntries(Object.entries(IMAGE_OF_CMD).map(([cmd, image]) => [cmd, IMAGES[image].ref]));
  return { objects: eventingObjects(docs, images), source: `knative.dev/eventing@${eventing.Version}/config` };
}

/** How long Eventing's pods may take to be Available (images, eight pods on two cores; generous). */
const AVAILABLE_TIMEOUT_MS = 300_000;

/**
 * Installs Knative Eventing on `node`: builds and imports its images when missing, applies its
 * objects (with `observability` merged into its `config-observability`, read as its components
 * start) and waits until every Deployment of {@link EVENTING_DEPLOYMENTS} is Available.
 * @throws Error naming the first Deployment that is not.
 */
export async function installEventing(
  node: TestNode,
  log: (line: string) => void,
  observability?: Readonly<Record<string, string>>,
): Promise<void> {
  log('[eventing] programs and images (built when missing)');
  for (const image of new Set(Object.values(IMAGE_OF_CMD))) {
    const built = await buildImage(image, { log });
    await node.containerd.ctr(['images', 'import', built.path]);
  }
  const loaded = await loadEventingObjects();
  const { source } = loaded;
  const objects = withObservabilityConfig(loaded.objects, observability);
  const kc = new KubeConfig();
  kc.loadFromFile(node.controlPlane.kubeconfigPath);
  log(`[eventing] applying ${objects.length} objects from ${source}`);
  await applyCRDs(kc, objects.filter((o) => o.kind === 'CustomResourceDefinition') as V1CustomResourceDefinition[]);
  for (const o of objects) if (o.kind !== 'CustomResourceDefinition') await serverSideApply(kc, o, MANAGER);
  const apps = kc.makeApiClient(AppsV1Api);
  const deadline = Date.now() + AVAILABLE_TIMEOUT_MS;
  for (const name of EVENTING_DEPLOYMENTS)
    await eventually(
      `Knative Eventing's ${name} to be Available (kubectl -n ${SYSTEM_NAMESPACE} describe pods)`,
      async () => {
        const d = await apps.readNamespacedDeployment({ namespace: SYSTEM_NAMESPACE, name });
        return d.status?.conditions?.some((c) => c.type === 'Available' && c.status === 'True');
      },
      Math.max(deadline - Date.now(), 1),
      500,
    );
  log('[eventing] Knative Eventing is Available');
}
