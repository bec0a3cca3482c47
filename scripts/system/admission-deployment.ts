/**
 * The entry point's webhook layout on the test node: `manifests/` (admission as a Deployment +
 * Service serving its own TLS) applied as rendered, with the
 * node's image, and the cert-manager stand-in (scripts/certmanager/) issuing the manifests'
 * Certificates and injecting the webhook's `caBundle`. With `clientCaPem`, also
 * `components/admission-client-ca` and the ConfigMap it reads, as an operator adds them; with
 * `networkPolicyCidr`, also `components/admission-network-policy` with that range set, as the
 * component's comment tells an operator to. Only what runs without Knative is
 * applied: the namespace, RBAC, admission, its certificates and the webhook configuration; the
 * other functions' Knative Services and the Eventing objects need Knative and are left out.
 */
import { AppsV1Api, type KubeConfig, type KubernetesObject, type V1ConfigMap } from '@kubernetes/client-node';
import { startCertManager, type CertManager } from '../certmanager/certmanager.ts';
import { CERT_MANAGER_CRDS, installThirdPartyCRDs } from '../controlplane/crds.ts';
import { applyAsRendered } from '../lib/kube.ts';
import { eventually } from '../lib/wait.ts';
import { ENTRY_POINT } from '../tools/kustomize.ts';
import { renderForNode, webhookCAInjected } from './serving.ts';
import { untilWebhookAnswers } from './webhook.ts';

/** The kustomization deployed: the entry point. */
export const ADMISSION_DEPLOYMENT_OVERLAY = ENTRY_POINT;
/** The component that makes admission check its callers' client certificates. */
export const CLIENT_CA_COMPONENT = 'manifests/components/admission-client-ca';
/** The component that lets only the control plane's address range open connections to admission's pods. */
export const NETWORK_POLICY_COMPONENT = 'manifests/components/admission-network-policy';
/** The ConfigMap {@link CLIENT_CA_COMPONENT} mounts (key `ca.crt`), which the operator creates. */
export const CLIENT_CA_CONFIGMAP = 'captf-admission-client-ca';
/** API groups whose objects need Knative (left out here). */
const KNATIVE_GROUPS = /^(serving|eventing|sources|messaging)\.knative\.dev\//;
/** How long the Deployment may take to be Available (image from the node, two pods; generous). */
const AVAILABLE_TIMEOUT_MS = 180_000;

/** The fallback path, deployed. */
export interface AdmissionDeployment {
  /** The objects applied, as rendered. */
  applied: KubernetesObject[];
  certManager: CertManager;
  /** Stops the cert-manager stand-in (the objects go with the node's control plane). */
  stop(): Promise<void>;
}

/**
 * Applies the fallback overlay's objects that run without Knative and waits until the
 * Deployment is Available, the webhook has its `caBundle` and the API server reaches it.
 * @param o.dir where the overlay and the stand-in's scratch files are written.
 * @param o.clientCaPem with it, admission answers only callers with a client certificate of this CA.
 * @param o.networkPolicyCidr with it, only this range may connect to admission's pods (where the
 *   node enforces NetworkPolicy).
 * @throws Error naming what was not ready in time (the stand-in is stopped first).
 */
export async function deployAdmissionDeployment(
  kc: KubeConfig,
  o: { dir: string; log: (line: string) => void; clientCaPem?: string; networkPolicyCidr?: string },
): Promise<AdmissionDeployment> {
  await installThirdPartyCRDs(kc, CERT_MANAGER_CRDS);
  const rendered = await renderForNode(ADMISSION_DEPLOYMENT_OVERLAY, {
    dir: o.dir,
    name: 'admission-deployment-overlay',
    components: [
      ...(o.clientCaPem ? [CLIENT_CA_COMPONENT] : []),
      ...(o.networkPolicyCidr ? [NETWORK_POLICY_COMPONENT] : []),
    ],
  });
  if (o.networkPolicyCidr) setPolicyRange(rendered, o.networkPolicyCidr);
  const runnable = rendered.filter((x) => !KNATIVE_GROUPS.test(x.apiVersion ?? ''));
  // After the namespace, before the Deployment whose pods mount it.
  const first = runnable.findIndex((x) => x.kind !== 'Namespace');
  const applied = o.clientCaPem
    ? [...runnable.slice(0, first), clientCaConfigMap(o.clientCaPem), ...runnable.slice(first)]
    : runnable;
  const certManager = startCertManager(kc, { dir: `${o.dir}/cert-manager`, log: o.log });
  try {
    for (const x of applied)
      await eventually(`applying ${x.kind} ${x.metadata?.name}`, () => applyAsRendered(kc, x, 'kubectl'), 30_000);
    const apps = kc.makeApiClient(AppsV1Api);
    for (const d of applied.filter((x) => x.kind === 'Deployment')) {
      const { name, namespace } = d.metadata as { name: string; namespace: string };
      await eventually(
        `Deployment ${namespace}/${name} to be Available (kubectl -n ${namespace} describe pods)`,
        async () =>
          (await apps.readNamespacedDeployment({ namespace, name })).status?.conditions?.some(
            (c) => c.type === 'Available' && c.status === 'True',
          ),
        AVAILABLE_TIMEOUT_MS,
        500,
      );
    }
    await webhookCAInjected(kc, applied);
    await untilWebhookAnswers(kc, AVAILABLE_TIMEOUT_MS);
  } catch (err) {
    await certManager.stop();
    throw err;
  }
  return { applied, certManager, stop: () => certManager.stop() };
}

/**
 * Sets the range of {@link NETWORK_POLICY_COMPONENT}'s one `ipBlock`, the value the component's
 * comment has an operator patch. @throws Error when the rendered objects hold no such policy.
 */
function setPolicyRange(rendered: KubernetesObject[], cidr: string): void {
  // As rendered (YAML), so `from`, where client-node's model says `_from`.
  const policy = rendered.find((x) => x.kind === 'NetworkPolicy') as
    { spec?: { ingress?: { from?: { ipBlock?: { cidr: string } }[] }[] } } | undefined;
  const block = policy?.spec?.ingress?.[0]?.from?.[0]?.ipBlock;
  if (!block) throw new Error(`${NETWORK_POLICY_COMPONENT} rendered no NetworkPolicy with an ipBlock`);
  block.cidr = cidr;
}

/** The ConfigMap {@link CLIENT_CA_COMPONENT} reads, holding `pem` as `ca.crt`. */
function clientCaConfigMap(pem: string): V1ConfigMap & KubernetesObject {
  return {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: CLIENT_CA_CONFIGMAP, namespace: 'captf-system' },
    data: { 'ca.crt': pem },
  };
}
