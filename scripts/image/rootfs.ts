/**
 * Running a command in a root file system the way a container runtime runs an image's
 * entrypoint, without one (root only): a private mount namespace (`unshare --mount`, so no
 * mount is ever visible outside it and all go when its last process exits) with `/proc`, a
 * few `/dev` nodes and a tmpfs on `/tmp`, the root bound read-only if asked, then
 * `unshare --root --wd --setgid --setuid` execs the command as the image's numeric user with
 * no capabilities. The process keeps the spawned PID (each step `exec`s the next), so a
 * signal reaches it directly. The host's network namespace is shared (the command listens on
 * the host's loopback); nothing of the host's /run, /var/log or network is changed.
 *
 * Also reads an OCI image layout tar (scripts/tools/go/image writes them) back into its config
 * and an unpacked root file system, with GNU tar: an independent reader of what was written.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { ImageConfig } from './images.ts';

const exec = promisify(execFile);

/** What to run in a root file system, and how. */
export interface RootfsRun {
  /** The root file system (an unpacked image, or a staged one). */
  root: string;
  /** The command and its arguments; the command is looked up in `env.PATH` inside `root`. */
  argv: readonly string[];
  /** Its whole environment (an image's `Env` plus what the test adds). */
  env: NodeJS.ProcessEnv;
  /** Numeric `uid:gid`, as in an image's `User`. */
  user: string;
  /** Its working folder inside `root`. */
  workdir: string;
  /** Root and `/tmp` read-only, as Kubernetes' `readOnlyRootFilesystem` (default true). */
  readOnly?: boolean;
  /** Host files copied into the private `/tmp` before the command starts: name there → host path. */
  files?: Readonly<Record<string, string>>;
}

// $1 root, $2 workdir, $3 uid, $4 gid, $5 ro|rw, then name/host-path pairs up to `--`, then argv.
const SCRIPT = `set -eu
root=$1 wd=$2 uid=$3 gid=$4 ro=$5; shift 5
mkdir -p "$root/proc" "$root/dev" "$root/tmp"
mount --bind "$root" "$root"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t tmpfs -o nosuid,noexec,mode=0755,size=64k dev "$root/dev"
for n in null zero full random urandom; do : > "$root/dev/$n"; mount --bind "/dev/$n" "$root/dev/$n"; done
mount -t tmpfs -o nosuid,nodev,mode=1777,size=64m tmp "$root/tmp"
while [ "$1" != -- ]; do cp "$2" "$root/tmp/$1"; chmod 0444 "$root/tmp/$1"; shift 2; done; shift
if [ "$ro" = ro ]; then mount -o remount,bind,ro "$root/tmp"; mount -o remount,bind,ro "$root"; fi
exec unshare --root="$root" --wd="$wd" --setgid="$gid" --setuid="$uid" -- "$@"`;

/** The PATH containerd gives a container whose image sets none. */
const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/**
 * The command line that runs `r` ({@link RootfsRun}), and the environment to spawn it with:
 * `r.env`, with containerd's default PATH when it has none (the host's tools need one too).
 * Missing mount points (`/proc`, `/dev`, `/tmp`) are created in `root`, as runc does.
 * @throws Error when `r.user` is not numeric `uid:gid` (or `uid`, then gid = uid).
 */
export function rootfsCommand(r: RootfsRun): { command: string; args: string[]; env: NodeJS.ProcessEnv } {
  const m = /^(\d+)(?::(\d+))?$/.exec(r.user);
  if (!m) throw new Error(`user ${JSON.stringify(r.user)} is not numeric uid[:gid]`);
  const files = Object.entries(r.files ?? {}).flat();
  const mode = r.readOnly === false ? 'rw' : 'ro';
  return {
    env: { PATH: DEFAULT_PATH, ...r.env },
    command: 'unshare',
    args: ['--mount', '--propagation', 'private', '--', '/bin/sh', '-c', SCRIPT, 'captf-rootfs'].concat([
      r.root,
      r.workdir,
      m[1]!,
      m[2] ?? m[1]!,
      mode,
      ...files,
      '--',
      ...r.argv,
    ]),
  };
}

/** An image read back from its tar. */
export interface UnpackedImage {
  /** The manifest digest (`sha256:…`) index.json names. */
  digest: string;
  /** The image name index.json gives (`io.containerd.image.name`). */
  ref: string;
  config: ImageConfig;
  os: string;
  architecture: string;
  /** The layers' history lines. */
  history: string[];
  /** The unpacked root file system. */
  root: string;
}

interface Descriptor {
  digest: string;
  annotations?: Record<string, string>;
}

/**
 * Unpacks an OCI image layout tar into `dir` (`dir/layout`, and its layers applied in order
 * into `dir/root`, owners and modes kept), checking every blob against its digest.
 * @throws Error when a blob's content does not match its digest, or the tar is not a layout.
 */
export async function unpackImage(tar: string, dir: string): Promise<UnpackedImage> {
  const layout = join(dir, 'layout');
  const root = join(dir, 'root');
  mkdirSync(layout, { recursive: true });
  mkdirSync(root, { recursive: true });
  chmodSync(root, 0o755);
  await exec('tar', ['-xf', tar, '-C', layout]);
  const blob = (d: Descriptor): Buffer => {
    const b = readFileSync(join(layout, 'blobs', ...d.digest.split(':')));
    const actual = `sha256:${createHash('sha256').update(b).digest('hex')}`;
    if (actual !== d.digest) throw new Error(`${tar}: blob ${d.digest} holds ${actual}`);
    return b;
  };
  const index = JSON.parse(readFileSync(join(layout, 'index.json'), 'utf8')) as { manifests: Descriptor[] };
  const top = index.manifests[0]!;
  const manifest = JSON.parse(blob(top).toString()) as { config: Descriptor; layers: Descriptor[] };
  const config = JSON.parse(blob(manifest.config).toString()) as {
    config: ImageConfig;
    os: string;
    architecture: string;
    history?: { created_by?: string }[];
  };
  for (const layer of manifest.layers) {
    blob(layer);
    const file = join(layout, 'blobs', ...layer.digest.split(':'));
    await exec('tar', ['-xzf', file, '-C', root, '--numeric-owner', '--same-owner', '--same-permissions']);
  }
  return {
    digest: top.digest,
    ref: top.annotations?.['io.containerd.image.name'] ?? '',
    config: config.config,
    os: config.os,
    architecture: config.architecture,
    history: (config.history ?? []).map((h) => h.created_by ?? ''),
    root,
  };
}
