/**
 * The functions as a cluster runs them: the rendered manifests' Knative Services on Knative
 * Serving on the test node (scripts/serving/), from the images the node imported. The manifests
 * are applied as `kubectl apply -k` would apply them, through a kustomize overlay that changes
 * only the product's image reference and adds the
 * component that has the webhook's certificate issued by Knative's cluster-local issuer, so the
 * API server reaches admission through Traefik over TLS (docs/deploy-knative.md). The Broker,
 * its Triggers and sources are applied with them, for Knative Eventing's own installation on
 * the node (scripts/eventing/install.ts) to run.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { rootCertificates } from 'node:tls';
import {
  AdmissionregistrationV1Api,
  CustomObjectsApi,
  KubernetesObjectApi,
  PatchStrategy,
  type KubeConfig,
  type KubernetesObject,
} from '@kubernetes/client-node';
import { Agent, buildConnector } from 'undici';
import { IMAGES } from '../image/images.ts';
import { applyAsRendered } from '../lib/kube.ts';
import { eventually } from '../lib/wait.ts';
import type { TestNode } from '../node/node.ts';
import { TRAEFIK_PORTS } from '../serving/serving.ts';
import { REPO_ROOT } from '../tools/build.ts';
import { render } from '../tools/kustomize.ts';
import { untilWebhookAnswers } from './webhook.ts';

/** The image name the manifests use (renamed nowhere: a user's `images` entry sets it). */
export const SHIPPED_IMAGES = { product: 'captf-credentials' } as const;

/** Field manager of the applied manifests (what `kubectl apply --server-side` would use). */
const MANAGER = 'kubectl';

/**
 * A test overlay's kustomization: `base` with `components`, and the product image the node
 * has. Pure.
 * @param base the kustomization rendered, relative to the overlay's folder.
 * @param components components added, relative to the overlay's folder.
 */
export function nodeOverlay(base: string, images: { product: string }, components: readonly string[] = []): string {
  // Scalars as JSON strings (valid YAML): a folder may hold `#` or `: `.
  const q = (v: string) => JSON.stringify(v);
  const image = (name: string, ref: string) => {
    const { repository, tag } = splitImageRef(ref);
    return `  - name: ${q(name)}\n    newName: ${q(repository)}\n    newTag: ${q(tag)}\n`;
  };
  return (
    "# Written by scripts/system/serving.ts: the manifests with the test node's images.\n" +
    'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n' +
    `resources:\n  - ${q(base)}\n` +
    (components.length ? `components:\n${components.map((c) => `  - ${q(c)}\n`).join('')}` : '') +
    `images:\n${image(SHIPPED_IMAGES.product, images.product)}`
  );
}

/**
 * Splits `repository:tag` at the tag's colon (the last one after the last `/`, so a registry's
 * port stays in the repository). Pure.
 * @throws Error for a reference without a tag, or by digest (the node's images have tags).
 */
export function splitImageRef(ref: string): { repository: string; tag: string } {
  const at = ref.lastIndexOf(':');
  if (ref.includes('@') || at <= ref.lastIndexOf('/')) throw new Error(`image ${ref}: expected repository:tag`);
  return { repository: ref.slice(0, at), tag: ref.slice(at + 1) };
}

/**
 * Renders `manifests` with `components` through {@link nodeOverlay}, written to `<dir>/<name>`.
 * @returns the objects without CRDs (installed on their own).
 */
export async function renderForNode(
  manifests: string,
  o: { dir: string; name: string; components?: readonly string[] },
): Promise<KubernetesObject[]> {
  const overlay = join(o.dir, o.name);
  mkdirSync(overlay, { recursive: true });
  const images = { product: IMAGES['captf-credentials'].ref };
  const rel = (p: string) => relative(overlay, join(REPO_ROOT, p));
  writeFileSync(
    join(overlay, 'kustomization.yaml'),
    nodeOverlay(rel(manifests), images, (o.components ?? []).map(rel)),
  );
  return (await render(overlay)).filter((x) => x.kind !== 'CustomResourceDefinition');
}

/** The component that has the webhook's certificate issued by Knative's cluster-local issuer. */
export const CLUSTER_LOCAL_TLS_COMPONENT = 'manifests/components/knative-cluster-local-tls';

/**
 * Renders `manifests` for Knative Serving on the node: with {@link CLUSTER_LOCAL_TLS_COMPONENT},
 * the webhook's certificate chains to the cluster-local issuer whose certificates Traefik serves.
 */
export const renderForServing = (manifests: string, dir: string): Promise<KubernetesObject[]> =>
  renderForNode(manifests, { dir, name: 'serving-overlay', components: [CLUSTER_LOCAL_TLS_COMPONENT] });

/**
 * `rendered` with `env` set on the first container of every Knative Service (an entry of the
 * same name replaced, the others kept in order). Pure.
 */
export function withFunctionEnv(
  rendered: readonly KubernetesObject[],
  env: Readonly<Record<string, string>>,
): KubernetesObject[] {
  const added = Object.entries(env).map(([name, value]) => ({ name, value }));
  if (!added.length) return [...rendered];
  return rendered.map((o) => {
    if (o.kind !== 'Service' || !o.apiVersion?.startsWith('serving.knative.dev/')) return o;
    const copy = structuredClone(o) as KubernetesObject & {
      spec: { template: { spec: { containers: { env?: { name: string; value?: string }[] }[] } } };
    };
    const container = copy.spec.template.spec.containers[0]!;
    container.env = [...(container.env ?? []).filter((e) => !(e.name in env)), ...added];
    return copy;
  });
}

/** The Knative Services as Serving reports them. */
export interface ServedFunctions {
  /** Knative Service name → its cluster-local address (`http://<name>.<namespace>.svc.cluster.local`). */
  urls: Record<string, string>;
  /** A 127.0.0.1 port of this machine that reaches Traefik's cluster-local entrypoint (send `Host: <address's host>`). */
  gateway: number;
}

/** How long the Knative Services may take to be Ready (first pod of each from the image; generous). */
const READY_TIMEOUT_MS = 240_000;

/** The rendered objects to apply: all of them, each PingSource's schedule replaced when `schedules` names it. Pure. */
export function objectsToApply(
  rendered: readonly KubernetesObject[],
  eventing: { schedules: Readonly<Record<string, string>> },
): KubernetesObject[] {
  return rendered.map((o) => {
    const schedule = o.kind === 'PingSource' ? eventing.schedules[o.metadata!.name!] : undefined;
    const spec = (o as { spec?: Record<string, unknown> }).spec;
    return schedule ? ({ ...o, spec: { ...spec, schedule } } as KubernetesObject) : o;
  });
}

/**
 * Applies the rendered objects ({@link objectsToApply})
 * and waits until the API server reaches the webhook and for every Knative object among them
 * (Services, then the Broker, Triggers and sources) to be Ready. Knative's webhooks may still
 * be starting: an apply one refuses is retried until the deadline.
 * @param o.eventing the PingSource schedules to apply (Knative Eventing runs them on the node).
 * @throws Error naming a Knative object that is not Ready in time, with its last condition.
 */
export async function deployOnServing(
  kc: KubeConfig,
  node: TestNode,
  rendered: readonly KubernetesObject[],
  o: { eventing: { schedules: Readonly<Record<string, string>> } },
): Promise<ServedFunctions> {
  for (const x of objectsToApply(rendered, o.eventing))
    await eventually(
      `applying ${x.kind} ${x.metadata?.name}`,
      () => applyAsRendered(kc, x, MANAGER),
      READY_TIMEOUT_MS,
      1000,
    );
  const api = kc.makeApiClient(CustomObjectsApi);
  const urls: Record<string, string> = {};
  // The Services first (their addresses), then what delivers to them: a Trigger is Ready only
  // once its subscriber resolves, and a start that returns before then loses the first events.
  const knative = rendered.filter((o) => KNATIVE_GROUPS.some((g) => o.apiVersion?.startsWith(`${g}/`)));
  const served = (o: KubernetesObject) => o.apiVersion!.startsWith('serving.knative.dev/');
  for (const o of [...knative.filter(served), ...knative.filter((o) => !served(o))]) {
    const status = await untilReady(api, o);
    if (o.kind === 'Service' && status.address?.url) urls[o.metadata!.name!] = status.address.url;
  }
  await subscribersCurrent(kc, rendered, urls);
  await webhookCAInjected(kc, rendered);
  await untilWebhookAnswers(kc, READY_TIMEOUT_MS);
  const gateway = await node.forward({ host: node.namespace.address, port: TRAEFIK_PORTS.private });
  return { urls, gateway };
}

/** The annotation {@link subscribersCurrent} sets to requeue a Trigger: the time, in ms since the epoch. */
export const RESOLVE_ANNOTATION = 'captf.io/resolve-subscriber';

/**
 * Waits until each rendered Trigger that delivers to one of `urls`' Knative Services has that
 * Service's address as its `status.subscriberUri`. A Trigger resolved while its Service's address
 * was still http keeps it although Ready: Eventing v0.49.2 tracks a Trigger's subscriber under
 * its Broker's key (`pkg/reconciler/broker/trigger/trigger.go`, knative/eventing#5374), so the
 * Service's change requeues no Trigger. A stale one is annotated ({@link RESOLVE_ANNOTATION}),
 * which does; docs/deploy-knative.md gives users the same `kubectl annotate`.
 * @throws Error naming the Triggers still stale at the deadline.
 */
async function subscribersCurrent(
  kc: KubeConfig,
  rendered: readonly KubernetesObject[],
  urls: Readonly<Record<string, string>>,
): Promise<void> {
  const objects = KubernetesObjectApi.makeApiClient(kc);
  const triggers = rendered.filter((o) => o.kind === 'Trigger' && o.apiVersion === 'eventing.knative.dev/v1');
  const nudged = new Map<string, number>();
  let stale: string[] = [];
  await eventually(
    "every Trigger to deliver to its Service's address",
    async () => {
      stale = [];
      for (const t of triggers) {
        const want = subscriberAddress(t, urls);
        const name = t.metadata!.name!;
        const got = want ? await subscriberUri(objects, t) : undefined;
        if (got === want) continue;
        stale.push(`${name} → ${got ?? 'none'}`);
        // Once per 10 s at most: the Trigger reconciler needs a moment to write its status.
        if (Date.now() - (nudged.get(name) ?? 0) < 10_000) continue;
        nudged.set(name, Date.now());
        await nudge(objects, t);
      }
      return stale.length === 0;
    },
    READY_TIMEOUT_MS,
    1000,
  ).catch((err: Error) => {
    throw new Error(`${err.message}; still stale: ${stale.join(', ')}`);
  });
}

/** The address of the Knative Service Trigger `t` delivers to, among `urls`; undefined for any other subscriber. */
function subscriberAddress(t: KubernetesObject, urls: Readonly<Record<string, string>>): string | undefined {
  const ref = (t as { spec?: { subscriber?: { ref?: { kind?: string; name?: string } } } }).spec?.subscriber?.ref;
  return ref?.kind === 'Service' ? urls[ref.name ?? ''] : undefined;
}

/** Trigger `t`'s `status.subscriberUri` as stored. */
async function subscriberUri(objects: KubernetesObjectApi, t: KubernetesObject): Promise<string | undefined> {
  const { name, namespace } = t.metadata as { name: string; namespace: string };
  const got = (await objects.read({ apiVersion: t.apiVersion!, kind: t.kind!, metadata: { name, namespace } })) as {
    status?: { subscriberUri?: string };
  };
  return got.status?.subscriberUri;
}

/** Sets {@link RESOLVE_ANNOTATION} on Trigger `t` (a merge patch): its reconciler then runs again. */
async function nudge(objects: KubernetesObjectApi, t: KubernetesObject): Promise<void> {
  const { name, namespace } = t.metadata as { name: string; namespace: string };
  await objects.patch(
    {
      apiVersion: t.apiVersion,
      kind: t.kind,
      metadata: { name, namespace, annotations: { [RESOLVE_ANNOTATION]: String(Date.now()) } },
    },
    undefined,
    undefined,
    MANAGER,
    undefined,
    PatchStrategy.MergePatch,
  );
}

/** The API groups of the Knative objects whose Ready condition a start waits for. */
const KNATIVE_GROUPS = ['serving.knative.dev', 'eventing.knative.dev', 'sources.knative.dev'];

/**
 * Waits until the Knative object `o` (a Service, Broker, Trigger or source) is Ready.
 * @returns its status (a Service's carries its address).
 * @throws Error naming the object and its last Ready condition when it is not Ready in time.
 */
async function untilReady(api: CustomObjectsApi, o: KubernetesObject): Promise<{ address?: { url?: string } }> {
  const { name, namespace } = o.metadata as { name: string; namespace: string };
  const [group, version] = o.apiVersion!.split('/') as [string, string];
  // Knative's CRDs take the kind's default plural: EventPolicy → eventpolicies.
  const plural = `${o.kind!.toLowerCase().replace(/y$/, 'ie')}s`;
  let last = '';
  return eventually(
    `${o.kind} ${namespace}/${name} to be Ready (kubectl -n ${namespace} describe ${plural}.${group} ${name})`,
    async () => {
      const got = (await api.getNamespacedCustomObject({ group, version, namespace, plural, name })) as {
        status?: { conditions?: { type: string; status: string; reason?: string }[]; address?: { url?: string } };
      };
      const ready = got.status?.conditions?.find((c) => c.type === 'Ready');
      last = ready ? `${ready.status} ${ready.reason ?? ''}` : 'no Ready condition';
      if (ready?.status !== 'True') throw new Error(`Ready ${last}`);
      return got.status ?? {};
    },
    READY_TIMEOUT_MS,
    500,
  );
}

/**
 * Waits until every rendered ValidatingWebhookConfiguration has a `caBundle` (cainjector's work,
 * the cert-manager stand-in's here): until then the API server cannot call the webhook.
 * @throws Error naming the configuration that has none in time.
 */
export async function webhookCAInjected(kc: KubeConfig, rendered: readonly KubernetesObject[]): Promise<void> {
  const adm = kc.makeApiClient(AdmissionregistrationV1Api);
  for (const o of rendered.filter((x) => x.kind === 'ValidatingWebhookConfiguration'))
    await eventually(
      `the caBundle of ValidatingWebhookConfiguration ${o.metadata!.name} (cert-manager.io/inject-ca-from)`,
      async () => {
        const vwc = await adm.readValidatingWebhookConfiguration({ name: o.metadata!.name! });
        return (vwc.webhooks ?? []).every((h) => !!h.clientConfig.caBundle);
      },
      READY_TIMEOUT_MS,
      250,
    );
}

/**
 * An undici dispatcher that sends every request for a `*.svc.cluster.local` name to Traefik's
 * cluster-local entrypoint through the node's forward (`gateway`), keeping the name in the URL,
 * so in `Host` and in TLS's SNI, which is what Traefik routes by, and trusting `caPem` (the
 * cluster-local CA) for `https://` addresses; any other name is connected as usual. Set as the
 * global dispatcher (`setGlobalDispatcher`), it lets this machine's `fetch` call a Knative
 * Service by its address, as a pod would.
 */
export function clusterLocalDispatcher(gateway: number, caPem: string): Agent {
  const connect = buildConnector({ ca: [...rootCertificates, caPem] });
  return new Agent({
    connect: (o, cb) =>
      connect(
        o.hostname.endsWith('.svc.cluster.local')
          ? { ...o, hostname: '127.0.0.1', port: String(gateway), servername: o.hostname }
          : o,
        cb,
      ),
  });
}
