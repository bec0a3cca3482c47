/**
 * `npm start`'s view of the mirrors: a watch of the Secrets labelled as mirrors that prints a
 * line for each created, updated or deleted one (./print.ts describeMirrorChange).
 */
import {
  CoreV1Api,
  makeInformer,
  type KubeConfig,
  type KubernetesListObject,
  type V1Secret,
} from '@kubernetes/client-node';
import { describeError } from '../../functions/lib/kube.ts';
import { ANNOTATION_IDENTITY, ANNOTATION_SOURCE_HASH, LABEL_MIRRORED } from '../../functions/lib/mirror.ts';
import { describeMirrorChange, type MirrorView, type Printed } from './print.ts';

/** What the printer needs of a mirror Secret seen by the watch. */
function mirrorView(s: V1Secret): MirrorView {
  const meta = s.metadata ?? {};
  const annotations = meta.annotations ?? {};
  return {
    namespace: meta.namespace ?? '',
    name: meta.name ?? '',
    identity: annotations[ANNOTATION_IDENTITY] ?? '?',
    owners: (meta.ownerReferences ?? []).map((o) => `${o.kind}/${o.name}`).sort(),
    hash: annotations[ANNOTATION_SOURCE_HASH] ?? '',
  };
}

/**
 * Watches Secrets labelled as mirrors and prints created/updated/deleted lines. Only
 * metadata is kept: each object's `data` is dropped as soon as it arrives.
 * @returns a function that stops the watch.
 */
export async function watchMirrors(
  kc: KubeConfig,
  emit: (p: Printed | undefined) => void,
): Promise<() => Promise<void>> {
  const core = kc.makeApiClient(CoreV1Api);
  const selector = `${LABEL_MIRRORED}=true`;
  const seen = new Map<string, MirrorView>();
  const strip = (s: V1Secret): V1Secret => ({ metadata: s.metadata ?? {} });
  const informer = makeInformer<V1Secret>(
    kc,
    '/api/v1/secrets',
    async () => {
      const list = await core.listSecretForAllNamespaces({ labelSelector: selector });
      return { ...list, items: list.items.map(strip) } as KubernetesListObject<V1Secret>;
    },
    selector,
  );
  let listed = false;
  let stopped = false;
  const on = (verb: 'add' | 'update' | 'delete') => (s: V1Secret) => {
    const view = mirrorView(s);
    delete (s as { data?: unknown }).data;
    const key = `${view.namespace}/${view.name}`;
    const before = seen.get(key);
    if (verb === 'delete') seen.delete(key);
    else seen.set(key, view);
    if (listed) emit(describeMirrorChange(verb, view, before));
  };
  for (const verb of ['add', 'update', 'delete'] as const) informer.on(verb, on(verb));
  informer.on('error', (err: unknown) => {
    if (stopped) return;
    emit({ debug: true, component: 'mirror', subject: '', text: `watch failed (${describeError(err)}); restarting` });
    setTimeout(() => !stopped && informer.start().catch(() => undefined), 1000).unref();
  });
  await informer.start();
  listed = true;
  return async () => {
    stopped = true;
    await informer.stop();
  };
}
