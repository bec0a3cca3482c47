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

const JSON_PATCH = setHeaderOptions('Content-Type', PatchStrategy.JsonPatch);
const SERVICES = { group: 'serving.knative.dev', version: 'v1', plural: 'services' } as const;

/** A Knative Service's revision template (`spec.template`). */
export type RevisionTemplate = NonNullable<NonNullable<KnativeService['spec']>['template']>;

/**
 * Runs `fn` with `service`'s revision template changed by `change` (given a copy of the current
 * one), then puts the previous template back whole. `fn` is given the changed template's
 * revision (its name: the pods' `serving.knative.dev/revision` label), and may put the old
 * template back sooner by calling `restore` (resolves once that revision is Ready; later calls
 * do nothing). Each change waits until Knative has made the new revision and it is Ready.
 * @param timeoutMs bound on each wait for a Ready revision.
 * @throws Error when a revision does not get Ready in time; the old template is put back even then, and when `fn` throws.
 */
export async function withRevisionTemplate<T>(
  kc: KubeConfig,
  { namespace, service, timeoutMs }: ServiceRef & { timeoutMs: number },
  change: (template: RevisionTemplate) => RevisionTemplate,
  fn: (restore: () => Promise<void>, revision: string) => Promise<T>,
): Promise<T> {
  const api = kc.makeApiClient(CustomObjectsApi);
  const ref = { ...SERVICES, namespace, name: service };
  const before = ((await api.getNamespacedCustomObject(ref)) as KnativeService).spec?.template ?? {};
  // Replaced whole (a JSON patch): a merge patch could not take back what the change added.
  const set = async (template: RevisionTemplate) => {
    const body = [{ op: 'replace', path: '/spec/template', value: template }];
    const after = (await api.patchNamespacedCustomObject({ ...ref, body }, JSON_PATCH)) as KnativeService;
    return revisionReady(kc, { namespace, service }, after.metadata?.generation ?? 0, timeoutMs);
  };
  let restored: Promise<void> | undefined;
  // Retried: a failed put-back would leave every later user of the Service with the change.
  const restore = () =>
    (restored ??= eventually(
      `${service}'s template put back`,
      () => set(before).then(() => true),
      timeoutMs,
      1000,
    ).then(() => undefined));
  try {
    const revision = await set(change(structuredClone(before)));
    return await fn(restore, revision);
  } finally {
    await restore();
  }
}

/**
 * {@link withRevisionTemplate} with the template carrying `annotations` (a null value removes one);
 * `fn` is given that template's revision.
 */
export function withRevisionAnnotations<T>(
  kc: KubeConfig,
  ref: ServiceRef & { timeoutMs: number },
  annotations: Readonly<Record<string, string | null>>,
  fn: (revision: string) => Promise<T>,
): Promise<T> {
  const annotate = (t: RevisionTemplate): RevisionTemplate => {
    const had: Record<string, string> = { ...t.metadata?.annotations };
    for (const [k, v] of Object.entries(annotations))
      if (v === null) delete had[k];
      else had[k] = v;
    return { ...t, metadata: { ...t.metadata, annotations: had } };
  };
  return withRevisionTemplate(kc, ref, annotate, (_restore, revision) => fn(revision));
}

/**
 * Waits until the Knative Service has observed `generation` and its latest revision is Ready.
 * @returns that revision's name (a later generation's, should another change come first).
 * @throws Error after `timeoutMs`.
 */
export async function revisionReady(
  kc: KubeConfig,
  { namespace, service }: ServiceRef,
  generation: number,
  timeoutMs: number,
): Promise<string> {
  const api = kc.makeApiClient(CustomObjectsApi);
  let revision = '';
  await eventually(
    `Knative Service ${namespace}/${service} to be Ready at generation ${generation}`,
    async () => {
      const st = ((await api.getNamespacedCustomObject({ ...SERVICES, namespace, name: service })) as KnativeService)
        .status;
      // '' never equals an absent latestCreatedRevisionName.
      revision = st?.latestReadyRevisionName ?? '';
      return (
        (st?.observedGeneration ?? 0) >= generation &&
        st?.latestCreatedRevisionName === revision &&
        st?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')
      );
    },
    timeoutMs,
    500,
  );
  return revision;
}
