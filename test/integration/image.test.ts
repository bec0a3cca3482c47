/**
 * The image built without Docker (`npm run image`, scripts/image/) — SPEC §13:
 * - it is what the Dockerfile describes: the final stage's ENV, USER, WORKDIR, ENTRYPOINT and
 *   EXPOSE, the Node version and Debian release of its NODE_IMAGE, `/app/dist` as `npm run build`
 *   writes it, read-only (so a Dockerfile edit that the image command misses fails here);
 * - it is reproducible: a second build from nothing gives the same digest and bytes;
 * - its entrypoint starts each function from the unpacked root file system as UID 65532 on a
 *   read-only root, with no capabilities, in a private mount namespace (scripts/image/rootfs.ts),
 *   and answers `/healthz`; the pause image runs too. No process or mount outlives a test;
 * - it reaches a registry the way docs/deploy-knative.md tells a user to: `skopeo copy` of the
 *   tar into go-containerregistry's registry, which then serves it under the digest the build
 *   printed, by tag and by digest.
 * Needs root (mount namespaces, chroot); skipped otherwise.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  closeSync,
  cpSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { KubernetesObject } from '@kubernetes/client-node';
import { listeningLine, onLines, stopProcess } from '../../scripts/lib/process.ts';
import { knativeContainer } from '../../scripts/system/functions.ts';
import { KNATIVE_LAYOUT, render } from '../../scripts/tools/kustomize.ts';
import { FUNCTION_NAMES } from '../../scripts/lib/warm-compile-cache.ts';
import { buildImage, type BuiltImage } from '../../scripts/image/build.ts';
import { rootfsCommand, unpackImage, type UnpackedImage } from '../../scripts/image/rootfs.ts';
import { ensureTool, REPO_ROOT, withBuildLock } from '../../scripts/tools/build.ts';
import { controlPlaneDir, eventually } from '../helpers/cluster.ts';

const skip = process.getuid?.() === 0 ? false : 'needs root: mount namespaces and chroot';
const work = mkdtempSync(join(tmpdir(), 'captf-image-test-'));
let built: BuiltImage;
let image: UnpackedImage;

before(async () => {
  if (skip) return;
  // The same code and cache as `npm run image`: a tar whose inputs did not change is reused.
  built = await buildImage('captf-credentials', { log: () => undefined });
  image = await unpackImage(built.path, join(work, 'product'));
});
after(() => rmSync(work, { recursive: true, force: true }));

/** The final stage of the Dockerfile: its ENV, USER, WORKDIR, ENTRYPOINT, EXPOSE, and NODE_IMAGE. */
function parseDockerfile(text: string) {
  const lines = text
    .replace(/\\\n/g, ' ')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'));
  const nodeImage = /^ARG NODE_IMAGE=(\S+)/m.exec(lines.join('\n'))![1]!;
  const last = lines.map((l) => /^FROM\s/i.test(l)).lastIndexOf(true);
  const env: Record<string, string> = {};
  const out = { nodeImage, env, user: '', workdir: '', entrypoint: [] as string[], expose: [] as string[] };
  for (const line of lines.slice(last + 1)) {
    const [, op, arg] = /^(\w+)\s+(.*)$/.exec(line)!;
    const o = op!.toUpperCase();
    if (o === 'ENV') for (const m of arg!.matchAll(/(\w+)=("[^"]*"|\S+)/g)) env[m[1]!] = m[2]!.replace(/^"|"$/g, '');
    else if (o === 'USER') out.user = arg!;
    else if (o === 'WORKDIR') out.workdir = arg!;
    else if (o === 'ENTRYPOINT') out.entrypoint = JSON.parse(arg!) as string[];
    else if (o === 'EXPOSE') out.expose.push(...arg!.split(/\s+/));
  }
  return out;
}

const envOf = (img: UnpackedImage): Record<string, string> =>
  Object.fromEntries((img.config.Env ?? []).map((e) => e.split(/=(.*)/s) as [string, string]));

/** Runs `argv` in the image's root as its user, read-only, with a kubeconfig in /tmp; resolves on exit. */
function runInImage(img: UnpackedImage, argv: string[]): Promise<{ code: number | null; stdout: string }> {
  const cmd = rootfsCommand({ root: img.root, argv, env: envOf(img), user: img.config.User, workdir: '/' });
  const child = spawn(cmd.command, cmd.args, { env: cmd.env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stdout += d.toString()));
  return new Promise((res) => child.once('close', (code) => res({ code, stdout })));
}

/** Starts the image's entrypoint with `args` (the container's `args`); resolves once it listens. */
async function startImage(img: UnpackedImage, args: string[], extraEnv: Record<string, string>) {
  const cmd = rootfsCommand({
    root: img.root,
    argv: [...img.config.Entrypoint, ...args],
    env: { ...envOf(img), ...extraEnv },
    user: img.config.User,
    workdir: img.config.WorkingDir ?? '/',
    files: { kubeconfig: join(controlPlaneDir(), 'admin.kubeconfig') },
  });
  const child = spawn(cmd.command, cmd.args, { env: cmd.env, stdio: ['ignore', 'pipe', 'pipe'] });
  const kill = () => child.kill('SIGKILL');
  process.once('exit', kill);
  child.once('exit', () => process.off('exit', kill));
  const lines: string[] = [];
  const port = await new Promise<number>((res, rej) => {
    for (const s of [child.stdout, child.stderr])
      onLines(s, (l) => {
        lines.push(l);
        const bound = listeningLine(l);
        if (bound) res(bound.port);
      });
    child.once('exit', (code) => rej(new Error(`exited ${code} before listening:\n${lines.join('\n')}`)));
    setTimeout(() => rej(new Error(`did not listen within 30 s:\n${lines.join('\n')}`)), 30_000).unref();
  }).catch((err: unknown) => {
    kill();
    throw err;
  });
  return { child, port, lines };
}

/** Every process whose root is `root`, and every mount under it, as this host sees them. */
function leftovers(root: string): string[] {
  const procs = readdirSync('/proc').filter((p) => {
    if (!/^\d+$/.test(p)) return false;
    try {
      return readlinkSync(`/proc/${p}/root`) === root;
    } catch {
      return false;
    }
  });
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => l.includes(root));
  return [...procs.map((p) => `process ${p}`), ...mounts];
}

/** Path → SHA-256 of every file under `dir`. */
function tree(dir: string): Record<string, string> {
  const files = readdirSync(dir, { recursive: true, withFileTypes: true }).filter((e) => e.isFile());
  return Object.fromEntries(
    files.map((e) => {
      const p = join(e.parentPath, e.name);
      return [relative(dir, p), createHash('sha256').update(readFileSync(p)).digest('hex')];
    }),
  );
}

describe('the image is what the Dockerfile describes', { skip }, () => {
  const docker = parseDockerfile(readFileSync(join(REPO_ROOT, 'Dockerfile'), 'utf8'));

  it('has the final stage ENV, USER, WORKDIR, ENTRYPOINT and EXPOSE', () => {
    const env = envOf(image);
    assert.deepEqual(Object.keys(docker.env).sort(), ['NODE_ENV', 'PORT'], JSON.stringify(docker));
    for (const [k, v] of Object.entries(docker.env)) assert.equal(env[k], v, `ENV ${k}`);
    // Nothing else but what the node base image sets (and the image has use for).
    const extra = Object.keys(env).filter((k) => !(k in docker.env));
    assert.deepEqual(extra.sort(), ['NODE_VERSION', 'PATH']);
    assert.equal(image.config.User, docker.user);
    assert.equal(image.config.WorkingDir, docker.workdir);
    assert.deepEqual(image.config.Entrypoint, docker.entrypoint);
    const exposed = docker.expose.map((p) => (p.includes('/') ? p : `${p}/tcp`)).sort();
    assert.deepEqual(Object.keys(image.config.ExposedPorts ?? {}).sort(), exposed);
    assert.equal(`${image.os}/${image.architecture}`, `linux/${process.arch === 'x64' ? 'amd64' : process.arch}`);
  });

  it("runs NODE_IMAGE's Node version on its Debian release, as the user, and cannot write", async () => {
    const [, version, codename] = /^node:(\d+\.\d+\.\d+)-(\w+)/.exec(docker.nodeImage)!;
    const probe = `const fs = require('node:fs');
      const tryWrite = (d) => { try { fs.writeFileSync(d + '/probe', 'x'); return 'written'; } catch (e) { return e.code; } };
      console.log(JSON.stringify({ version: process.version, uid: process.getuid(), gid: process.getgid(),
        groups: process.getgroups(), writes: ['/', '/app', '/app/dist', '/tmp', '/etc'].map(tryWrite) }));`;
    const r = await runInImage(image, ['node', '-e', probe]);
    assert.equal(r.code, 0, r.stdout);
    const out = JSON.parse(r.stdout) as {
      version: string;
      uid: number;
      gid: number;
      groups: number[];
      writes: string[];
    };
    assert.equal(out.version, `v${version}`);
    assert.deepEqual([out.uid, out.gid, out.groups], [65532, 65532, [65532]]);
    assert.deepEqual(out.writes, ['EROFS', 'EROFS', 'EROFS', 'EROFS', 'EROFS']);
    assert.match(
      readFileSync(join(image.root, 'etc', 'os-release'), 'utf8'),
      new RegExp(`^VERSION_CODENAME=${codename}$`, 'm'),
    );
  });

  it('holds in /app exactly dist/ as `npm run build` writes it, read-only (no compile cache: see the docs)', async () => {
    // What `npm run build` wrote to dist/ while the image was staged (the Dockerfile's build
    // stage writes the same: source maps name `../functions/…` from both).
    const dist = join(work, 'npm-run-build');
    await withBuildLock('dist', async () => cpSync(join(REPO_ROOT, 'dist'), dist, { recursive: true }));
    assert.deepEqual(readdirSync(join(image.root, 'app')), ['dist']);
    assert.deepEqual(tree(join(image.root, 'app', 'dist')), tree(dist));
    const map = JSON.parse(readFileSync(join(image.root, 'app', 'dist', 'main.mjs.map'), 'utf8')) as {
      sources: string[];
    };
    assert.deepEqual(map.sources, ['../functions/main.ts'], 'built one level below the repository, as in /src/dist');
    for (const e of readdirSync(join(image.root, 'app'), { recursive: true, encoding: 'utf8' })) {
      const st = statSync(join(image.root, 'app', e));
      assert.equal(st.mode & 0o222, 0, `${e} is writable`);
      assert.equal(st.uid, 0, `${e} is owned by root`);
    }
  });
});

describe('the image build is reproducible', { skip }, () => {
  it('a second build from nothing gives the same digest and the same bytes', async () => {
    const again = await buildImage('captf-credentials', {
      out: join(work, 'again.tar'),
      force: true,
      log: () => undefined,
    });
    assert.equal(again.cached, false);
    assert.equal(again.digest, built.digest);
    const sha = (f: string) => createHash('sha256').update(readFileSync(f)).digest('hex');
    assert.equal(sha(again.path), sha(built.path));
  });

  it('a tar changed since it was written is rebuilt, never reused under its old digest', async () => {
    const out = join(work, 'again.tar');
    const opts = { out, log: () => undefined };
    assert.equal((await buildImage('captf-credentials', opts)).cached, true, 'unchanged: reused');
    const fd = openSync(out, 'r+');
    writeSync(fd, Buffer.from('XXXX'), 0, 4, Math.floor(statSync(out).size / 2));
    closeSync(fd);
    const rebuilt = await buildImage('captf-credentials', opts);
    assert.equal(rebuilt.cached, false);
    assert.equal(rebuilt.digest, built.digest);
  });
});

/** Runs `skopeo` with `args`: its standard output as written; rejects with its output when it exits non-zero. */
function skopeo(args: string[]): Promise<string> {
  const child = spawn('skopeo', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  return new Promise((res, rej) => {
    child.once('error', rej);
    child.once('close', (code) => (code === 0 ? res(out) : rej(new Error(`skopeo ${args[0]} exited ${code}: ${err}`))));
  });
}

describe('the image reaches a registry as the install docs say', { skip }, () => {
  let registry: ChildProcess | undefined;
  after(async () => registry && (await stopProcess(registry)));

  it('skopeo copy of the tar: the registry serves it under the digest the build printed, by tag and by digest', async () => {
    registry = spawn(await ensureTool('imagebuild', 'registry'), ['-port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
    const port = await new Promise<number>((res, rej) => {
      onLines(registry!.stderr!, (l) => {
        const m = /serving on port (\d+)/.exec(l);
        if (m) res(Number(m[1]));
      });
      registry!.once('exit', (code) => rej(new Error(`the registry exited ${code}`)));
    });
    const repo = `localhost:${port}/captf-credentials`;
    // docs/deploy-knative.md "Build and push the image", with a plain-HTTP registry on loopback.
    await skopeo(['copy', '--dest-tls-verify=false', `oci-archive:${built.path}`, `docker://${repo}:0.1.0`]);
    const byTag = await skopeo(['inspect', '--tls-verify=false', '--format', '{{.Digest}}', `docker://${repo}:0.1.0`]);
    assert.equal(byTag.trim(), built.digest);
    const raw = await skopeo(['inspect', '--tls-verify=false', '--raw', `docker://${repo}@${built.digest}`]);
    assert.equal(`sha256:${createHash('sha256').update(raw).digest('hex')}`, built.digest);
    assert.equal((JSON.parse(raw) as { mediaType?: string }).mediaType, 'application/vnd.oci.image.manifest.v1+json');
  });
});

describe('the image runs each function as 65532 on a read-only root', { skip }, () => {
  let shipped: KubernetesObject[] = [];
  before(async () => {
    shipped = await render(KNATIVE_LAYOUT);
  });
  for (const fn of FUNCTION_NAMES) {
    it(`${fn}: answers /healthz, and nothing of it is left after SIGTERM`, async () => {
      // The event functions' sender settings as their Knative Services ship them.
      const senders = (knativeContainer(shipped, fn)?.env ?? []).filter((e) => e.name.startsWith('CAPTF_EVENT_'));
      const extra = {
        PORT: '0',
        KUBECONFIG: '/tmp/kubeconfig',
        CAPTF_ADMISSION_PLAIN_HTTP: 'true',
        ...Object.fromEntries(senders.map((e) => [e.name, e.value ?? ''])),
      };
      let started: Awaited<ReturnType<typeof startImage>> | undefined;
      try {
        started = await startImage(image, [fn], extra);
        const { child, port } = started;
        assert.equal((await fetch(`http://127.0.0.1:${port}/healthz`)).status, 200);
        const status = readFileSync(`/proc/${child.pid}/status`, 'utf8');
        assert.match(status, /^Uid:\s+65532\s+65532\s+65532\s+65532$/m);
        assert.match(status, /^Gid:\s+65532\s+65532\s+65532\s+65532$/m);
        assert.match(status, /^CapEff:\s+0+$/m);
        assert.equal(readlinkSync(`/proc/${child.pid}/root`), image.root);
        assert.equal(readlinkSync(`/proc/${child.pid}/cwd`), join(image.root, 'app'));
        assert.notEqual(readlinkSync(`/proc/${child.pid}/ns/mnt`), readlinkSync('/proc/self/ns/mnt'));
        const rootMount = readFileSync(`/proc/${child.pid}/mountinfo`, 'utf8')
          .split('\n')
          .find((l) => l.split(' ')[4] === '/');
        assert.match(rootMount ?? '', /^\S+ \S+ \S+ \S+ \/ ro[, ]/, rootMount);
        const exit = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
        child.kill('SIGTERM');
        assert.equal(await exit, 0, started.lines.join('\n'));
      } finally {
        if (started) await stopProcess(started.child as ChildProcess, 2000);
      }
      assert.deepEqual(leftovers(image.root), []);
    });
  }

  it('pause: the sandbox image runs as its user and exits 0 on SIGTERM', async () => {
    const pause = await buildImage('pause', { log: () => undefined });
    const img = await unpackImage(pause.path, join(work, 'pause'));
    assert.deepEqual(readdirSync(img.root), ['pause']);
    const cmd = rootfsCommand({
      root: img.root,
      argv: img.config.Entrypoint,
      env: {},
      user: img.config.User,
      workdir: '/',
    });
    const child = spawn(cmd.command, cmd.args, { env: cmd.env, stdio: 'ignore' });
    try {
      // The spawned shell sets up the mounts, then execs pause in its place: wait for that.
      const status = () => readFileSync(`/proc/${child.pid}/status`, 'utf8');
      await eventually('pause to replace the set-up shell', async () => /^Name:\s+pause$/m.test(status()), 30_000);
      // Right after the exec its runtime has not caught SIGTERM yet (the default action would
      // kill it): wait until the kernel lists SIGTERM (15, bit 14) among the caught signals.
      const catchesTerm = () => (BigInt(`0x${/^SigCgt:\s+([0-9a-f]+)$/m.exec(status())![1]}`) & 0x4000n) !== 0n;
      await eventually('pause to catch SIGTERM', async () => catchesTerm(), 30_000);
      assert.equal(child.exitCode, null, 'pause is still running');
      assert.match(status(), /^Uid:\s+65535\s/m);
      const exit = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
      child.kill('SIGTERM');
      assert.equal(await exit, 0);
    } finally {
      await stopProcess(child, 2000);
    }
    assert.deepEqual(leftovers(img.root), []);
  });
});
