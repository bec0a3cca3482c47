/**
 * `npm run build`: bundles the functions and the runner for production with esbuild
 * (SPEC §13), so a cold start loads two files instead of resolving hundreds of modules:
 * - `dist/main.mjs` — `node dist/main.mjs <admission|mirror-sync|identity-status>`
 *   (functions/main.ts). Code splitting puts each function in its own chunk
 *   (`dist/chunks/…`), loaded only when that function starts; the shared libraries
 *   (client-node, express, winston) sit in shared chunks.
 * - `dist/captf-runner.mjs` — `node dist/captf-runner.mjs -- <command…>` (functions/runner).
 * ESM, Node 24 target, minified syntax and whitespace (names kept for stack traces), with
 * linked source maps (`node --enable-source-maps` uses them).
 *
 * Flags: `--outdir DIR` (default `dist`), `--no-splitting` (one self-contained main.mjs),
 * `--metafile` (writes DIR/meta.json for size analysis).
 */
import { rmSync, statSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { build, type BuildOptions, type Metafile } from 'esbuild';
import { REPO_ROOT } from './controlplane/build.ts';

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

/**
 * Bundles `functions/main.ts` and `functions/runner/index.ts` into `outdir` (wiped first).
 * @param opts.splitting one chunk per function (default true).
 * @returns the entry files and total size.
 * @throws esbuild's error (with file and line) when a source does not compile.
 */
export async function buildBundles(opts: { outdir?: string; splitting?: boolean } = {}): Promise<BuildResult> {
  const outdir = resolve(REPO_ROOT, opts.outdir ?? 'dist');
  rmSync(outdir, { recursive: true, force: true });
  const common: BuildOptions = {
    absWorkingDir: REPO_ROOT,
    bundle: true,
    platform: 'node',
    target: 'node24',
    format: 'esm',
    outdir,
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
  const result = await build({
    ...common,
    entryPoints: { main: 'functions/main.ts', 'captf-runner': 'functions/runner/index.ts' },
    splitting: opts.splitting ?? true,
    chunkNames: 'chunks/[name]-[hash]',
  });
  const metafile = result.metafile!;
  const files = Object.keys(metafile.outputs).filter((f) => f.endsWith('.mjs'));
  const bytes = files.reduce((n, f) => n + statSync(resolve(REPO_ROOT, f)).size, 0);
  return { outdir, main: join(outdir, 'main.mjs'), runner: join(outdir, 'captf-runner.mjs'), bytes, metafile };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: { outdir: { type: 'string' }, 'no-splitting': { type: 'boolean' }, metafile: { type: 'boolean' } },
  });
  const t0 = Date.now();
  const r = await buildBundles({
    ...(values.outdir ? { outdir: values.outdir } : {}),
    splitting: !values['no-splitting'],
  });
  if (values.metafile) writeFileSync(join(r.outdir, 'meta.json'), JSON.stringify(r.metafile));
  console.log(`built ${r.main} and ${r.runner} (${Math.round(r.bytes / 1024)} KiB of .mjs) in ${Date.now() - t0} ms`);
}
