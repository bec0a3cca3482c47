/**
 * `npm run manifests -- [DIR]`: prints the rendered YAML of the kustomization DIR (default
 * `manifests`), building kustomize first when it is missing.
 */
import { renderYaml } from './tools/kustomize.ts';

process.stdout.write(await renderYaml(process.argv[2] ?? 'manifests'));
