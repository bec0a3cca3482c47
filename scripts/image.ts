/**
 * `npm run image [-- NAME…] [--compile-cache]`: builds the images of scripts/image/images.ts
 * without Docker (scripts/image/build.ts), by default all of them (`captf-credentials`, the
 * product, and `pause`), and prints one line per image on stdout: `<tar path> <sha256 digest>`.
 * Progress, the image name and size, and whether the tar was reused go to stderr.
 * `--compile-cache` adds a V8 compile cache warmed as the image's user to the product image
 * (written to `.cache/images/captf-credentials.compile-cache.tar`; not reproducible).
 *
 *   ctr -n k8s.io images import .cache/images/captf-credentials.tar
 *   skopeo copy oci-archive:.cache/images/captf-credentials.tar docker://<registry>/captf-credentials:<tag>
 */
import { parseArgs } from 'node:util';
import { buildImage } from './image/build.ts';
import { IMAGES, type ImageName } from './image/images.ts';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { 'compile-cache': { type: 'boolean' } },
});
const unknown = positionals.filter((n) => !(n in IMAGES));
if (unknown.length) throw new Error(`no image ${unknown.join(', ')}; the images: ${Object.keys(IMAGES).join(', ')}`);
for (const name of (positionals.length ? positionals : Object.keys(IMAGES)) as ImageName[]) {
  const t0 = Date.now();
  const r = await buildImage(name, { compileCache: name === 'captf-credentials' && values['compile-cache'] });
  const size = `${(r.bytes / 2 ** 20).toFixed(1)} MiB`;
  console.error(`[image] ${r.ref}: ${r.cached ? 'unchanged, reused' : 'built'} (${size}) in ${Date.now() - t0} ms`);
  console.log(`${r.path} ${r.digest}`);
}
