/**
 * Builds every Go tool of scripts/tools/registry.ts ahead of time (or finds it in `.cache/`)
 * and fetches the pinned third-party CRDs, so test files starting in parallel find them ready.
 *
 * `npm run tools [-- SET…] [--pin-kubectl]`: SETs (e.g. `kubectl`) limit it to those tool sets,
 * without the CRDs. Prints each set's bin folder on stdout, whether it was cached or built on
 * stderr. `--pin-kubectl` first rewrites scripts/tools/go/kubectl/go.mod from
 * scripts/tools/go/kubernetes/go.mod (same k8s.io/kubernetes and staging-module replaces).
 */
import { execFile } from 'node:child_process';
import { basename, dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { EVENTING_CRDS, loadThirdPartyCRDs } from './controlplane/crds.ts';
import { REPO_ROOT, builtTool, cacheDir, ensureTool } from './tools/build.ts';
import { TOOLS, type ToolSet } from './tools/registry.ts';

const exec = promisify(execFile);

/** Rewrites the kubectl wrapper go.mod from the kubernetes wrapper's version and replaces, then tidies it. */
async function pinKubectl(): Promise<void> {
  const go = join(REPO_ROOT, 'scripts', 'tools', 'go');
  const { stdout } = await exec('go', ['mod', 'edit', '-json'], { cwd: join(go, 'kubernetes') });
  const mod = JSON.parse(stdout) as {
    Require: { Path: string; Version: string }[];
    Replace: { Old: { Path: string }; New: { Path: string; Version: string } }[];
  };
  const version = mod.Require.find((r) => r.Path === 'k8s.io/kubernetes')!.Version;
  const replaces = mod.Replace.map((r) => `-replace=${r.Old.Path}=${r.New.Path}@${r.New.Version}`);
  const edit = [...replaces, `-require=k8s.io/kubernetes@${version}`, '-tool=k8s.io/kubernetes/cmd/kubectl'];
  await exec('go', ['mod', 'edit', ...edit], { cwd: join(go, 'kubectl') });
  await exec('go', ['mod', 'tidy'], { cwd: join(go, 'kubectl') });
  console.error(`[tools] pinned kubectl to k8s.io/kubernetes ${version} with ${replaces.length} replaces`);
}

const args = process.argv.slice(2);
const named = args.filter((a) => !a.startsWith('--'));
const unknown = named.filter((a) => !(a in TOOLS));
if (unknown.length) throw new Error(`no tool set ${unknown.join(', ')}; the sets: ${Object.keys(TOOLS).join(', ')}`);
if (args.includes('--pin-kubectl')) await pinKubectl();
for (const set of (named.length ? named : Object.keys(TOOLS)) as ToolSet[]) {
  // The control plane comes from there then (ensureControlPlaneBinaries).
  if (set === 'controlplane' && process.env.KUBEBUILDER_ASSETS) {
    console.error(`[tools] controlplane: KUBEBUILDER_ASSETS=${process.env.KUBEBUILDER_ASSETS}`);
    continue;
  }
  const cached = builtTool(set) !== undefined;
  const bin = dirname(await ensureTool(set));
  console.error(`[tools] ${set}: ${cached ? 'cached' : 'built'} (${basename(cacheDir(set))})`);
  console.log(bin);
}
if (!named.length) {
  const crds = [...(await loadThirdPartyCRDs()), ...(await loadThirdPartyCRDs(EVENTING_CRDS))];
  for (const source of new Set(crds.map((c) => c.source))) console.error(`[tools] CRD ${source}`);
}
