/**
 * Changing a Knative Service's revision template for a while, as the bench and the tests do to
 * compare autoscaling settings (pinned to one pod, a low target that forces scale-out): each
 * change makes a new revision, and nothing is measured before it is Ready.
 */
import { CustomObjectsApi, PatchStrategy, setHeaderOptions, type KubeConfig } from '@kubernetes/client-node';
import type { IService as KnativeService } from '@kubernetes-models/knative/serving.knative.dev/v1/Service';
import { eventually } from '../lib/wait.ts';

/** Which Knative Service. */
export interface ServiceRef {
  namespace: string;
  service: string;
}

const MERGE_PATCH = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
const SERVICES = { group: 'serving.knative.dev', version: 'v1', plural: 'services' } as const;

/**
 * Runs `fn` with `service`'s revision template carrying `annotations` (a null value removes one),
 * then puts the previous values back. Each change waits until Knative has made the new revision
 * and it is Ready.
 * @param timeoutMs bound on each wait for a Ready revision.
 * @throws Error when a revision does not get Ready in time; the old values are put back even when `fn` throws.
 */
export async function withRevisionAnnotations<T>(
  kc: KubeConfig,
  { namespace, service, timeoutMs }: ServiceRef & { timeoutMs: number },
  annotations: Readonly<Record<string, string | null>>,
  fn: () => Promise<T>,
): Promise<T> {
  const api = kc.makeApiClient(CustomObjectsApi);
  const ref = { ...SERVICES, namespace, name: service };
  const before = (await api.getNamespacedCustomObject(ref)) as KnativeService;
  const had = before.spec?.template?.metadata?.annotations ?? {};
  const was = Object.fromEntries(Object.keys(annotations).map((k) => [k, had[k] ?? null]));
  const set = async (values: Record<string, string | null>) => {
    const body = { spec: { template: { metadata: { annotations: values } } } };
    const after = (await api.patchNamespacedCustomObject({ ...ref, body }, MERGE_PATCH)) as KnativeService;
    await revisionReady(kc, { namespace, service }, after.metadata?.generation ?? 0, timeoutMs);
  };
  await set({ ...annotations });
  try {
    return await fn();
  } finally {
    await set(was);
  }
}

/**
 * Waits until the Knative Service has observed `generation` and its latest revision is Ready.
 * @throws Error after `timeoutMs`.
 */
export function revisionReady(
  kc: KubeConfig,
  { namespace, service }: ServiceRef,
  generation: number,
  timeoutMs: number,
): Promise<unknown> {
  const api = kc.makeApiClient(CustomObjectsApi);
  return eventually(
    `Knative Service ${namespace}/${service} to be Ready at generation ${generation}`,
    async () => {
      const st = ((await api.getNamespacedCustomObject({ ...SERVICES, namespace, name: service })) as KnativeService)
        .status;
      return (
        (st?.observedGeneration ?? 0) >= generation &&
        st?.latestCreatedRevisionName === st?.latestReadyRevisionName &&
        st?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')
      );
    },
    timeoutMs,
    500,
  );
}
