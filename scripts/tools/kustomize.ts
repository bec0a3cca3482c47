/**
 * Renders manifests/ with kustomize (tool set `kustomize` of scripts/tools/registry.ts)
 * exactly as `kubectl apply -k` would (kubectl embeds the same kustomize API).
 */
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { promisify } from 'node:util';
import type { KubernetesObject } from '@kubernetes/client-node';
// Plain YAML parsing (client-node's own dependency): client-node's loadAllYaml turns built-in
// kinds into typed models and silently drops fields they do not know, which would hide a
// misspelled field from the strict server-side validation.
import { loadAll } from 'js-yaml';
import { REPO_ROOT, ensureTool } from './build.ts';

const execFileP = promisify(execFile);

/**
 * Finds or builds kustomize (about 20 s with a warm Go cache).
 * @returns the absolute path of the `kustomize` binary.
 * @throws Error with the tail of the `go` output when the build fails.
 */
export function ensureKustomize(log?: (line: string) => void): Promise<string> {
  return ensureTool('kustomize', 'kustomize', log);
}

/** The entry point, `kubectl apply -k manifests/`: admission as a Deployment + Service. */
export const ENTRY_POINT = 'manifests';

/**
 * The Knative layout: every function a Knative Service (admission reached through Knative's
 * cluster-local TLS). The test worlds run the functions from its Services.
 */
export const KNATIVE_LAYOUT = 'manifests/overlays/knative-cluster-local-tls';

/**
 * Every kustomization a user may apply, relative to the repository root: the entry point, the
 * overlays that start from it (without CRDs, the source-Secret fast path, `Retry-After` on
 * mirror-sync's Triggers, unsigned events, observability) and the Knative layout.
 */
export const KUSTOMIZATIONS: readonly string[] = [
  ENTRY_POINT,
  'manifests/overlays/without-crds',
  'manifests/overlays/secret-fast-path',
  'manifests/overlays/retry-after',
  'manifests/overlays/unsigned-events',
  'manifests/overlays/observability',
  KNATIVE_LAYOUT,
];

/**
 * Renders one kustomization (`kustomize build DIR`).
 * @param dir folder with a kustomization.yaml, relative to the repository root or absolute.
 * @returns the rendered YAML text.
 * @throws Error with kustomize's message when the kustomization is invalid.
 */
export async function renderYaml(dir: string): Promise<string> {
  const bin = await ensureKustomize();
  const { stdout } = await execFileP(bin, ['build', resolve(REPO_ROOT, dir)], { maxBuffer: 64 << 20 }).catch(
    (err: { stderr?: string; message: string }) => {
      throw new Error(`kustomize build ${dir}: ${err.stderr || err.message}`);
    },
  );
  return stdout;
}

/** {@link renderYaml}, parsed into plain objects (one per YAML document, every field kept). */
export async function render(dir: string): Promise<KubernetesObject[]> {
  return (loadAll(await renderYaml(dir)) as KubernetesObject[]).filter(Boolean);
}

/** Kinds in the rendered manifests that are cluster-scoped (everything else is namespaced). */
export const CLUSTER_SCOPED_KINDS: ReadonlySet<string> = new Set([
  'Namespace',
  'ClusterRole',
  'ClusterRoleBinding',
  'CustomResourceDefinition',
  'ValidatingWebhookConfiguration',
]);

/**
 * Moves rendered objects from `captf-system` into `namespace` (tests install them into their
 * own namespace): namespaced objects' `metadata.namespace`, binding subjects, the webhook's
 * service reference and the cainjector annotation. Returns new objects; the input is unchanged.
 */
export function relocate<T extends KubernetesObject>(objects: readonly T[], namespace: string): T[] {
  return objects.map((o) => {
    const c = structuredClone(o) as Relocatable & T;
    if (!CLUSTER_SCOPED_KINDS.has(c.kind!) && c.metadata) c.metadata.namespace = namespace;
    relocateReferences(c, { from: 'captf-system', to: namespace });
    return c;
  });
}

/** The parts of an object that may name the namespace it lives in. */
type Relocatable = KubernetesObject & {
  subjects?: { namespace?: string }[];
  webhooks?: { clientConfig?: { service?: { namespace?: string } } }[];
};

/**
 * Points `c`'s binding subjects, webhook services and cert-manager's `inject-ca-from`
 * annotation (`<namespace>/<certificate>`) in `from` at `to` (in place).
 */
function relocateReferences(c: Relocatable, { from, to }: { from: string; to: string }): void {
  const move = (ref: { namespace?: string } | undefined) => {
    if (ref?.namespace === from) ref.namespace = to;
  };
  for (const s of c.subjects ?? []) move(s);
  for (const w of c.webhooks ?? []) move(w.clientConfig?.service);
  const ann = c.metadata?.annotations;
  const key = 'cert-manager.io/inject-ca-from';
  if (ann?.[key]?.startsWith(`${from}/`)) ann[key] = ann[key].replace(`${from}/`, `${to}/`);
}
