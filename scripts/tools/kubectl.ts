/**
 * A real kubectl, built from `k8s.io/kubernetes/cmd/kubectl` at the control plane's pinned
 * version (wrapper module scripts/tools/go/kubectl, cached in `.cache/kubectl/…`),
 * so the tests can prove `kubectl apply -f examples/` and the printer columns without a
 * kubectl on the machine. Nothing at run time needs it.
 *
 * `node scripts/tools/kubectl.ts` prints its path (building it first, a few minutes once);
 * `node scripts/tools/kubectl.ts --pin` regenerates the wrapper go.mod from
 * scripts/tools/go/kubernetes/go.mod (same k8s.io/kubernetes version and
 * staging-module replaces), then `go mod tidy`.
 */
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { CONTROL_PLANE_TOOLS, REPO_ROOT, type GoTool } from './build.ts';
import { builtGoBinary, ensureGoBinary } from './build-lock.ts';

const exec = promisify(execFile);

/** The kubectl wrapper module. */
export const KUBECTL_TOOLS: readonly GoTool[] = [
  {
    module: 'kubectl',
    versionOf: 'k8s.io/kubernetes',
    packages: ['k8s.io/kubernetes/cmd/kubectl'],
    // The same version stamps as the control plane's, so `kubectl version` is not v0.0.0-master.
    ldflags: CONTROL_PLANE_TOOLS.find((t) => t.module === 'kubernetes')!.ldflags!,
  },
];

/** Path of kubectl when it was built already (nothing is built here). */
export function builtKubectlPath(): string | undefined {
  return builtGoBinary(KUBECTL_TOOLS, 'kubectl', 'kubectl');
}

/**
 * Finds or builds kubectl.
 * @returns the absolute path of the binary.
 * @throws Error with the tail of the `go` output when the build fails.
 */
export function ensureKubectl(log?: (line: string) => void): Promise<string> {
  return ensureGoBinary(KUBECTL_TOOLS, 'kubectl', 'kubectl', log);
}

/** Rewrites the wrapper go.mod from the kubernetes wrapper's version and replaces. */
async function pin(): Promise<void> {
  const go = join(REPO_ROOT, 'scripts', 'tools', 'go');
  const { stdout } = await exec('go', ['mod', 'edit', '-json'], { cwd: join(go, 'kubernetes') });
  const mod = JSON.parse(stdout) as {
    Require: { Path: string; Version: string }[];
    Replace: { Old: { Path: string }; New: { Path: string; Version: string } }[];
  };
  const version = mod.Require.find((r) => r.Path === 'k8s.io/kubernetes')!.Version;
  const replaces = mod.Replace.map((r) => `-replace=${r.Old.Path}=${r.New.Path}@${r.New.Version}`);
  const cwd = join(go, 'kubectl');
  await exec(
    'go',
    ['mod', 'edit', ...replaces, `-require=k8s.io/kubernetes@${version}`, '-tool=k8s.io/kubernetes/cmd/kubectl'],
    { cwd },
  );
  await exec('go', ['mod', 'tidy'], { cwd });
  console.log(`pinned kubectl to k8s.io/kubernetes ${version} with ${replaces.length} replaces`);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  if (process.argv.includes('--pin')) await pin();
  else console.log(await ensureKubectl());
}
