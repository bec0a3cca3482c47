/**
 * Finds or builds the Go tools of scripts/tools/registry.ts: one tool set at a time, from its
 * pinned wrapper modules under scripts/tools/go/ through the Go module proxy, into
 * `.cache/<set>/<versions>-<digest>/bin`, under a cross-process lock. A build happens only
 * when a wrapper's go.mod/go.sum, its own `.go` files or the set's patches change. `npm run
 * tools` builds them all.
 */
import { createHash, type Hash } from 'node:crypto';
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { runCommand } from '../lib/command.ts';
import { TOOLS, type GoSourcePatch, type GoTool, type ToolSet } from './registry.ts';

/** Repository root (two levels above this file). */
export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const GO_DIR = join(REPO_ROOT, 'scripts', 'tools', 'go');

/** Paths of the control-plane binaries; `kubeControllerManager` is absent with envtest assets. */
export interface ControlPlaneBinaries {
  etcd: string;
  kubeApiserver: string;
  kubeControllerManager?: string | undefined;
  /** Where they came from: `cache` (already built), `built` (just now) or `KUBEBUILDER_ASSETS`. */
  origin: 'cache' | 'built' | 'KUBEBUILDER_ASSETS';
}

/**
 * Reads the version a wrapper go.mod pins for `tool.versionOf` (from its `require`).
 * @throws Error when the go.mod does not require it.
 */
export function pinnedVersion(tool: Pick<GoTool, 'module' | 'versionOf'>): string {
  const gomod = readFileSync(join(GO_DIR, tool.module, 'go.mod'), 'utf8');
  const re = new RegExp(`^\\s*(?:require\\s+)?${tool.versionOf.replace(/[.]/g, '\\.')}\\s+(v\\S+)`, 'm');
  const m = re.exec(gomod);
  if (!m) throw new Error(`scripts/tools/go/${tool.module}/go.mod does not require ${tool.versionOf}`);
  return m[1]!;
}

/** The `.go` files of a wrapper module's own packages, relative to it, sorted. */
const ownGoFiles = (module: string): string[] =>
  readdirSync(join(GO_DIR, module), { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.go'))
    .sort();

/**
 * Cache folder of a tool set: module names and pinned versions, plus a digest of the wrapper
 * go.mod/go.sum (comment lines excluded), of the patches and of the wrapper's own `.go` files,
 * so any re-pin or source change rebuilds.
 */
export function cacheDir(set: ToolSet): string {
  const h = createHash('sha256');
  const parts: string[] = [];
  for (const t of TOOLS[set]) {
    hashTool(h, t);
    parts.push(`${t.module}-${pinnedVersion(t)}`);
  }
  return join(REPO_ROOT, '.cache', set, `${parts.join('_')}-${h.digest('hex').slice(0, 8)}`);
}

/** Adds to `h` what decides one tool's binaries (see {@link cacheDir}). */
function hashTool(h: Hash, t: GoTool): void {
  for (const f of ['go.mod', 'go.sum']) {
    const p = join(GO_DIR, t.module, f);
    // Comments do not change what is built, so editing one must not force a rebuild.
    if (existsSync(p)) h.update(readFileSync(p, 'utf8').replace(/^\s*\/\/.*$/gm, ''));
  }
  for (const part of buildOptionsKey(t)) h.update(part);
  // A wrapper's own Go packages (a builder's main): editing one rebuilds. Wrappers without
  // any keep their keys.
  for (const f of ownGoFiles(t.module)) h.update(`${f}\0${readFileSync(join(GO_DIR, t.module, f), 'utf8')}`);
}

/**
 * A tool's source patches, and its cgo and tags, as cache-key parts. Only tools that have them
 * hash them, so the keys of the others stay as they were.
 */
function buildOptionsKey({ patches = [], cgo = false, tags = [] }: GoTool): string[] {
  return [
    ...(patches.length ? [JSON.stringify(patches)] : []),
    ...(cgo || tags.length ? [JSON.stringify({ cgo, tags })] : []),
  ];
}

/** Names of the binaries a tool set builds, in registry order. */
const toolBinaries = (set: ToolSet): string[] => TOOLS[set].flatMap((t) => Object.keys(t.binaries));

// No VCS stamp: a wrapper's own main package (scripts/tools/go/image) would otherwise embed the
// repository's commit and dirty state, and its binary (the pause image) change with every commit.
const goEnv = { CGO_ENABLED: '0', GOFLAGS: '-mod=readonly -buildvcs=false' };

/**
 * Applies a patch's `replace` list to `text` (the upstream `file`).
 * @throws Error naming the file and the text when a `from` does not occur exactly once (the
 *   pinned upstream file is not the one the patch was written for: update the patch).
 */
export function applySourcePatch(patch: GoSourcePatch, text: string): string {
  let out = text;
  for (const { from, to } of patch.replace ?? []) {
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

/**
 * Applies one patch to `copy`, a writable copy of the patched module's folder: edits `file`,
 * writes `add`, deletes `delete`, then runs `go mod edit <goModEdit…>` on its go.mod.
 * @throws Error naming the module and file when a file to edit or delete does not exist, a
 *   `replace` does not apply, or `go mod edit` refuses a flag.
 */
export async function patchModuleCopy(patch: GoSourcePatch, copy: string): Promise<void> {
  const existing = (file: string) => {
    const p = join(copy, file);
    if (!existsSync(p))
      throw new Error(`patch of ${patch.module}: ${file} does not exist upstream (in ${copy}); update the patch`);
    return p;
  };
  if (patch.file)
    writeFileSync(existing(patch.file), applySourcePatch(patch, readFileSync(existing(patch.file), 'utf8')));
  const folder = join(copy, dirname(patch.file ?? '.'));
  for (const [name, text] of Object.entries(patch.add ?? {})) writeFileSync(join(folder, name), text);
  for (const file of patch.delete ?? []) rmSync(existing(file), { recursive: true });
  if (patch.goModEdit?.length)
    await runCommand('go', ['mod', 'edit', ...patch.goModEdit, existing('go.mod')], { cwd: copy });
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
 * refuses `-overlay` for files in the module cache, hence whole-module copies.
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
      await runCommand('go', ['list', '-m', '-f', '{{.Version}} {{.Dir}}', patch.module], { cwd, env: goEnv })
    ).trim();
    const [version, moduleDir] = [info.slice(0, info.indexOf(' ')), info.slice(info.indexOf(' ') + 1)];
    if (!version || !moduleDir) throw new Error(`${patch.module} is not downloaded in ${cwd}`);
    const copy = join(root, `${patch.module}@${version}`);
    if (!existsSync(copy)) {
      copyWritable(moduleDir, copy);
      replaces.push(`replace ${patch.module} => ${JSON.stringify(copy)}`);
    }
    await patchModuleCopy(patch, copy);
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
  await runCommand('go', ['mod', 'download'], { cwd, env: goEnv });
  const modfile = await writePatchedModules(tool, cwd, dir);
  if (modfile) log(`[build] ${tool.module}: patched module copies under ${dirname(modfile)} (-modfile=${modfile})`);
  const modFlags = modfile ? [`-modfile=${modfile}`] : [];
  const deps = await runCommand('go', ['list', ...modFlags, '-deps', ...Object.values(tool.binaries)], {
    cwd,
    env: goEnv,
  });
  // `go build -v` prints each package it compiles, and only those the build cache cannot serve,
  // which nothing counts beforehand (`go list`'s Stale is approximate: 709 of 1 229 stale right
  // after a build that compiled 36). So the count of compiled packages, and no percentage that
  // would sit near 0 % on a warm cache and then jump to done.
  const total = deps.split('\n').filter(Boolean).length;
  let compiled = 0;
  const t0 = Date.now();
  const tick = setInterval(() => {
    const s = Math.round((Date.now() - t0) / 1000);
    log(
      `[build] ${tool.module}: ${compiled} packages compiled so far (${total} in all; cached ones need no compiling), ${s}s`,
    );
  }, 15_000);
  try {
    const ldflags = ['-s', '-w', ...(tool.ldflags?.(version) ?? [])].join(' ');
    const tags = tool.tags?.length ? ['-tags', tool.tags.join(',')] : [];
    const flags = ['-v', '-trimpath', '-ldflags', ldflags, ...tags, ...modFlags];
    const env = tool.cgo ? { ...goEnv, CGO_ENABLED: '1' } : goEnv;
    for (const [name, pkg] of Object.entries(tool.binaries)) {
      log(`[build] ${tool.module}: compiling ${pkg}`);
      const out = join(tmpBin, name);
      await runCommand('go', ['build', ...flags, '-o', out, pkg], { cwd, env, onLines: (n) => (compiled += n) });
    }
  } finally {
    clearInterval(tick);
  }
  log(`[build] ${tool.module} ${version}: done in ${Math.round((Date.now() - t0) / 1000)}s`);
}

/** Builds a tool set into `<cacheDir>/bin` (replaced whole at the end), with progress lines. */
async function buildSet(set: ToolSet, log: (line: string) => void): Promise<void> {
  const dir = cacheDir(set);
  const started = Date.now();
  const tmpBin = join(dir, `bin.tmp-${process.pid}`);
  rmSync(tmpBin, { recursive: true, force: true });
  mkdirSync(tmpBin, { recursive: true });
  for (const tool of TOOLS[set]) await buildTool(tool, { dir, tmpBin, log });
  rmSync(join(dir, 'bin'), { recursive: true, force: true });
  renameSync(tmpBin, join(dir, 'bin'));
  const took = `${Math.round((Date.now() - started) / 1000)}s`;
  writeFileSync(join(dir, 'BUILT'), `${new Date().toISOString()} in ${took}\n`);
  log(`[build] ${set} built in ${took} → ${join(dir, 'bin')}`);
}

/** A build lock older than this is taken to be left by a killed process (ms). */
const STALE_LOCK_MS = 30 * 60_000;

/**
 * Runs `fn` while holding the lock folder `.cache/<name>.lock` (mkdir is atomic), waiting for
 * another holder first: `npm test` runs test files in parallel processes, and two of them
 * must not build one set (or one image, scripts/image/build.ts) at once (a build replaces the
 * whole bin folder when it finishes).
 */
export async function withBuildLock<T>(name: string, fn: () => Promise<T>): Promise<T> {
  const lock = join(REPO_ROOT, '.cache', `${name}.lock`);
  mkdirSync(dirname(lock), { recursive: true });
  for (;;) {
    try {
      mkdirSync(lock);
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      try {
        if (Date.now() - statSync(lock).mtimeMs > STALE_LOCK_MS) rmSync(lock, { recursive: true, force: true });
      } catch {
        // released meanwhile
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  }
  try {
    return await fn();
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}

/**
 * Path of one binary of a tool set when the whole set is built already; nothing is built.
 * @param binary default: the set's first binary.
 * @returns the absolute path, or undefined when the pinned versions are not built.
 * @throws Error when the set builds no such binary.
 */
export function builtTool(set: ToolSet, binary = toolBinaries(set)[0]!): string | undefined {
  if (!toolBinaries(set).includes(binary)) throw new Error(`tool set ${set} builds no ${binary}`);
  const bin = join(cacheDir(set), 'bin');
  return toolBinaries(set).every((b) => existsSync(join(bin, b))) ? join(bin, binary) : undefined;
}

/**
 * Finds or builds one binary of a tool set: `.cache/<set>/<versions>-<digest>/bin/<binary>`,
 * building the set first (under the build lock, progress lines to `log`) when it is missing.
 * @param binary default: the set's first binary.
 * @param log progress lines of the build (default stderr).
 * @returns the absolute path of the binary.
 * @throws Error with the tail of the `go` output when the download or build fails, or when a
 *   patch no longer matches its upstream module.
 */
export async function ensureTool(
  set: ToolSet,
  binary = toolBinaries(set)[0]!,
  log: (line: string) => void = (l) => process.stderr.write(l + '\n'),
): Promise<string> {
  const found = () => builtTool(set, binary);
  return (
    found() ??
    withBuildLock(set, async () => {
      // Another process may have built the set while this one waited for the lock.
      if (!found()) await buildSet(set, log);
      return found()!;
    })
  );
}

/**
 * Finds or builds the control-plane binaries.
 * - `KUBEBUILDER_ASSETS` set: uses `etcd` and `kube-apiserver` from there (and
 *   `kube-controller-manager` if present); builds nothing.
 * - otherwise: tool set `controlplane`, building it first when missing.
 * @throws Error when `KUBEBUILDER_ASSETS` lacks a binary, or the build fails.
 */
export async function ensureControlPlaneBinaries(log?: (line: string) => void): Promise<ControlPlaneBinaries> {
  const assets = process.env.KUBEBUILDER_ASSETS;
  const origin = assets ? 'KUBEBUILDER_ASSETS' : builtTool('controlplane') ? 'cache' : 'built';
  const binDir = assets ?? dirname(await ensureTool('controlplane', 'etcd', log));
  const [etcd, kubeApiserver, kcm] = ['etcd', 'kube-apiserver', 'kube-controller-manager'].map((b) => join(binDir, b));
  for (const p of [etcd!, kubeApiserver!])
    if (!existsSync(p)) throw new Error(`KUBEBUILDER_ASSETS=${assets} has no ${p}`);
  return {
    etcd: etcd!,
    kubeApiserver: kubeApiserver!,
    kubeControllerManager: existsSync(kcm!) ? kcm : undefined,
    origin,
  };
}

/** Path of kubectl when it was built already (nothing is built here). */
export const builtKubectlPath = (): string | undefined => builtTool('kubectl');
