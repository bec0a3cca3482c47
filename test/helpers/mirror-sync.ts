/**
 * Fixtures for mirror-sync tests: identities, consumers and source Secrets in the test
 * control plane, and a Knative-like delivery that retries 5xx answers.
 */
import type { CloudEvent } from 'cloudevents';
import { AdmissionregistrationV1Api, type V1Secret } from '@kubernetes/client-node';
import {
  API_VERSION,
  GROUP,
  IDENTITY_KIND,
  IDENTITY_PLURAL,
  VERSION,
  type AllowedNamespaces,
  type Consumer,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import { ignoreNotFound, isNotFound, retryOnConflict, type Clients } from '../../functions/lib/kube.ts';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { apiServerEvent, postEvents } from './events.ts';

/** Plural of a shipped consumer kind. */
export const PLURAL: Record<string, string> = {
  TerraformCluster: 'terraformclusters',
  TerraformMachine: 'terraformmachines',
};

/** The custom-object API's address of the identities. */
const IDENTITIES = { group: GROUP, version: VERSION, plural: IDENTITY_PLURAL };

/** The custom-object API's address of the consumers of `kind` in `namespace`. */
const consumers = (namespace: string, kind: string) => ({
  group: GROUP,
  version: VERSION,
  namespace,
  plural: PLURAL[kind]!,
});

/** Creates (or replaces the spec of) an identity; returns it. */
export async function putIdentity(
  a: Clients,
  name: string,
  secretRef: { name: string; namespace: string },
  allowedNamespaces?: AllowedNamespaces | null,
  labels: Record<string, string> = {},
): Promise<TerraformClusterIdentity> {
  const body = {
    apiVersion: API_VERSION,
    kind: IDENTITY_KIND,
    metadata: { name, labels },
    spec: { secretRef, ...(allowedNamespaces === undefined ? {} : { allowedNamespaces }) },
  };
  try {
    // A function may write the identity's status between the read and the write: read again.
    return await retryOnConflict(() => replaceIdentity(a, name, body));
  } catch (err) {
    if (!isNotFound(err)) throw err;
    return (await a.custom.createClusterCustomObject({ ...IDENTITIES, body })) as TerraformClusterIdentity;
  }
}

/** Replaces an identity's spec and labels at the resourceVersion just read. @throws 404 when there is none. */
async function replaceIdentity(
  a: Clients,
  name: string,
  body: { metadata: Record<string, unknown> },
): Promise<TerraformClusterIdentity> {
  const cur = (await a.custom.getClusterCustomObject({ ...IDENTITIES, name })) as TerraformClusterIdentity;
  return (await a.custom.replaceClusterCustomObject({
    ...IDENTITIES,
    name,
    body: { ...body, metadata: { ...body.metadata, resourceVersion: cur.metadata.resourceVersion } },
  })) as TerraformClusterIdentity;
}

/** Deletes an identity; ignores 404. */
export async function deleteIdentity(a: Clients, name: string): Promise<void> {
  await ignoreNotFound(a.custom.deleteClusterCustomObject({ ...IDENTITIES, name }));
}

/** Creates a consumer of `kind` in `namespace` referencing `identity` (or none). */
export async function createConsumer(
  a: Clients,
  namespace: string,
  name: string,
  identity: string | undefined,
  kind = 'TerraformCluster',
  extra: { finalizers?: string[] } = {},
): Promise<Consumer> {
  return (await a.custom.createNamespacedCustomObject({
    ...consumers(namespace, kind),
    body: {
      apiVersion: API_VERSION,
      kind,
      metadata: { name, ...(extra.finalizers ? { finalizers: extra.finalizers } : {}) },
      spec: identity ? { identityRef: { name: identity } } : {},
    },
  })) as Consumer;
}

/** Reads a consumer (with apiVersion/kind). */
export async function getConsumer(
  a: Clients,
  namespace: string,
  name: string,
  kind = 'TerraformCluster',
): Promise<Consumer> {
  return (await a.custom.getNamespacedCustomObject({ ...consumers(namespace, kind), name })) as Consumer;
}

/** Deletes a consumer; ignores 404. */
export async function deleteConsumer(
  a: Clients,
  namespace: string,
  name: string,
  kind = 'TerraformCluster',
): Promise<void> {
  await ignoreNotFound(a.custom.deleteNamespacedCustomObject({ ...consumers(namespace, kind), name }));
}

/** The mirror of `identity` in `namespace`, or undefined. */
export const getMirror = (a: Clients, namespace: string, identity: string): Promise<V1Secret | undefined> =>
  ignoreNotFound(a.core.readNamespacedSecret({ name: mirrorName(identity), namespace }));

/** A condition of a consumer by type. */
export function conditionOf(
  c: Consumer,
  type: string,
): { status: string; reason: string; message: string } | undefined {
  return c.status?.conditions?.find((x) => x.type === type);
}

/**
 * Delivers events to `url` like a Knative Trigger with a retry policy: re-sends on 5xx up
 * to `retries` times with a short backoff; returns the last answer.
 */
export async function deliver(
  url: string,
  events: CloudEvent<unknown> | CloudEvent<unknown>[],
  opts: { retries?: number; mode?: 'binary' | 'structured' | 'batch' } = {},
): Promise<{ status: number; body: unknown; text: string }> {
  let last = await postEvents(url, events, opts.mode);
  for (let i = 0; i < (opts.retries ?? 5) && last.status >= 500; i++) {
    await new Promise((r) => setTimeout(r, 100 * (i + 1)));
    last = await postEvents(url, events, opts.mode);
  }
  return last;
}

/** An ApiServerSource event about a consumer object. */
export const consumerEvent = (
  c: Consumer,
  mode: 'resource' | 'ref' = 'ref',
  verb: 'add' | 'update' | 'delete' = 'update',
) =>
  apiServerEvent(
    { ...(c as object), apiVersion: API_VERSION, kind: c.kind ?? 'TerraformCluster', metadata: c.metadata as never },
    mode,
    verb,
    PLURAL[c.kind ?? 'TerraformCluster']!,
  );

/**
 * A ValidatingAdmissionPolicy (and its binding) that refuses `operations` on Secrets in the
 * namespaces labelled `<label>=true`, with a careless message that may echo the Secret's data.
 * @param policy.reason the Status reason it answers with (default Invalid: 422; Forbidden: 403).
 * @returns a function that deletes both.
 */
export async function refuseSecrets(
  a: Clients,
  policy: { label: string; operations: string[]; messageExpression: string; reason?: string },
): Promise<() => Promise<void>> {
  const vap = a.kc.makeApiClient(AdmissionregistrationV1Api);
  const name = policy.label;
  await vap.createValidatingAdmissionPolicy({
    body: {
      metadata: { name },
      spec: {
        failurePolicy: 'Fail',
        matchConstraints: {
          resourceRules: [
            { apiGroups: [''], apiVersions: ['v1'], operations: policy.operations, resources: ['secrets'] },
          ],
        },
        validations: [
          {
            expression: 'false',
            messageExpression: policy.messageExpression,
            ...(policy.reason ? { reason: policy.reason } : {}),
          },
        ],
      },
    },
  });
  await vap.createValidatingAdmissionPolicyBinding({
    body: {
      metadata: { name },
      spec: {
        policyName: name,
        validationActions: ['Deny'],
        matchResources: { namespaceSelector: { matchLabels: { [policy.label]: 'true' } } },
      },
    },
  });
  return async () => {
    await vap.deleteValidatingAdmissionPolicyBinding({ name }).catch(() => undefined);
    await vap.deleteValidatingAdmissionPolicy({ name }).catch(() => undefined);
  };
}
