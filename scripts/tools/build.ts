/**
 * Builds the test control plane (etcd, kube-apiserver, kube-controller-manager) from pinned
 * Go wrapper modules under scripts/tools/go/, through the Go module proxy, into
 * `.cache/controlplane/<versions>/bin`. A build happens only when the pinned go.mod/go.sum
 * change. `KUBEBUILDER_ASSETS` (envtest binaries) short-circuits everything.
 *
 * Run directly (`npm run controlplane:build`) to build ahead of time.
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Repository root (two levels above this file). */
export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const GO_DIR = join(REPO_ROOT, 'scripts', 'tools', 'go');

/** One Go wrapper module and the main packages it builds. */
export interface GoTool {
  /** Folder under scripts/tools/go/. */
  module: string;
  /** Module whose `require` line pins the version shown in the cache key. */
  versionOf: string;
  /** Main packages to build; each becomes `bin/<last path element>` unless `outName` says. */
  packages: string[];
  /** Binary name per package when the package path's last element is not the binary's name. */
  outName?: Record<string, string>;
  /** Extra `-ldflags` computed from the pinned version. */
  ldflags?: (version: string) => string[];
  /**
   * Source patches of dependencies, applied to module copies used through `go build -modfile`
   * (the module cache and the wrapper module are never modified); part of the cache key, so
   * changing one rebuilds.
   */
  patches?: readonly GoSourcePatch[];
}

/**
 * An exact-text patch of one file of a dependency module, applied at build time to a copy of
 * the pinned module (under the tool's cache folder) that the build uses through a generated
 * `-modfile` with a `replace` (Go refuses `-overlay` for files in the module cache).
 */
export interface GoSourcePatch {
  /** Module path the file belongs to, e.g. `knative.dev/eventing` (its folder comes from `go list -m`). */
  module: string;
  /** The file, relative to the module root. */
  file: string;
  /** Each `from` must occur exactly once in the upstream file; it becomes `to`. */
  replace: readonly { from: string; to: string }[];
  /** New files in the same folder (same Go package): file name → content. */
  add?: Readonly<Record<string, string>>;
}

/** The control plane's wrapper modules (SPEC §15; issue: foundation). */
export const CONTROL_PLANE_TOOLS: readonly GoTool[] = [
  {
    module: 'etcd',
    versionOf: 'go.etcd.io/etcd/server/v3',
    packages: ['go.etcd.io/etcd/server/v3'],
    outName: { 'go.etcd.io/etcd/server/v3': 'etcd' },
  },
  {
    module: 'kubernetes',
    versionOf: 'k8s.io/kubernetes',
    packages: ['k8s.io/kubernetes/cmd/kube-apiserver', 'k8s.io/kubernetes/cmd/kube-controller-manager'],
    // Without these /version reports v0.0.0-master.
    ldflags: (v) => {
      const [major, minor] = v.replace(/^v/, '').split('.');
      return [
        `-X k8s.io/component-base/version.gitVersion=${v}`,
        `-X k8s.io/component-base/version.gitMajor=${major}`,
        `-X k8s.io/component-base/version.gitMinor=${minor}`,
        '-X k8s.io/component-base/version.gitTreeState=clean',
      ];
    },
  },
];

/** Paths of the control-plane binaries; `kubeControllerManager` is absent with envtest assets. */
export interface ControlPlaneBinaries {
  binDir: string;
  etcd: string;
  kubeApiserver: string;
  kubeControllerManager?: string | undefined;
  /** Where they came from: `cache` (already built), `built` (just now) or `KUBEBUILDER_ASSETS`. */
  origin: 'cache' | 'built' | 'KUBEBUILDER_ASSETS';
}

/** Reads the version a wrapper go.mod pins for `modulePath` (from its `require`). */
export function pinnedVersion(tool: GoTool): string {
  const gomod = readFileSync(join(GO_DIR, tool.module, 'go.mod'), 'utf8');
  const re = new RegExp(`^\\s*(?:require\\s+)?${tool.versionOf.replace(/[.]/g, '\\.')}\\s+(v\\S+)`, 'm');
  const m = re.exec(gomod);
  if (!m) throw new Error(`scripts/tools/go/${tool.module}/go.mod does not require ${tool.versionOf}`);
  return m[1]!;
}

/**
 * Cache folder for a set of tools: names and pinned versions, plus a digest of the wrapper
 * go.mod/go.sum (comment lines excluded) so any re-pin rebuilds.
 */
export function cacheDir(tools: readonly GoTool[], name = 'controlplane'): string {
  const h = createHash('sha256');
  const parts: string[] = [];
  for (const t of tools) {
    for (const f of ['go.mod', 'go.sum']) {
      const p = join(GO_DIR, t.module, f);
      // Comments do not change what is built, so editing one must not force a rebuild.
      if (existsSync(p)) h.update(readFileSync(p, 'utf8').replace(/^\s*\/\/.*$/gm, ''));
    }
    // Only tools with patches hash them, so the keys of the others stay as they were.
    if (t.patches?.length) h.update(JSON.stringify(t.patches));
    parts.push(`${t.module}-${pinnedVersion(t)}`);
  }
  return join(REPO_ROOT, '.cache', name, `${parts.join('_')}-${h.digest('hex').slice(0, 8)}`);
}

function binaryName(tool: GoTool, pkg: string): string {
  return tool.outName?.[pkg] ?? pkg.split('/').pop()!;
}

function run(
  cmd: string,
  args: string[],
  opts: { cwd: string; env?: NodeJS.ProcessEnv; onLine?: (l: string) => void },
): Promise<string> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(cmd, args, {
      cwd: opts.cwd,
      env: { ...process.env, ...opts.env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    let partial = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => {
      const text = partial + d.toString();
      const lines = text.split('\n');
      partial = lines.pop() ?? '';
      for (const l of lines) {
        err += l + '\n';
        opts.onLine?.(l);
      }
    });
    child.on('error', reject);
    child.on('close', (code) => {
      if (code === 0) resolvePromise(out);
      else
        reject(
          new Error(
            `${cmd} ${args.join(' ')} (in ${opts.cwd}) exited ${code}:\n${(err + partial).split('\n').slice(-40).join('\n')}`,
          ),
        );
    });
  });
}

const goEnv = { CGO_ENABLED: '0', GOFLAGS: '-mod=readonly' };

/**
 * Applies one patch to `text` (the upstream file).
 * @throws Error naming the file and the text when a `from` does not occur exactly once (the
 *   pinned upstream file is not the one the patch was written for: update the patch).
 */
export function applySourcePatch(patch: GoSourcePatch, text: string): string {
  let out = text;
  for (const { from, to } of patch.replace) {
    const count = out.split(from).length - 1;
    if (count !== 1)
      throw new Error(
        `patch of ${patch.module}/${patch.file}: expected the text below exactly once, found it ${count} times ` +
          `(upstream differs from what the patch was written for; update the patch):\n${from}`,
      );
    out = out.replace(from, () => to);
  }
  return out;
}

/** Copies a folder tree with files and folders writable (the module cache's are read-only). */
function copyWritable(from: string, to: string): void {
  mkdirSync(to, { recursive: true });
  for (const entry of readdirSync(from, { withFileTypes: true })) {
    const src = join(from, entry.name);
    const dst = join(to, entry.name);
    if (entry.isDirectory()) copyWritable(src, dst);
    else if (entry.isFile()) {
      copyFileSync(src, dst);
      chmodSync(dst, 0o644);
    }
  }
}

/**
 * Makes the patched module copies of `tool` under `dir/src/` and a go.mod for `-modfile`: the
 * wrapper's go.mod (and go.sum) plus one `replace <module> => <copy>` per patched module. Go
 * refuses `-overlay` for files in the module cache, hence whole-module copies; only the
 * patched files differ from upstream.
 * @returns the generated go.mod's path, or undefined when the tool has no patches.
 * @throws Error when a module is not in the build list or a patch does not apply.
 */
async function writePatchedModules(tool: GoTool, cwd: string, dir: string): Promise<string | undefined> {
  if (!tool.patches?.length) return undefined;
  const root = join(dir, 'src');
  rmSync(root, { recursive: true, force: true });
  const replaces: string[] = [];
  for (const patch of tool.patches) {
    // Version first: a folder may contain spaces, a version cannot.
    const info = (
      await run('go', ['list', '-m', '-f', '{{.Version}} {{.Dir}}', patch.module], { cwd, env: goEnv })
    ).trim();
    const [version, moduleDir] = [info.slice(0, info.indexOf(' ')), info.slice(info.indexOf(' ') + 1)];
    if (!version || !moduleDir) throw new Error(`${patch.module} is not downloaded in ${cwd}`);
    const copy = join(root, `${patch.module}@${version}`);
    if (!existsSync(copy)) {
      copyWritable(moduleDir, copy);
      replaces.push(`replace ${patch.module} => ${JSON.stringify(copy)}`);
    }
    const file = join(copy, patch.file);
    writeFileSync(file, applySourcePatch(patch, readFileSync(file, 'utf8')));
    for (const [name, text] of Object.entries(patch.add ?? {})) writeFileSync(join(dirname(file), name), text);
  }
  const gomod = join(root, 'go.mod');
  writeFileSync(gomod, `${readFileSync(join(cwd, 'go.mod'), 'utf8')}\n${replaces.join('\n')}\n`);
  copyFileSync(join(cwd, 'go.sum'), join(root, 'go.sum'));
  return gomod;
}

/**
 * Downloads and compiles one tool's packages into `tmpBin`, logging progress every 15 s.
 * @throws Error with the tail of the `go` output when a download, a patch or the build fails.
 */
async function buildTool(
  tool: GoTool,
  { dir, tmpBin, log }: { dir: string; tmpBin: string; log: (line: string) => void },
): Promise<void> {
  const cwd = join(GO_DIR, tool.module);
  const version = pinnedVersion(tool);
  log(`[build] ${tool.module} ${version}: downloading modules through the Go module proxy…`);
  await run('go', ['mod', 'download'], { cwd, env: goEnv });
  const modfile = await writePatchedModules(tool, cwd, dir);
  if (modfile) log(`[build] ${tool.module}: patched module copies under ${dirname(modfile)} (-modfile=${modfile})`);
  const modFlags = modfile ? [`-modfile=${modfile}`] : [];
  const deps = await run('go', ['list', ...modFlags, '-deps', ...tool.packages], { cwd, env: goEnv });
  // `go build -v` prints each package it compiles (the standard library too, on a cold cache).
  const total = deps.split('\n').filter(Boolean).length;
  let compiled = 0;
  const t0 = Date.now();
  const tick = setInterval(() => {
    const pct = Math.min(99, Math.round((100 * compiled) / Math.max(total, 1)));
    log(`[build] ${tool.module}: ${compiled}/${total} packages (${pct}%), ${Math.round((Date.now() - t0) / 1000)}s`);
  }, 15_000);
  try {
    const ldflags = ['-s', '-w', ...(tool.ldflags?.(version) ?? [])].join(' ');
    const flags = ['-v', '-trimpath', '-ldflags', ldflags, ...modFlags];
    for (const pkg of tool.packages) {
      log(`[build] ${tool.module}: compiling ${pkg}`);
      const out = join(tmpBin, binaryName(tool, pkg));
      await run('go', ['build', ...flags, '-o', out, pkg], { cwd, env: goEnv, onLine: () => compiled++ });
    }
  } finally {
    clearInterval(tick);
  }
  log(`[build] ${tool.module} ${version}: done in ${Math.round((Date.now() - t0) / 1000)}s`);
}

/**
 * Builds `tools` into `dir/bin` unless already there. Prints progress (packages compiled of
 * the total) every few seconds and the build time. Tools with {@link GoTool.patches} are
 * built from patched module copies (see {@link GoSourcePatch}).
 * @param log receives human-readable progress lines.
 * @returns the bin folder and whether anything was built.
 * @throws Error with the tail of the `go` output when a download or build fails, or when a
 *   patch no longer matches its upstream file.
 */
export async function buildGoTools(
  tools: readonly GoTool[],
  dir: string,
  log: (line: string) => void = (l) => process.stderr.write(l + '\n'),
): Promise<{ binDir: string; built: boolean }> {
  const binDir = join(dir, 'bin');
  const expected = tools.flatMap((t) => t.packages.map((p) => join(binDir, binaryName(t, p))));
  if (expected.every((p) => existsSync(p))) return { binDir, built: false };

  const started = Date.now();
  const tmpBin = join(dir, `bin.tmp-${process.pid}`);
  rmSync(tmpBin, { recursive: true, force: true });
  mkdirSync(tmpBin, { recursive: true });
  for (const tool of tools) await buildTool(tool, { dir, tmpBin, log });
  rmSync(binDir, { recursive: true, force: true });
  renameSync(tmpBin, binDir);
  writeFileSync(join(dir, 'BUILT'), `${new Date().toISOString()} in ${Math.round((Date.now() - started) / 1000)}s\n`);
  log(
    `[build] ${tools.map((t) => t.module).join(' + ')} built in ${Math.round((Date.now() - started) / 1000)}s → ${binDir}`,
  );
  return { binDir, built: true };
}

/**
 * Finds or builds the control-plane binaries.
 * - `KUBEBUILDER_ASSETS` set: uses `etcd` and `kube-apiserver` from there (and
 *   `kube-controller-manager` if present); builds nothing.
 * - otherwise: the cache for the pinned versions, building it first when missing.
 * @throws Error when `KUBEBUILDER_ASSETS` lacks a binary, or the build fails.
 */
export async function ensureControlPlaneBinaries(log?: (line: string) => void): Promise<ControlPlaneBinaries> {
  const assets = process.env.KUBEBUILDER_ASSETS;
  if (assets) {
    const etcd = join(assets, 'etcd');
    const kubeApiserver = join(assets, 'kube-apiserver');
    for (const p of [etcd, kubeApiserver])
      if (!existsSync(p)) throw new Error(`KUBEBUILDER_ASSETS=${assets} has no ${p}`);
    const kcm = join(assets, 'kube-controller-manager');
    return {
      binDir: assets,
      etcd,
      kubeApiserver,
      kubeControllerManager: existsSync(kcm) ? kcm : undefined,
      origin: 'KUBEBUILDER_ASSETS',
    };
  }
  const { binDir, built } = await buildGoTools(CONTROL_PLANE_TOOLS, cacheDir(CONTROL_PLANE_TOOLS), log);
  return {
    binDir,
    etcd: join(binDir, 'etcd'),
    kubeApiserver: join(binDir, 'kube-apiserver'),
    kubeControllerManager: join(binDir, 'kube-controller-manager'),
    origin: built ? 'built' : 'cache',
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const bins = await ensureControlPlaneBinaries();
  console.log(`control plane binaries (${bins.origin}): ${bins.binDir}`);
}
