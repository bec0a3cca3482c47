/**
 * The image's C and C++ runtime, from Debian packages fetched with apt (`apt-get download`,
 * verified against the SHA-256 in apt's signed lists, kept in `.cache/images/debs/`): only the
 * shared libraries the official Node binary links against (glibc ≥ 2.28, libstdc++, libgcc_s),
 * `os-release`, each package's copyright, and its control data in `/var/lib/dpkg/status.d/`
 * (where distroless images keep it, so image scanners know the packages and versions).
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { promisify } from 'node:util';

const exec = promisify(execFile);

/**
 * The packages, in Debian 12 (bookworm, the release of the Dockerfile's `NODE_IMAGE`):
 * libc6, libgcc-s1 and libstdc++6 are what `node` needs; gcc-12-base holds the copyright the
 * latter two point to; base-files gives `/etc/os-release`.
 */
export const DEBIAN_PACKAGES = ['base-files', 'libc6', 'libgcc-s1', 'gcc-12-base', 'libstdc++6'] as const;

/** The Debian release those packages must come from: the Dockerfile's `NODE_IMAGE` is `…-bookworm-slim`. */
export const DEBIAN_RELEASE = { codename: 'bookworm', version: '12' } as const;

/** One downloaded package. */
export interface DebianPackage {
  name: string;
  version: string;
  file: string;
}

/**
 * Whether a package's file (path relative to `/`) goes into the image: shared libraries
 * directly in a lib folder (not gconv's modules), os-release, and the copyright (or the
 * symlink to another package's documentation folder holding it).
 */
export function keepDebianFile(pkg: string, path: string): boolean {
  return (
    /^(usr\/)?lib(64)?\/([^/]+\/)?[^/]+\.so(\.[0-9]+)*$/.test(path) ||
    /^(etc|usr\/lib)\/os-release$/.test(path) ||
    path === `usr/share/doc/${pkg}` ||
    path === `usr/share/doc/${pkg}/copyright`
  );
}

const sha256File = (file: string): string => createHash('sha256').update(readFileSync(file)).digest('hex');

/**
 * Finds {@link DEBIAN_PACKAGES} at apt's candidate versions in `dir`, downloading what is
 * missing or does not match apt's SHA-256.
 * @throws Error naming `apt-get update` when apt knows no such package (no package lists yet),
 *   or when a download's SHA-256 differs from apt's.
 */
export async function fetchDebianPackages(dir: string): Promise<DebianPackage[]> {
  mkdirSync(dir, { recursive: true });
  const uris = await exec('apt-get', ['download', '--print-uris', ...DEBIAN_PACKAGES]).catch((err: Error) => {
    throw new Error(`apt-get download --print-uris failed (run \`apt-get update\` first): ${err.message}`);
  });
  // 'http://…/libc6_2.36-9%2bdeb12u14_amd64.deb' libc6_2.36-9+deb12u14_amd64.deb 2759320 SHA256:…
  const debs = uris.stdout
    .trim()
    .split('\n')
    .map((line) => {
      const [, file, , hash] = line.split(' ');
      const [name, version] = file!.split('_');
      return { name: name!, version: decodeURIComponent(version!), file: join(dir, file!), sha256: hash!.slice(7) };
    });
  const names = debs.map((d) => d.name);
  if (DEBIAN_PACKAGES.some((p) => !names.includes(p)))
    throw new Error(`apt offers ${names.join(', ')}; expected ${DEBIAN_PACKAGES.join(', ')}`);
  const missing = debs.filter((d) => !existsSync(d.file) || sha256File(d.file) !== d.sha256);
  if (missing.length)
    await exec('apt-get', ['download', ...missing.map((d) => `${d.name}=${d.version}`)], { cwd: dir });
  for (const d of debs)
    if (sha256File(d.file) !== d.sha256) throw new Error(`${d.file}: SHA-256 differs from apt's ${d.sha256}`);
  return DEBIAN_PACKAGES.map((name) => debs.find((d) => d.name === name)!);
}

/** Copies the kept files and symlinks of an unpacked package (`from`) into `root`. */
function copyKept(pkg: string, from: string, root: string): void {
  for (const entry of readdirSync(from, { recursive: true, withFileTypes: true })) {
    const src = join(entry.parentPath, entry.name);
    const path = relative(from, src);
    if (entry.isDirectory() || !keepDebianFile(pkg, path)) continue;
    const dst = join(root, path);
    mkdirSync(dirname(dst), { recursive: true });
    if (entry.isSymbolicLink()) symlinkSync(readlinkSync(src), dst);
    else copyFileSync(src, dst);
  }
}

/**
 * Puts the kept files of `debs` into the staged root file system `root`, with each package's
 * control data in `var/lib/dpkg/status.d/<package>`.
 */
export async function installDebianFiles(debs: readonly DebianPackage[], root: string): Promise<void> {
  const statusDir = join(root, 'var', 'lib', 'dpkg', 'status.d');
  mkdirSync(statusDir, { recursive: true });
  const tmp = mkdtempSync(join(dirname(root), 'deb-'));
  try {
    for (const deb of debs) {
      const unpacked = join(tmp, deb.name);
      await exec('dpkg-deb', ['-x', deb.file, unpacked]);
      copyKept(deb.name, unpacked, root);
      writeFileSync(join(statusDir, deb.name), (await exec('dpkg-deb', ['-f', deb.file])).stdout);
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  const problem = releaseProblem(readFileSync(join(root, 'usr', 'lib', 'os-release'), 'utf8'));
  if (problem) throw new Error(problem);
}

/**
 * apt downloads the host's release: packages of another one (a Debian 13 or Ubuntu host) would
 * pass for Debian 12 in the image's history and beside the Dockerfile's Node image.
 * @param osRelease the text of the unpacked `usr/lib/os-release` (from base-files).
 * @returns what is wrong, naming the release found and the one needed; undefined when right.
 */
export function releaseProblem(osRelease: string): string | undefined {
  const field = (name: string) =>
    new RegExp(`^${name}=(.*)$`, 'm').exec(osRelease)?.[1]?.replace(/"/g, '') ?? 'unknown';
  const [id, codename] = [field('ID'), field('VERSION_CODENAME')];
  const { codename: want, version } = DEBIAN_RELEASE;
  if (id === 'debian' && codename === want) return undefined;
  return `apt on this host offers packages of ${id} ${codename}, but the image's base is Debian ${version} (${want}), the release of the Dockerfile's NODE_IMAGE: build on a Debian ${version} host, or point apt at ${want}`;
}
