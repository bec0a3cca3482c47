/**
 * The documents in examples/, in file-name order (namespaces first), and a server-side
 * apply of them: what `kubectl apply --server-side -f examples/` does.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadAllYaml, type KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import { objectName, serverSideApply } from '../lib/kube.ts';
import { REPO_ROOT } from '../tools/build.ts';

/** The examples folder. */
export const EXAMPLES_DIR = join(REPO_ROOT, 'examples');

/** Every document of examples/*.yaml, files sorted by name, documents in file order. */
export function loadExamples(dir = EXAMPLES_DIR): KubernetesObject[] {
  return readdirSync(dir)
    .filter((f) => /\.ya?ml$/.test(f))
    .sort()
    .flatMap((f) => (loadAllYaml(readFileSync(join(dir, f), 'utf8')) as KubernetesObject[]).filter(Boolean));
}

/**
 * Applies the examples with server-side apply (field manager `captf-examples`, forced), in
 * order, so the API server validates each against its schema (CRD OpenAPI and CEL rules)
 * and the admission webhook reviews the identities.
 * @returns `Kind namespace/name` of each object applied.
 * @throws the first API error, naming the object.
 */
export async function applyExamples(kc: KubeConfig, dir = EXAMPLES_DIR): Promise<string[]> {
  const done: string[] = [];
  for (const obj of loadExamples(dir)) {
    await serverSideApply(kc, obj, 'captf-examples');
    done.push(objectName(obj));
  }
  return done;
}
