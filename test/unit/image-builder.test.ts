/**
 * The daemonless image builder (scripts/tools/go/image, scripts/image/): what it writes does not
 * depend on how the files were staged (times, owners, umask), `readOnly` layers lose every write
 * bit, a file it cannot represent is an error, and which Debian files the image takes.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  statSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { keepDebianFile, releaseProblem } from '../../scripts/image/debian.ts';
import { unpackImage } from '../../scripts/image/rootfs.ts';
import { ensureTool } from '../../scripts/tools/build.ts';

const exec = promisify(execFile);
const work = mkdtempSync(join(tmpdir(), 'captf-image-builder-'));
after(() => rmSync(work, { recursive: true, force: true }));
const isRoot = process.getuid?.() === 0;

/** Stages a small tree whose metadata depends on `variant`: modes, times and (as root) owners. */
function stage(dir: string, variant: number): string {
  mkdirSync(join(dir, 'etc', 'sub'), { recursive: true });
  mkdirSync(join(dir, 'tmp'));
  mkdirSync(join(dir, 'app'));
  writeFileSync(join(dir, 'etc', 'sub', 'conf'), 'conf\n');
  writeFileSync(join(dir, 'etc', 'run'), '#!/bin/sh\n');
  writeFileSync(join(dir, 'app', 'main.mjs'), 'export {}\n');
  symlinkSync('sub/conf', join(dir, 'etc', 'link'));
  chmodSync(join(dir, 'tmp'), 0o1777);
  chmodSync(join(dir, 'etc', 'run'), variant ? 0o700 : 0o755);
  chmodSync(join(dir, 'etc', 'sub', 'conf'), variant ? 0o600 : 0o664);
  chmodSync(join(dir, 'etc', 'sub'), variant ? 0o700 : 0o775);
  utimesSync(join(dir, 'etc', 'sub', 'conf'), 1000 * variant, 1000 * variant);
  if (isRoot && variant) chownSync(join(dir, 'app', 'main.mjs'), 1234, 5678);
  return dir;
}

/** Runs the builder on `root` with two layers (the second read-only); resolves with its digest. */
async function build(root: string, out: string): Promise<string> {
  const spec = {
    out,
    ref: 'ko.local/test:1',
    created: '2001-02-03T04:05:06Z',
    os: 'linux',
    architecture: 'amd64',
    config: { Entrypoint: ['/etc/run'], User: '65532:65532' },
    layers: [
      { root, paths: ['tmp', 'etc'], createdBy: 'base' },
      { root, paths: ['app'], readOnly: true, createdBy: 'app' },
    ],
  };
  writeFileSync(`${out}.json`, JSON.stringify(spec));
  const { stdout } = await exec(await ensureTool('imagebuild', 'captf-image'), [`${out}.json`]);
  return (JSON.parse(stdout) as { digest: string }).digest;
}

describe('the image builder', () => {
  it('writes the same image from differently staged copies, with normalized modes, root owner and one time', async () => {
    const a = await build(stage(join(work, 'a'), 0), join(work, 'a.tar'));
    const b = await build(stage(join(work, 'b'), 1), join(work, 'b.tar'));
    assert.equal(a, b);
    const img = await unpackImage(join(work, 'b.tar'), join(work, 'b-unpacked'));
    assert.equal(img.digest, b);
    assert.equal(img.ref, 'ko.local/test:1');
    assert.deepEqual(img.history, ['base', 'app']);
    const mode = (p: string) => (statSync(join(img.root, p)).mode & 0o7777).toString(8);
    assert.deepEqual(['tmp', 'etc', 'etc/sub', 'etc/sub/conf', 'etc/run', 'app', 'app/main.mjs'].map(mode), [
      '1777',
      '755',
      '755',
      '644',
      '755',
      '555',
      '444',
    ]);
    const st = statSync(join(img.root, 'app', 'main.mjs'));
    assert.deepEqual([st.uid, st.gid, st.mtime.toISOString()], [0, 0, '2001-02-03T04:05:06.000Z']);
  });

  it('refuses a file that is neither a file, a folder nor a symlink', async () => {
    const root = stage(join(work, 'c'), 0);
    await exec('mkfifo', [join(root, 'etc', 'fifo')]);
    await assert.rejects(build(root, join(work, 'c.tar')), /etc\/fifo: neither a file, a folder nor a symlink/);
  });
});

describe('the Debian files the product image takes', () => {
  it('keeps shared libraries one folder deep, os-release and copyrights; nothing else', () => {
    const kept = [
      ['libc6', 'lib/x86_64-linux-gnu/libc.so.6'],
      ['libc6', 'lib64/ld-linux-x86-64.so.2'],
      ['libstdc++6', 'usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30'],
      ['libstdc++6', 'usr/share/doc/libstdc++6'],
      ['libc6', 'usr/share/doc/libc6/copyright'],
      ['base-files', 'etc/os-release'],
      ['base-files', 'usr/lib/os-release'],
    ];
    const dropped = [
      ['libc6', 'usr/lib/x86_64-linux-gnu/gconv/BIG5.so'],
      ['libc6', 'usr/share/doc/libc6/changelog.Debian.gz'],
      ['libc6', 'etc/ld.so.conf.d/x86_64-linux-gnu.conf'],
      ['libgcc-s1', 'usr/share/lintian/overrides/libgcc-s1'],
      ['base-files', 'etc/issue'],
      ['libc6', 'usr/share/doc/gcc-12-base/copyright'],
    ];
    for (const [pkg, path] of kept) assert.ok(keepDebianFile(pkg!, path!), `${pkg} ${path} is kept`);
    for (const [pkg, path] of dropped) assert.ok(!keepDebianFile(pkg!, path!), `${pkg} ${path} is dropped`);
  });
});

describe('the Debian release of the packages apt hands out', () => {
  it('takes Debian 12 (bookworm) only, and says what it found otherwise', () => {
    assert.equal(releaseProblem('ID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n'), undefined);
    assert.match(
      releaseProblem('ID=debian\nVERSION_CODENAME=trixie\n') ?? '',
      /packages of debian trixie, but the image's base is Debian 12 \(bookworm\)/,
    );
    assert.match(releaseProblem('ID=ubuntu\nVERSION_CODENAME=noble\n') ?? '', /ubuntu noble/);
    assert.match(releaseProblem('') ?? '', /unknown unknown/);
  });
});
