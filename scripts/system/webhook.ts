/**
 * The admission webhook's registration (SPEC §10) for a function running on this machine:
 * the ValidatingWebhookConfiguration `npm start` registers, and the tests register with an
 * object selector so that only their own identities are sent to their webhook.
 */
import { AdmissionregistrationV1Api, CustomObjectsApi, type KubeConfig } from '@kubernetes/client-node';
import { IDENTITY_RESOURCE } from '../../functions/lib/api.ts';
import { isNotFound } from '../../functions/lib/kube.ts';
import { eventually } from '../lib/wait.ts';

/** Name of the ValidatingWebhookConfiguration registered for the local admission function. */
export const WEBHOOK_CONFIGURATION = 'captf-credentials-local';

/** Options of {@link webhookConfiguration}. */
export interface WebhookConfigurationOptions {
  /** Base URL of the admission function (`/validate` is appended). */
  url: string;
  /** PEM of the CA that signed its serving certificate. */
  caBundlePem: string;
  /** Name of the configuration; default {@link WEBHOOK_CONFIGURATION}. */
  name?: string;
  /** Only identities with these labels are sent to the webhook (a test's own). */
  matchLabels?: Record<string, string>;
}

/**
 * The ValidatingWebhookConfiguration of SPEC §10 for a webhook at `opts.url`: CREATE, UPDATE
 * and DELETE of identities only, failurePolicy Fail, sideEffects None, AdmissionReview v1.
 */
export function webhookConfiguration(opts: WebhookConfigurationOptions) {
  return {
    apiVersion: 'admissionregistration.k8s.io/v1',
    kind: 'ValidatingWebhookConfiguration',
    metadata: {
      name: opts.name ?? WEBHOOK_CONFIGURATION,
      labels: { 'app.kubernetes.io/part-of': 'captf-credentials', 'app.kubernetes.io/managed-by': 'captf-local' },
    },
    webhooks: [
      {
        name: 'identities.captf-credentials.local',
        clientConfig: { url: `${opts.url}/validate`, caBundle: Buffer.from(opts.caBundlePem).toString('base64') },
        rules: [
          {
            apiGroups: [IDENTITY_RESOURCE.group],
            apiVersions: [IDENTITY_RESOURCE.version],
            operations: ['CREATE', 'UPDATE', 'DELETE'],
            resources: [IDENTITY_RESOURCE.plural],
            scope: 'Cluster',
          },
        ],
        ...(opts.matchLabels ? { objectSelector: { matchLabels: opts.matchLabels } } : {}),
        failurePolicy: 'Fail',
        sideEffects: 'None',
        admissionReviewVersions: ['v1'],
        timeoutSeconds: 10,
      },
    ],
  };
}

/**
 * Registers {@link webhookConfiguration} (replacing one of the same name).
 * @returns a function that deletes it again (errors ignored).
 */
export async function registerWebhook(kc: KubeConfig, opts: WebhookConfigurationOptions): Promise<() => Promise<void>> {
  const adm = kc.makeApiClient(AdmissionregistrationV1Api);
  const body = webhookConfiguration(opts);
  const name = body.metadata.name;
  await adm.deleteValidatingWebhookConfiguration({ name }).catch((e: unknown) => {
    if (!isNotFound(e)) throw e;
  });
  await adm.createValidatingWebhookConfiguration({ body });
  return async () => {
    await adm.deleteValidatingWebhookConfiguration({ name }).catch(() => undefined);
  };
}

/**
 * Waits until the API server gets an answer from the identity webhook: an identity create as
 * `kc`'s user (the admin), a dry run (reviewed, nothing stored), until it is admitted. Between a
 * webhook's pods being ready and the API server reaching them lie endpoints and kube-proxy's
 * rules (or, through Knative, the gateway's routes); a review sent before fails closed.
 * @throws Error with the last refusal when none is admitted within `timeoutMs`.
 */
export async function untilWebhookAnswers(kc: KubeConfig, timeoutMs: number): Promise<void> {
  const api = kc.makeApiClient(CustomObjectsApi);
  const { group, version, plural } = IDENTITY_RESOURCE;
  const body = {
    apiVersion: `${group}/${version}`,
    kind: 'TerraformClusterIdentity',
    metadata: { name: 'captf-webhook-probe' },
    spec: {
      secretRef: { namespace: 'captf-system', name: 'captf-webhook-probe' },
      allowedNamespaces: { list: ['captf-system'] },
    },
  };
  await eventually(
    'the API server to reach the identity webhook (a dry-run identity create admitted)',
    () => api.createClusterCustomObject({ group, version, plural, body, dryRun: 'All' }).then(() => true),
    timeoutMs,
    500,
  );
}
