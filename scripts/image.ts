/**
 * `npm run image [-- NAME…] [--force] [--compile-cache]`: builds the images of scripts/image/images.ts
 * without Docker (scripts/image/build.ts), by default the product (`captf-credentials`) and
 * `pause` (Knative's images, which the Serving node builds itself, by name), and prints one line per image on stdout: `<tar path> <sha256 digest>`.
 * Progress, the image name and size, and whether the tar was reused go to stderr. A tar is
 * reused only when its inputs and its own bytes are unchanged; `--force` rebuilds anyway.
 * `--compile-cache` adds a V8 compile cache warmed as the image's user to the product image
 * (written to `.cache/images/captf-credentials.compile-cache.tar`; not reproducible).
 *
 *   ctr -n k8s.io images import .cache/images/captf-credentials.tar
 *   skopeo copy oci-archive:.cache/images/captf-credentials.tar docker://<registry>/captf-credentials:<tag>
 */
import { parseArgs } from 'node:util';
import { buildImage } from './image/build.ts';
import { DEFAULT_IMAGES, IMAGES, type ImageName } from './image/images.ts';

const USAGE = `usage: npm run -s image [-- NAME…] [--force] [--compile-cache]
  NAME             ${Object.keys(IMAGES).join(', ')} (default: ${DEFAULT_IMAGES.join(', ')})
  --force          rebuild even when the inputs and the tar are unchanged
  --compile-cache  the product image with a V8 compile cache, as captf-credentials.compile-cache.tar (not reproducible)
Prints "<tar> <digest>" per image on stdout; progress on stderr. docs/deploy-knative.md has the rest.`;

try {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: { 'compile-cache': { type: 'boolean' }, force: { type: 'boolean' }, help: { type: 'boolean' } },
  });
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const unknown = positionals.filter((n) => !(n in IMAGES));
  if (unknown.length) throw new Error(`no image ${unknown.join(', ')}; the images: ${Object.keys(IMAGES).join(', ')}`);
  for (const name of (positionals.length ? positionals : DEFAULT_IMAGES) as ImageName[]) {
    const t0 = Date.now();
    const compileCache = name === 'captf-credentials' && values['compile-cache'];
    const r = await buildImage(name, { compileCache, force: values.force ?? false });
    const size = `${(r.bytes / 2 ** 20).toFixed(1)} MiB`;
    console.error(`[image] ${r.ref}: ${r.cached ? 'unchanged, reused' : 'built'} (${size}) in ${Date.now() - t0} ms`);
    console.log(`${r.path} ${r.digest}`);
  }
} catch (err) {
  // What went wrong in one line (apt, a bad argument, the builder), not a stack trace.
  process.stderr.write(`npm run image: ${err instanceof Error ? err.message : String(err)}\n${USAGE}\n`);
  process.exit(2);
}
