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
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { buildBundles } from './lib/bundles.ts';

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
