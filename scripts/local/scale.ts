/**
 * `npm start -- --serving`'s view of Knative's autoscaling: a watch of the Knative Services'
 * pods in the manifests' namespace that prints a line each time a function's number of ready
 * pods changes: a cold start (0 → 1, with how long its pod took from creation to ready), a
 * scale-out, a scale-in, and a scale to zero.
 */
import { CoreV1Api, makeInformer, type KubeConfig, type V1Pod } from '@kubernetes/client-node';
import { describeError } from '../../functions/lib/kube.ts';
import type { Printed } from './print.ts';

/** The label Knative puts on a Knative Service's pods. */
export const SERVICE_LABEL = 'serving.knative.dev/service';

/** One pod as the printer needs it. */
export interface PodView {
  service: string;
  name: string;
  ready: boolean;
  /** Being deleted (Terminating). */
  terminating: boolean;
  /** From creation to its Ready condition, in ms (when ready). */
  startMs?: number;
}

/** Milliseconds since the epoch of a timestamp the client gives as a Date or a string. */
const ms = (t: Date | string | undefined): number | undefined => (t === undefined ? undefined : new Date(t).getTime());

/** From a pod's creation to its Ready condition in ms, when it is ready. */
function startDuration(p: V1Pod): number | undefined {
  const ready = p.status?.conditions?.find((c) => c.type === 'Ready' && c.status === 'True');
  const [created, readyAt] = [ms(p.metadata?.creationTimestamp), ms(ready?.lastTransitionTime)];
  return created !== undefined && readyAt !== undefined ? readyAt - created : undefined;
}

/** What {@link watchScale} needs of a pod. Pure. */
export function podView(p: V1Pod): PodView {
  const meta = p.metadata ?? {};
  const isReady = p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
  const startMs = startDuration(p);
  return {
    service: meta.labels?.[SERVICE_LABEL] ?? '?',
    name: meta.name ?? '',
    ready: isReady && !meta.deletionTimestamp,
    terminating: !!meta.deletionTimestamp,
    ...(startMs !== undefined ? { startMs } : {}),
  };
}

/**
 * The line for a function whose ready pods went from `before` to `after` (`pod`: the one that
 * changed), or undefined when the count did not change. Pure.
 */
export function scaleLine(service: string, before: number, after: number, pod: PodView): Printed | undefined {
  if (before === after) return undefined;
  const text =
    after === 0
      ? 'scaled to zero: no pod is ready'
      : before === 0
        ? `cold start: pod ${pod.name} ready${pod.startMs !== undefined ? ` ${(pod.startMs / 1000).toFixed(1)} s after it was created` : ''}`
        : `${after > before ? 'scaled out' : 'scaled in'} to ${after} ready pod${after === 1 ? '' : 's'}`;
  return { debug: false, component: 'autoscaler', subject: service, text };
}

/**
 * Watches the Knative Services' pods in `namespace` and prints {@link scaleLine}s.
 * @returns a function that stops the watch.
 */
export async function watchScale(
  kc: KubeConfig,
  namespace: string,
  emit: (p: Printed) => void,
): Promise<() => Promise<void>> {
  const core = kc.makeApiClient(CoreV1Api);
  const pods = new Map<string, PodView>();
  const readyOf = (service: string) => [...pods.values()].filter((p) => p.service === service && p.ready).length;
  const informer = makeInformer<V1Pod>(
    kc,
    `/api/v1/namespaces/${namespace}/pods`,
    () => core.listNamespacedPod({ namespace, labelSelector: SERVICE_LABEL }),
    SERVICE_LABEL,
  );
  let stopped = false;
  const on = (gone: boolean) => (p: V1Pod) => {
    const view = podView(p);
    const before = readyOf(view.service);
    if (gone) pods.delete(view.name);
    else pods.set(view.name, view);
    const line = scaleLine(view.service, before, readyOf(view.service), view);
    if (line) emit(line);
  };
  informer.on('add', on(false));
  informer.on('update', on(false));
  informer.on('delete', on(true));
  informer.on('error', (err: unknown) => {
    if (stopped) return;
    emit({
      debug: true,
      component: 'autoscaler',
      subject: '',
      text: `watch failed (${describeError(err)}); restarting`,
    });
    setTimeout(() => !stopped && informer.start().catch(() => undefined), 1000).unref();
  });
  await informer.start();
  return async () => {
    stopped = true;
    await informer.stop();
  };
}
