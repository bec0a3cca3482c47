/**
 * The Go tool builds (scripts/tools/build.ts, scripts/tools/registry.ts): source patches of a
 * module copy, and what goes into the cache keys.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { applySourcePatch, patchModuleCopy, pinnedVersion } from '../../scripts/tools/build.ts';
import { IMC_DISPATCHER_PORTS_PATCH, TOOLS, type GoSourcePatch } from '../../scripts/tools/registry.ts';

describe('the dispatcher port patch', () => {
  const upstream =
    'const (\n\treadTimeout   = 15 * time.Minute\n\thttpPort      = 8080\n\thttpsPort     = 8443\n\tfinalizerName = "x"\n)\n';

  it('removes exactly the two constants and adds the file declaring them', () => {
    const out = applySourcePatch(IMC_DISPATCHER_PORTS_PATCH, upstream);
    assert.equal(out, 'const (\n\treadTimeout   = 15 * time.Minute\n\tfinalizerName = "x"\n)\n');
    const added = Object.values(IMC_DISPATCHER_PORTS_PATCH.add ?? {}).join('');
    assert.match(added, /httpPort\s+= captfPortFromEnv\("CAPTF_IMC_HTTP_PORT", 8080\)/);
    assert.match(added, /httpsPort = captfPortFromEnv\("CAPTF_IMC_HTTPS_PORT", 8443\)/);
  });

  it('fails loudly when the upstream text differs', () => {
    assert.throws(
      () => applySourcePatch(IMC_DISPATCHER_PORTS_PATCH, upstream.replace('8080', '9090')),
      /expected the text below exactly once, found it 0 times/,
    );
    assert.throws(() => applySourcePatch(IMC_DISPATCHER_PORTS_PATCH, upstream + upstream), /found it 2 times/);
  });

  it('pins the same knative.dev/eventing as the ApiServerSource adapter', () => {
    assert.equal(pinnedVersion(TOOLS.eventing[0]!), pinnedVersion(TOOLS.knative[0]!));
  });
});

describe('patching a module copy', () => {
  const root = mkdtempSync(join(tmpdir(), 'captf-patch-'));
  after(() => rmSync(root, { recursive: true, force: true }));
  let n = 0;
  /** A fresh copy of a small module: go.mod with two requires, a.go, b.go and a folder c/. */
  const copy = () => {
    const dir = join(root, String(n++));
    mkdirSync(join(dir, 'c'), { recursive: true });
    const reqs = 'require (\n\texample.com/keep v1.0.0\n\tknative.dev/caching v0.0.0-20250101000000-abcdefabcdef\n)\n';
    writeFileSync(join(dir, 'go.mod'), `module example.com/m\n\ngo 1.22\n\n${reqs}`);
    writeFileSync(join(dir, 'a.go'), 'package m\n\nconst x = 1\n');
    writeFileSync(join(dir, 'b.go'), 'package m\n');
    writeFileSync(join(dir, 'c', 'c.go'), 'package c\n');
    return dir;
  };
  const patch = (p: Partial<GoSourcePatch>): GoSourcePatch => ({ module: 'example.com/m', ...p });

  it('edits a file, adds one beside it, deletes files and folders, and drops a require with go mod edit', async () => {
    const dir = copy();
    await patchModuleCopy(
      patch({
        file: 'a.go',
        replace: [{ from: 'x = 1', to: 'x = 2' }],
        add: { 'z.go': 'package m\n' },
        delete: ['b.go', 'c'],
        goModEdit: ['-droprequire=knative.dev/caching'],
      }),
      dir,
    );
    assert.equal(readFileSync(join(dir, 'a.go'), 'utf8'), 'package m\n\nconst x = 2\n');
    assert.equal(readFileSync(join(dir, 'z.go'), 'utf8'), 'package m\n');
    assert.equal(existsSync(join(dir, 'b.go')) || existsSync(join(dir, 'c')), false);
    const gomod = readFileSync(join(dir, 'go.mod'), 'utf8');
    assert.match(gomod, /example\.com\/keep v1\.0\.0/);
    assert.doesNotMatch(gomod, /knative\.dev\/caching/);
  });

  it('fails naming the module and file when a file to edit or delete does not exist', async () => {
    await assert.rejects(patchModuleCopy(patch({ delete: ['gone.go'] }), copy()), /patch of example\.com\/m: gone\.go/);
    await assert.rejects(
      patchModuleCopy(patch({ file: 'gone.go', replace: [{ from: 'a', to: 'b' }] }), copy()),
      /patch of example\.com\/m: gone\.go does not exist/,
    );
  });

  it('fails when go mod edit refuses a flag', async () => {
    await assert.rejects(patchModuleCopy(patch({ goModEdit: ['-nonsense'] }), copy()), /go mod edit -nonsense/);
  });
});
