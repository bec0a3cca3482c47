/**
 * Knative Serving's installation for the test node, read from the pinned modules' own
 * `config/` folders (as the Eventing CRDs are, scripts/controlplane/crds.ts): Serving's
 * `config/core` and the networking objects it needs from `knative.dev/networking/config`
 * (the module zips drop the symlinks that make `config/core` complete upstream). What is left
 * out and what is changed is listed here and nowhere else; {@link servingObjects} is pure.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadAllYaml, type KubernetesObject } from '@kubernetes/client-node';
import { downloadModule } from '../controlplane/crds.ts';
import { IMAGES, SERVING_PROGRAMS } from '../image/images.ts';
import { REPO_ROOT } from '../tools/build.ts';
import { CLUSTER_LOCAL_TLS } from './tls.ts';

/** Where Knative Serving runs, as upstream installs it. */
export const SERVING_NAMESPACE = 'knative-serving';

/** The KIngress class Traefik's Knative provider reconciles (its `pkg/provider/kubernetes/knative`). */
export const TRAEFIK_INGRESS_CLASS = 'traefik.ingress.networking.knative.dev';

/**
 * The autoscaler's windows for tests: 6 s is the smallest `stable-window` Serving accepts
 * (pkg/autoscaler/config/config.go `validate`), and scale to zero follows as soon as the grace
 * allows, so a test sees a function at zero within seconds instead of upstream's 60 s + 30 s.
 * Every other Knative default is upstream's.
 */
export const TEST_AUTOSCALER: Readonly<Record<string, string>> = {
  'stable-window': '6s',
  'scale-to-zero-grace-period': '6s',
};

/**
 * The files installed, in order (namespace and roles before the CRDs, ConfigMaps before the
 * webhooks that validate them, the Deployments last). Left out: `300-knativecertificate.yaml`
 * (system-internal TLS needs the cert-manager class), `999-cache.yaml` (the image cache is
 * patched out of the controller: scripts/tools/registry.ts), the `*-hpa.yaml` autoscalers (no
 * metrics server here).
 */
function servingFiles(serving: string, networking: string): string[] {
  const folder = (sub: string) =>
    readdirSync(join(serving, sub))
      .filter((f) => f.endsWith('.yaml'))
      .sort()
      .map((f) => join(serving, sub, f));
  return [
    join(serving, '100-namespace.yaml'),
    join(serving, '200-serviceaccount.yaml'),
    ...folder('200-roles'),
    ...folder('300-resources'),
    ...['ingress', 'certificate', 'serverlessservice', 'domain-claim', 'config-network'].map((n) =>
      join(networking, `${n}.yaml`),
    ),
    ...folder('configmaps'),
    ...folder('webhooks'),
    ...['activator', 'autoscaler', 'controller', 'webhook'].map((n) => join(serving, 'deployments', `${n}.yaml`)),
  ];
}

/** Options of {@link servingObjects}. */
export interface ServingChanges {
  /** `ko://knative.dev/serving/cmd/<program>` → the image reference the node has. */
  images: Readonly<Record<string, string>>;
  /** Merged into `config-autoscaler` (e.g. {@link TEST_AUTOSCALER}). */
  autoscaler?: Readonly<Record<string, string>>;
}

/**
 * Serving's objects with the changes an installation on the node needs: the `ko://` image
 * references (Deployments and `config-deployment`'s `queue-sidecar-image`) replaced by the
 * images the node imported; `config-network`'s `ingress-class` set to Traefik's and
 * cluster-local TLS on, from the issuer `config-certmanager` names (./tls.ts); the autoscaler's
 * settings merged when given. Pure.
 * @throws Error naming a `ko://` reference that has no image.
 */
export function servingObjects(docs: readonly KubernetesObject[], changes: ServingChanges): KubernetesObject[] {
  const text = JSON.stringify(docs).replace(/ko:\/\/knative\.dev\/serving\/cmd\/([a-z-]+)/g, (ref, program: string) => {
    const image = changes.images[program];
    if (!image) throw new Error(`no image for ${ref}`);
    return image;
  });
  return (JSON.parse(text) as (KubernetesObject & { data?: Record<string, string> })[]).map((o) => {
    if (o.kind !== 'ConfigMap') return o;
    if (o.metadata?.name === 'config-network')
      return { ...o, data: { ...o.data, 'ingress-class': TRAEFIK_INGRESS_CLASS, ...CLUSTER_LOCAL_TLS.network } };
    if (o.metadata?.name === 'config-certmanager')
      return { ...o, data: { ...o.data, ...CLUSTER_LOCAL_TLS.certmanager } };
    if (o.metadata?.name === 'config-autoscaler' && changes.autoscaler)
      return { ...o, data: { ...o.data, ...changes.autoscaler } };
    return o;
  });
}

/** The wrapper module that pins Serving (and, through it, networking). */
const SERVING_WRAPPER = join(REPO_ROOT, 'scripts', 'tools', 'go', 'serving');

/**
 * Reads Serving's installation from the pinned modules (downloaded when missing) and applies
 * {@link servingObjects} with the node's images.
 * @returns the objects in install order, and where they came from.
 * @throws Error when `go mod download` fails or a file is missing from a module.
 */
export async function loadServingObjects(
  autoscaler?: Readonly<Record<string, string>>,
): Promise<{ objects: KubernetesObject[]; sources: string[] }> {
  const [serving, networking] = await Promise.all(
    ['knative.dev/serving', 'knative.dev/networking'].map((m) => downloadModule(m, SERVING_WRAPPER)),
  );
  const files = servingFiles(join(serving!.Dir, 'config', 'core'), join(networking!.Dir, 'config'));
  const docs = files.flatMap((f) =>
    (loadAllYaml(readFileSync(f, 'utf8')) as (KubernetesObject | null)[]).filter(
      (d): d is KubernetesObject => !!d?.kind,
    ),
  );
  const images = Object.fromEntries(SERVING_PROGRAMS.map((p) => [p, IMAGES[`serving-${p}`].ref]));
  return {
    objects: servingObjects(docs, { images, ...(autoscaler ? { autoscaler } : {}) }),
    sources: [
      `knative.dev/serving@${serving!.Version}/config/core`,
      `knative.dev/networking@${networking!.Version}/config`,
    ],
  };
}
