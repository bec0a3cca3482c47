/**
 * The test node after a crash: the process that owns a node with a running pod is SIGKILLed;
 * the holder notices its stdin close and tears everything down. Compared with a snapshot
 * taken before the start, nothing of it is left: no process (the node's own, the shims and
 * containers found by the node's folder and cgroups), no mount, no cgroup folder in any
 * hierarchy, no interface, route or nftables rule on the host. Needs root.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { onLines } from '../../scripts/lib/process.ts';
import { sweepNode } from '../../scripts/node/namespace.ts';
import { REPO_ROOT } from '../../scripts/tools/build.ts';
import { assertNodeGone, assertNodeRunsAPod, hostState } from '../helpers/node.ts';

const work = mkdtempSync(join(tmpdir(), 'captf-node-crash-'));
const nodeDir = join(work, 'node');
after(async () => {
  await sweepNode(nodeDir);
  rmSync(work, { recursive: true, force: true });
});

describe('the test node after its owner is SIGKILLed', () => {
  it('leaves nothing: processes, mounts, cgroups, links, routes, nftables rules and kernel settings as before', async () => {
    const before = hostState(nodeDir);
    const owner = spawn(process.execPath, [join(REPO_ROOT, 'test', 'helpers', 'node-owner.ts'), work], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    owner.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
    const started = await new Promise<boolean>((resolve) => {
      onLines(owner.stdout!, () => resolve(true));
      owner.once('exit', () => resolve(false));
    });
    assert.ok(started, `the node and its pod started:\n${stderr}`);
    assertNodeRunsAPod(nodeDir);
    owner.kill('SIGKILL');
    await assertNodeGone(nodeDir, before);
  });
});
