/**
 * The production bundles (SPEC §13), built with esbuild for `npm run build` and the bench:
 * scripts/build.ts describes the files (`dist/main.mjs` with a chunk per function,
 * `dist/captf-runner.mjs`) and how they are built.
 */
import { rmSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { build, type BuildOptions, type Metafile } from 'esbuild';
import { REPO_ROOT } from '../tools/build.ts';

/** What {@link buildBundles} produced. */
export interface BuildResult {
  outdir: string;
  /** `dist/main.mjs`: the functions' entry point. */
  main: string;
  /** `dist/captf-runner.mjs`: the runner entry point. */
  runner: string;
  /** Total bytes of every emitted .mjs file. */
  bytes: number;
  metafile: Metafile;
}

// Some CommonJS dependencies call require() for Node built-ins; in an ESM bundle that needs
// a real require, and a few read __dirname/__filename.
const BANNER = [
  "import { createRequire as __captfCreateRequire } from 'node:module';",
  "import { fileURLToPath as __captfFileURLToPath } from 'node:url';",
  "import { dirname as __captfDirname } from 'node:path';",
  'const require = __captfCreateRequire(import.meta.url);',
  'const __filename = __captfFileURLToPath(import.meta.url);',
  'const __dirname = __captfDirname(__filename);',
].join('\n');

/** How every bundle is built: one ESM file per entry (and chunks), minified as shipped. */
const COMMON: BuildOptions = {
  absWorkingDir: REPO_ROOT,
  bundle: true,
  platform: 'node',
  target: 'node24',
  format: 'esm',
  outExtension: { '.js': '.mjs' },
  minifySyntax: true,
  minifyWhitespace: true,
  keepNames: true,
  sourcemap: 'linked',
  legalComments: 'linked',
  banner: { js: BANNER },
  metafile: true,
  logLevel: 'warning',
};

/**
 * Bundles `functions/main.ts` and `functions/runner/index.ts` into `outdir` (wiped first).
 * @param opts.splitting one chunk per function (default true).
 * @returns the entry files and total size.
 * @throws esbuild's error (with file and line) when a source does not compile.
 */
export async function buildBundles(opts: { outdir?: string; splitting?: boolean } = {}): Promise<BuildResult> {
  const outdir = resolve(REPO_ROOT, opts.outdir ?? 'dist');
  rmSync(outdir, { recursive: true, force: true });
  const result = await build({
    ...COMMON,
    outdir,
    entryPoints: { main: 'functions/main.ts', 'captf-runner': 'functions/runner/index.ts' },
    splitting: opts.splitting ?? true,
    chunkNames: 'chunks/[name]-[hash]',
  });
  const metafile = result.metafile!;
  const files = Object.keys(metafile.outputs).filter((f) => f.endsWith('.mjs'));
  const bytes = files.reduce((n, f) => n + statSync(resolve(REPO_ROOT, f)).size, 0);
  return { outdir, main: join(outdir, 'main.mjs'), runner: join(outdir, 'captf-runner.mjs'), bytes, metafile };
}

/**
 * Bundles one other entry (a bench floor) exactly as the functions are bundled, into
 * `<outdir>/<entry's name>.mjs`.
 * @returns the bundle's path.
 * @throws esbuild's error when the entry does not compile.
 */
export async function bundleEntry(entry: string, outdir: string): Promise<string> {
  const result = await build({ ...COMMON, entryPoints: [resolve(REPO_ROOT, entry)], outdir });
  const out = Object.keys(result.metafile!.outputs).find((f) => f.endsWith('.mjs'))!;
  return resolve(REPO_ROOT, out);
}
