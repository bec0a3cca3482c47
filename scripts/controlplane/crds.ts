/**
 * Installs the project's CRDs (manifests/crds/) with server-side apply and waits until each
 * is Established — used by the test harness and the local mode.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ApiextensionsV1Api, KubernetesObjectApi, PatchStrategy, loadAllYaml, type KubeConfig, type KubernetesObject, type V1CustomResourceDefinition } from '@kubernetes/client-node';
import { FIELD_MANAGER } from '../../functions/lib/api.ts';
import { REPO_ROOT } from './build.ts';

/** Every CRD document in manifests/crds/*.yaml (kustomization.yaml excluded). */
export function loadCRDs(): V1CustomResourceDefinition[] {
  const dir = join(REPO_ROOT, 'manifests', 'crds');
  return readdirSync(dir)
    .filter((f) => f.endsWith('.yaml') && f !== 'kustomization.yaml')
    .flatMap((f) => loadAllYaml(readFileSync(join(dir, f), 'utf8')) as V1CustomResourceDefinition[]);
}

/**
 * Applies the CRDs (server-side apply, field manager `captf-credentials`, forced) and waits
 * for `Established=True` on each.
 * @throws Error when the API server rejects a CRD or one is not established within `timeoutMs`.
 */
export async function installCRDs(kc: KubeConfig, timeoutMs = 60_000): Promise<string[]> {
  const objects = KubernetesObjectApi.makeApiClient(kc);
  const ext = kc.makeApiClient(ApiextensionsV1Api);
  const crds = loadCRDs();
  for (const crd of crds) {
    await objects.patch(crd as KubernetesObject, undefined, undefined, FIELD_MANAGER, true, PatchStrategy.ServerSideApply);
  }
  const names = crds.map((c) => c.metadata!.name!);
  const deadline = Date.now() + timeoutMs;
  for (const name of names) {
    for (;;) {
      const crd = await ext.readCustomResourceDefinition({ name });
      if (crd.status?.conditions?.some((c) => c.type === 'Established' && c.status === 'True')) break;
      if (Date.now() > deadline) throw new Error(`CRD ${name} not Established after ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 200));
    }
  }
  return names;
}
