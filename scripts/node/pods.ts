/**
 * A function as the pod Knative Serving would run for the first revision of its rendered
 * Knative Service, without the queue-proxy sidecar: the Service's pod spec as shipped
 * (ServiceAccount, container args, env, probes, resources, security context), plus what
 * Knative adds to the user container: `PORT` (its port), `K_SERVICE`, `K_CONFIGURATION`,
 * `K_REVISION`, the probes' port, `terminationGracePeriodSeconds` from `timeoutSeconds`,
 * `enableServiceLinks: false` unless the spec sets it, and the serving labels. The image is the
 * one imported into the node (Knative would resolve the tag to a digest from a registry; there
 * is none here).
 *
 * What differs without queue-proxy: Knative moves the readiness probe to queue-proxy and gives
 * the user container a `preStop` hook that waits for queue-proxy to drain (at least 30 s of the
 * same grace period), so on Serving TERM reaches the function later than here; these pods show
 * the function's own drain, not Knative's drain sequence.
 *
 * Below the pure part, the steps every user of such pods takes: the manifests' namespace,
 * ServiceAccounts and RBAC applied, and a pod created and waited for until Ready (events are
 * signed for its sender check by ../system/senders.ts).
 */
import {
  CoreV1Api,
  type KubeConfig,
  type KubernetesObject,
  type V1Container,
  type V1Pod,
  type V1PodSpec,
  type V1Probe,
} from '@kubernetes/client-node';
import { applyAsRendered } from '../lib/kube.ts';
import { eventually } from '../lib/wait.ts';
import { knativeService, type FunctionName } from '../system/functions.ts';

/** The port Knative gives a container that names none. */
const DEFAULT_PORT = 8080;

/** The parts of a Knative Service's revision template this builds on. */
interface RevisionTemplate {
  metadata?: { labels?: Record<string, string>; annotations?: Record<string, string> };
  spec?: V1PodSpec & { timeoutSeconds?: number; containerConcurrency?: number };
}

/** A probe with its port filled in, as Knative's defaulting does for a single container. */
const withPort = (p: V1Probe | undefined, port: number): V1Probe | undefined =>
  p?.httpGet ? { ...p, httpGet: { ...p.httpGet, port: p.httpGet.port ?? port } } : p;

/** Function `fn`'s Knative Service name and revision template. @throws Error when it has none. */
function revisionTemplate(
  rendered: readonly KubernetesObject[],
  fn: FunctionName,
): { service: string; namespace: string; template: RevisionTemplate & { spec: V1PodSpec }; container: V1Container } {
  type Service = { metadata: { name: string; namespace?: string }; spec: { template: RevisionTemplate } };
  const svc = knativeService(rendered, fn) as Service | undefined;
  const container = svc?.spec.template.spec?.containers[0];
  if (!svc || !container) throw new Error(`the rendered manifests hold no Knative Service for ${fn}`);
  return {
    service: svc.metadata.name,
    namespace: svc.metadata.namespace ?? 'default',
    template: svc.spec.template as RevisionTemplate & { spec: V1PodSpec },
    container,
  };
}

/** The user container as Knative runs it: the image given, its port in `PORT` and the probes, the K_ variables. */
function userContainer(container: V1Container, o: { image: string; service: string; revision: string }): V1Container {
  const port = container.ports?.[0]?.containerPort ?? DEFAULT_PORT;
  return {
    ...container,
    image: o.image,
    imagePullPolicy: 'Never',
    env: [
      ...(container.env ?? []),
      { name: 'PORT', value: String(port) },
      { name: 'K_REVISION', value: o.revision },
      { name: 'K_CONFIGURATION', value: o.service },
      { name: 'K_SERVICE', value: o.service },
    ],
    readinessProbe: withPort(container.readinessProbe, port),
    livenessProbe: withPort(container.livenessProbe, port),
  };
}

/**
 * Function `fn`'s first revision as a plain pod (named `<service>-00001`).
 * @param o.image the image reference the node has imported (pulled `Never`).
 * @throws Error when the rendered manifests hold no Knative Service for `fn`.
 */
export function functionPod(rendered: readonly KubernetesObject[], fn: FunctionName, o: { image: string }): V1Pod {
  const { service, namespace, template, container } = revisionTemplate(rendered, fn);
  const revision = `${service}-00001`;
  // Knative's own fields, not a pod's.
  const { timeoutSeconds, containerConcurrency: _concurrency, ...podSpec } = template.spec;
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name: revision,
      namespace,
      labels: {
        ...template.metadata?.labels,
        'serving.knative.dev/service': service,
        'serving.knative.dev/configuration': service,
        'serving.knative.dev/revision': revision,
      },
      annotations: template.metadata?.annotations ?? {},
    },
    spec: {
      ...podSpec,
      containers: [userContainer(container, { image: o.image, service, revision })],
      enableServiceLinks: podSpec.enableServiceLinks ?? false,
      ...(timeoutSeconds !== undefined ? { terminationGracePeriodSeconds: timeoutSeconds } : {}),
    },
  };
}

/** The kinds of the rendered manifests a function's pod needs first: its namespace, ServiceAccount and RBAC. */
const RBAC_KINDS = new Set(['Namespace', 'ServiceAccount', 'ClusterRole', 'ClusterRoleBinding', 'Role', 'RoleBinding']);

/**
 * Applies the rendered manifests' namespace, ServiceAccounts and RBAC (server-side, as
 * `captf-node`), so the functions' pods run with exactly the shipped permissions.
 * @throws Error naming the object the API server refused.
 */
export async function applyFunctionRbac(kc: KubeConfig, rendered: readonly KubernetesObject[]): Promise<void> {
  for (const o of rendered.filter((x) => RBAC_KINDS.has(x.kind ?? ''))) await applyAsRendered(kc, o, 'captf-node');
}

/**
 * Creates `pod` and waits until it is Ready (polled every `intervalMs`).
 * @returns the pod as read once Ready (with its IP and container IDs).
 * @throws Error when it is refused, or not Ready within `timeoutMs`.
 */
export async function runPod(kc: KubeConfig, pod: V1Pod, o: { timeoutMs?: number; intervalMs?: number } = {}) {
  const core = kc.makeApiClient(CoreV1Api);
  const namespace = pod.metadata!.namespace!;
  const name = pod.metadata!.name!;
  await core.createNamespacedPod({ namespace, body: pod });
  return eventually(
    `pod ${namespace}/${name} to be Ready`,
    async () => {
      const p = await core.readNamespacedPod({ namespace, name });
      return p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') && p;
    },
    o.timeoutMs ?? 180_000,
    o.intervalMs ?? 200,
  );
}
