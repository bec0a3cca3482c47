/**
 * The admission webhook's registration (SPEC §10) for a function running on this machine:
 * the ValidatingWebhookConfiguration `npm start` registers, and the tests register with an
 * object selector so that only their own identities are sent to their webhook.
 */
import { AdmissionregistrationV1Api, type KubeConfig } from '@kubernetes/client-node';
import { IDENTITY_RESOURCE } from '../../functions/lib/api.ts';
import { isNotFound } from '../../functions/lib/kube.ts';

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
