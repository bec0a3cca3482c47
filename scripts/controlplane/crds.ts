/**
 * Installs the project's CRDs (manifests/crds/) with server-side apply and waits until each
 * is Established — used by the test harness and the local mode.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  ApiextensionsV1Api,
  KubernetesObjectApi,
  PatchStrategy,
  loadAllYaml,
  type KubeConfig,
  type KubernetesObject,
  type V1CustomResourceDefinition,
} from '@kubernetes/client-node';
import { FIELD_MANAGER } from '../../functions/lib/api.ts';
import { eventually } from '../lib/wait.ts';
import { REPO_ROOT } from '../tools/build.ts';

/** Every CRD document in manifests/crds/*.yaml (kustomization.yaml excluded). */
export function loadCRDs(): V1CustomResourceDefinition[] {
  const dir = join(REPO_ROOT, 'manifests', 'crds');
  return readdirSync(dir)
    .filter((f) => f.endsWith('.yaml') && f !== 'kustomization.yaml')
    .flatMap((f) => loadAllYaml(readFileSync(join(dir, f), 'utf8')) as V1CustomResourceDefinition[]);
}

/**
 * Applies CRDs (server-side apply, field manager `captf-credentials`, forced), waits for
 * `Established=True` on each, then until each resource answers a list (right after
 * Established, lists may still get 429 while its storage initialises).
 * @returns the CRD names.
 * @throws Error when the API server rejects a CRD or one is not ready within `timeoutMs`.
 */
export async function applyCRDs(
  kc: KubeConfig,
  crds: readonly V1CustomResourceDefinition[],
  timeoutMs = 60_000,
): Promise<string[]> {
  const objects = KubernetesObjectApi.makeApiClient(kc);
  const ext = kc.makeApiClient(ApiextensionsV1Api);
  for (const crd of crds) {
    await objects.patch(
      crd as KubernetesObject,
      undefined,
      undefined,
      FIELD_MANAGER,
      true,
      PatchStrategy.ServerSideApply,
    );
  }
  const deadline = Date.now() + timeoutMs;
  // One deadline for every CRD together.
  const waitFor = (what: string, ready: () => Promise<boolean>) =>
    eventually(what, ready, Math.max(0, deadline - Date.now()));
  for (const crd of crds) {
    const name = crd.metadata!.name!;
    await waitFor(`CRD ${name} to be Established`, async () =>
      Boolean(
        (await ext.readCustomResourceDefinition({ name })).status?.conditions?.some(
          (c) => c.type === 'Established' && c.status === 'True',
        ),
      ),
    );
    const { group, names, versions } = crd.spec;
    const version = versions.find((v) => v.storage)?.name ?? versions[0]!.name;
    await waitFor(`CRD ${name} to serve lists`, async () => {
      await objects.list(
        `${group}/${version}`,
        names.kind,
        undefined,
        undefined,
        undefined,
        undefined,
        undefined,
        undefined,
        1,
      );
      return true;
    });
  }
  return crds.map((c) => c.metadata!.name!);
}

/** Installs the project's own CRDs (manifests/crds/) with {@link applyCRDs}. */
export function installCRDs(kc: KubeConfig, timeoutMs = 60_000): Promise<string[]> {
  return applyCRDs(kc, loadCRDs(), timeoutMs);
}
