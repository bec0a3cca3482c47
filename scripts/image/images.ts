/**
 * The images `npm run image` builds (scripts/image/build.ts), each as a staged root file system
 * plus its config:
 * - `captf-credentials`, the product (SPEC §13): the Dockerfile's runtime stage without Docker.
 *   Same `/app/dist`, ENTRYPOINT, ENV, USER, WORKDIR, EXPOSE and Node binary (the `node`
 *   devDependency is the official linux build the `node:<version>-bookworm-slim` image ships);
 *   the base is not bookworm-slim but only what that binary needs from Debian 12 (./debian.ts):
 *   no shell, no package manager, no setuid programs, about 7 MB instead of 75 MB, five pinned-by-apt
 *   packages instead of ninety.
 * - `pause`, the process of a pod's sandbox container: the sandbox image a node's containerd
 *   runs once per pod (set as its `sandbox_image`), so a test node needs no registry.
 */
import { spawn } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  constants,
  copyFileSync,
  cpSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { buildBundles } from '../lib/bundles.ts';
import { onLines } from '../lib/process.ts';
import { REPO_ROOT, ensureTool, pinnedVersion, withBuildLock } from '../tools/build.ts';
import { EVENTING_PROGRAMS, TOOLS, type ToolSet } from '../tools/registry.ts';
import { DEBIAN_RELEASE, fetchDebianPackages, installDebianFiles } from './debian.ts';
import { rootfsCommand } from './rootfs.ts';

/** The fields of an OCI image config's `config` the images set (go-containerregistry's names). */
export interface ImageConfig {
  Entrypoint: string[];
  Env?: string[];
  User: string;
  WorkingDir?: string;
  ExposedPorts?: Record<string, Record<string, never>>;
}

/** One layer: top-level entries of the staged root, walked recursively (scripts/tools/go/image). */
export interface LayerSpec {
  root: string;
  paths: string[];
  /** Every write bit removed, as the Dockerfile's `chmod -R a-w /app`. */
  readOnly?: boolean;
  /** The layer's history line. */
  createdBy: string;
}

/** What staging may do and say. */
export interface StageOptions {
  log: (line: string) => void;
  /** Warm a V8 compile cache into the product image (not reproducible: see docs/deploy-knative.md). */
  compileCache: boolean;
}

/** An image: its name in tars and containerd, its config, and how its root file system is staged. */
export interface ImageDefinition {
  ref: string;
  config: ImageConfig;
  /** Fills the empty folder `root` and says which of it goes into which layer. */
  stage(root: string, opts: StageOptions): Promise<LayerSpec[]>;
}

const NODE_DIR = join(REPO_ROOT, 'node_modules', 'node');
const readJson = (file: string) => JSON.parse(readFileSync(file, 'utf8')) as { version: string };

/** The pinned Knative versions: Eventing and Serving. */
const [EVENTING_VERSION, SERVING_VERSION] = [TOOLS.knative[0]!, TOOLS.serving[0]!].map((t) => pinnedVersion(t));

/** The version of the `node` devDependency, whose binary the product image runs. */
export const NODE_VERSION = readJson(join(NODE_DIR, 'package.json')).version;

/** The product image's user: any non-root UID works; 65532 matches the manifests. */
export const PRODUCT_USER = '65532:65532';

/** The product image's config: the Dockerfile's final stage, plus the node image's PATH and NODE_VERSION. */
export const PRODUCT_CONFIG: ImageConfig = {
  Entrypoint: ['node', '/app/dist/main.mjs'],
  Env: [
    'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
    `NODE_VERSION=${NODE_VERSION}`,
    'NODE_ENV=production',
    'PORT=8080',
  ],
  User: PRODUCT_USER,
  WorkingDir: '/app',
  ExposedPorts: { '8080/tcp': {} },
};

/** The product image's /etc: accounts as distroless has them (so 65532 has a name), and name lookup order. */
const ETC_FILES: Record<string, string> = {
  passwd: 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n',
  group: 'root:x:0:\nnonroot:x:65532:\n',
  'nsswitch.conf': 'passwd: files\ngroup: files\nhosts: files dns\n',
};

/** Folder of downloaded Debian packages (inputs, kept between builds). */
const DEBS_DIR = join(REPO_ROOT, '.cache', 'images', 'debs');

/**
 * `npm run build` into `dist/`, copied to `to`: a bundle's source map names its sources
 * relative to its folder, and its chunks' names hash that, so only a build one level below the
 * repository gives the files the Dockerfile's build stage (`/src/dist`) gives.
 */
async function stageDist(to: string): Promise<void> {
  await withBuildLock('dist', async () => cpSync((await buildBundles()).outdir, to, { recursive: true }));
}

/** The product's root file system: Debian's runtime libraries, node, /etc, and /app. */
async function stageProduct(root: string, opts: StageOptions): Promise<LayerSpec[]> {
  for (const d of ['etc', 'dev', 'proc', 'sys', 'tmp', 'usr/local/bin']) mkdirSync(join(root, d), { recursive: true });
  chmodSync(join(root, 'tmp'), 0o1777);
  const debs = await fetchDebianPackages(DEBS_DIR);
  await installDebianFiles(debs, root);
  copyFileSync(join(NODE_DIR, 'bin', 'node'), join(root, 'usr', 'local', 'bin', 'node'), constants.COPYFILE_FICLONE);
  for (const [name, text] of Object.entries(ETC_FILES)) writeFileSync(join(root, 'etc', name), text);
  await stageDist(join(root, 'app', 'dist'));
  if (opts.compileCache) await warmCompileCacheIn(root, opts.log);
  const packages = debs.map((d) => `${d.name} ${d.version}`).join(', ');
  return [
    {
      root,
      paths: readdirSync(root).filter((n) => n !== 'app'),
      createdBy: `captf: Debian ${DEBIAN_RELEASE.version} (${DEBIAN_RELEASE.codename}) ${packages}; node ${NODE_VERSION} (npm package node) at /usr/local/bin`,
    },
    {
      root,
      paths: ['app'],
      readOnly: true,
      createdBy: `captf: /app/dist (npm run build)${opts.compileCache ? ', /app/compile-cache warmed as 65532' : ''}`,
    },
  ];
}

/**
 * Starts each function once inside the staged image, as the image's user (V8 keys its cache
 * folder by UID: one written as root is never read by 65532), with scripts/lib/warm-compile-cache.ts.
 * @throws Error with the output when warming fails.
 */
async function warmCompileCacheIn(root: string, log: (line: string) => void): Promise<void> {
  const cache = join(root, 'app', 'compile-cache');
  mkdirSync(cache);
  chownSync(cache, 65532, 65532);
  // NODE_COMPILE_CACHE is not set for the warming script itself (it sets it for each function).
  const env = Object.fromEntries(PRODUCT_CONFIG.Env!.map((e) => e.split(/=(.*)/s) as [string, string]));
  const run = rootfsCommand({
    root,
    argv: ['node', '/tmp/warm-compile-cache.ts', '/app/compile-cache', '/app/dist'],
    env,
    user: PRODUCT_USER,
    workdir: '/app',
    readOnly: false,
    files: { 'warm-compile-cache.ts': join(REPO_ROOT, 'scripts', 'lib', 'warm-compile-cache.ts') },
  });
  const child = spawn(run.command, run.args, { env: run.env, stdio: ['ignore', 'pipe', 'pipe'] });
  const out: string[] = [];
  for (const s of [child.stdout, child.stderr]) onLines(s, (l) => out.push(l));
  const code = await new Promise<number | null>((r) => child.once('close', r));
  if (code !== 0) throw new Error(`warming the compile cache exited ${code}:\n${out.join('\n')}`);
  log(`[image] ${out.join(' ')}`);
}

/** The pause image: the static `pause` binary at `/pause`, nothing else. */
async function stagePause(root: string, opts: StageOptions): Promise<LayerSpec[]> {
  copyFileSync(await ensureTool('imagebuild', 'pause', opts.log), join(root, 'pause'));
  return [{ root, paths: ['pause'], createdBy: 'captf: /pause (scripts/tools/go/image/pause)' }];
}

/**
 * A Knative program's image laid out as `ko` builds it (the static binary at `/ko-app/<name>`,
 * run as 65532), without ko's base image: no CA bundle or time zones, which nothing on the test
 * node needs (it reaches nothing outside the cluster).
 */
function goProgramImage(set: ToolSet, binary: string, ref: string): ImageDefinition {
  const path = `/ko-app/${binary}`;
  return {
    ref,
    // ko's defaults: KO_DATA_PATH (Knative reads nothing from it here) and the nonroot user.
    config: { Entrypoint: [path], Env: ['KO_DATA_PATH=/var/run/ko'], User: PRODUCT_USER, WorkingDir: '/' },
    stage: async (root, opts) => {
      mkdirSync(join(root, 'ko-app'));
      mkdirSync(join(root, 'etc'));
      copyFileSync(await ensureTool(set, binary, opts.log), join(root, 'ko-app', binary));
      for (const [name, text] of Object.entries(ETC_FILES)) writeFileSync(join(root, 'etc', name), text);
      return [{ root, paths: ['ko-app', 'etc'], createdBy: `captf: ${path} (tool set ${set})` }];
    },
  };
}

/** Knative Serving's programs (tool set `serving`): each one's image, named as the deployments' containers are. */
export const SERVING_PROGRAMS = ['activator', 'autoscaler', 'controller', 'queue', 'webhook'] as const;

/** Names of the images {@link IMAGES} defines. */
export type ImageName =
  | 'captf-credentials'
  | 'pause'
  | 'apiserver-receive-adapter'
  | `serving-${(typeof SERVING_PROGRAMS)[number]}`
  | keyof typeof EVENTING_PROGRAMS;

/** The images `npm run image` builds without a name: the product and the node's sandbox. */
export const DEFAULT_IMAGES: readonly ImageName[] = ['captf-credentials', 'pause'];

const VERSION = readJson(join(REPO_ROOT, 'package.json')).version;

/**
 * Every image. Names are `ko.local/…` with a fixed tag: Knative Serving resolves no digest for
 * that registry, and a node with `imagePullPolicy: IfNotPresent` uses the imported image.
 * Knative's own (Serving's and Eventing's programs) carry the version
 * of the module they are built from.
 */
export const IMAGES: Readonly<Record<ImageName, ImageDefinition>> = {
  'captf-credentials': { ref: `ko.local/captf-credentials:${VERSION}`, config: PRODUCT_CONFIG, stage: stageProduct },
  pause: {
    ref: 'ko.local/pause:captf-1',
    // registry.k8s.io/pause runs as 65535 too.
    config: { Entrypoint: ['/pause'], User: '65535:65535', WorkingDir: '/' },
    stage: stagePause,
  },
  'apiserver-receive-adapter': goProgramImage(
    'knative',
    'apiserver_receive_adapter',
    `ko.local/knative-apiserver-receive-adapter:${EVENTING_VERSION}`,
  ),
  ...(Object.fromEntries(
    Object.keys(EVENTING_PROGRAMS).map((p) => [
      p,
      goProgramImage('knative', p, `ko.local/knative-${p}:${EVENTING_VERSION}`),
    ]),
  ) as Record<keyof typeof EVENTING_PROGRAMS, ImageDefinition>),
  ...(Object.fromEntries(
    SERVING_PROGRAMS.map((p) => [
      `serving-${p}`,
      goProgramImage('serving', `serving-${p}`, `ko.local/knative-serving-${p}:${SERVING_VERSION}`),
    ]),
  ) as Record<`serving-${(typeof SERVING_PROGRAMS)[number]}`, ImageDefinition>),
};
