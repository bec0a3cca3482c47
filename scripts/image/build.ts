/**
 * Builds an image of scripts/image/images.ts without a daemon: stages its root file system
 * under `.cache/images/work/`, then `captf-image` (scripts/tools/go/image, go-containerregistry)
 * writes `.cache/images/<name>.tar`, an OCI image layout tar: `ctr images import` (which prefers
 * the OCI index) and `skopeo copy oci-archive:…` keep its manifest digest; Docker's manifest.json
 * beside it lets `docker load` and `crane push` take it too (they compute digests of their own).
 *
 * Reproducible: the same staged files give the same bytes and digest (fixed time from
 * `SOURCE_DATE_EPOCH`, default 1970; byte-ordered entries; root owner; normalized modes; pinned
 * gzip). Cached: the tar is reused when a digest of the staged files, the spec and the builder
 * equals the one stored beside it in `<name>.json`, so staging (bundles, Debian files) is the
 * cost of a call that changes nothing.
 */
import { execFile } from 'node:child_process';
import { createHash, type Hash } from 'node:crypto';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { basename, join } from 'node:path';
import { promisify } from 'node:util';
import { REPO_ROOT, ensureTool, withBuildLock } from '../tools/build.ts';
import { IMAGES, type ImageName, type LayerSpec } from './images.ts';

const exec = promisify(execFile);

/** Where images are written. */
export const IMAGES_DIR = join(REPO_ROOT, '.cache', 'images');

/** What {@link buildImage} produced (also stored as `<tar>.json` beside the tar). */
export interface BuiltImage {
  name: ImageName;
  /** The name index.json gives it, e.g. `ko.local/captf-credentials:0.1.0`. */
  ref: string;
  /** The OCI image layout tar. */
  path: string;
  /** The image manifest's digest, as a registry or containerd shows it. */
  digest: string;
  /** Size of the tar. */
  bytes: number;
  /** The layers: compressed digest and size. */
  layers: { digest: string; diffID: string; size: number }[];
  /** Digest of the inputs (staged files, spec, builder); equal inputs reuse the tar. */
  key: string;
  /** SHA-256 of the tar file itself: a tar that changed since it was written is never reused. */
  sha256: string;
  /** True when the tar was reused. */
  cached: boolean;
}

/** Options of {@link buildImage}. */
export interface BuildImageOptions {
  /** Product image with a V8 compile cache (not reproducible); written to `<name>.compile-cache.tar`. */
  compileCache?: boolean;
  /** Another tar to write (default `.cache/images/<name>.tar`). */
  out?: string;
  /** Build even when the stored key matches. */
  force?: boolean;
  /** Progress lines (default stderr). */
  log?: (line: string) => void;
}

const created = (): string =>
  new Date(process.env.SOURCE_DATE_EPOCH ? Number(process.env.SOURCE_DATE_EPOCH) * 1000 : 0).toISOString();

const ARCHITECTURES: Record<string, string> = { x64: 'amd64', arm64: 'arm64' };

/** Feeds a staged tree into `h`: path, kind, mode and content (or link target) of every entry, in byte order. */
function hashTree(h: Hash, root: string, rel = ''): void {
  for (const name of readdirSync(join(root, rel)).sort()) {
    const path = rel ? `${rel}/${name}` : name;
    const file = join(root, path);
    const st = lstatSync(file);
    h.update(`${path}\0${st.mode}\0`);
    if (st.isSymbolicLink()) h.update(readlinkSync(file));
    else if (st.isDirectory()) hashTree(h, root, path);
    else h.update(readFileSync(file));
    h.update('\0');
  }
}

/** The inputs' digest: the spec without staging paths, the staged files, the builder's path (keyed by its source). */
function inputKey(spec: object, layers: LayerSpec[], builder: string): string {
  const h = createHash('sha256');
  h.update(JSON.stringify({ spec, layers: layers.map((l) => ({ ...l, root: undefined })), builder }));
  hashTree(h, layers[0]!.root);
  return h.digest('hex');
}

/** The `.json` stored beside a tar; undefined when absent or unreadable (the tar is then rebuilt). */
/** Whether the tar is the one its `.json` describes (a damaged or edited tar is rebuilt). */
function intact(out: string, meta: BuiltImage): boolean {
  return existsSync(out) && lstatSync(out).size === meta.bytes && fileSha256(out) === meta.sha256;
}

const fileSha256 = (file: string): string => createHash('sha256').update(readFileSync(file)).digest('hex');

function readMeta(file: string): BuiltImage | undefined {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as BuiltImage;
  } catch {
    return undefined;
  }
}

/**
 * Finds or builds an image (see the file comment), under a lock per output tar.
 * @returns where it is, its digest, and whether it was reused.
 * @throws Error when staging fails (apt, esbuild, warming) or the builder exits non-zero.
 */
export async function buildImage(name: ImageName, opts: BuildImageOptions = {}): Promise<BuiltImage> {
  const log = opts.log ?? ((l: string) => process.stderr.write(`${l}\n`));
  const out = opts.out ?? join(IMAGES_DIR, `${name}${opts.compileCache ? '.compile-cache' : ''}.tar`);
  const id = basename(out, '.tar');
  return withBuildLock(`image-${id}`, async () => {
    const builder = await ensureTool('imagebuild', 'captf-image', log);
    const root = join(IMAGES_DIR, 'work', `${id}-${process.pid}`);
    rmSync(root, { recursive: true, force: true });
    mkdirSync(root, { recursive: true });
    try {
      const def = IMAGES[name];
      const layers = await def.stage(root, { log, compileCache: opts.compileCache ?? false });
      const architecture = ARCHITECTURES[process.arch] ?? process.arch;
      // The variant with a warmed cache points Node at it; the reproducible image has none.
      const config = opts.compileCache
        ? { ...def.config, Env: [...(def.config.Env ?? []), 'NODE_COMPILE_CACHE=/app/compile-cache'] }
        : def.config;
      const spec = { ref: def.ref, created: created(), os: 'linux', architecture, config };
      const key = inputKey(spec, layers, builder);
      const meta = readMeta(`${out}.json`);
      if (!opts.force && meta?.key === key && intact(out, meta)) return { ...meta, cached: true };
      return await writeImage({ name, out, key, builder }, { ...spec, layers });
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
}

/** Runs the builder on `spec` into a temporary tar, then moves it and its `.json` into place. */
async function writeImage(
  target: { name: ImageName; out: string; key: string; builder: string },
  spec: { ref: string; layers: LayerSpec[] },
): Promise<BuiltImage> {
  const { out, builder } = target;
  mkdirSync(join(out, '..'), { recursive: true });
  const tmp = `${out}.tmp-${process.pid}`;
  const specFile = `${tmp}.spec.json`;
  writeFileSync(specFile, JSON.stringify({ ...spec, out: tmp }));
  try {
    const { stdout } = await exec(builder, [specFile], { maxBuffer: 1 << 20 });
    const r = JSON.parse(stdout) as { digest: string; layers: BuiltImage['layers'] };
    renameSync(tmp, out);
    const built: BuiltImage = {
      name: target.name,
      ref: spec.ref,
      path: out,
      digest: r.digest,
      bytes: lstatSync(out).size,
      sha256: fileSha256(out),
      layers: r.layers,
      key: target.key,
      cached: false,
    };
    writeFileSync(`${out}.json`, `${JSON.stringify(built, null, 2)}\n`);
    return built;
  } finally {
    rmSync(tmp, { force: true });
    rmSync(specFile, { force: true });
  }
}
