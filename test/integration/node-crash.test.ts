/**
 * The test node after a crash: the process that owns a node with a running pod is SIGKILLed;
 * the holder notices its stdin close and tears everything down. Compared with a snapshot
 * taken before the start, nothing of it is left: no process (the node's own, the shims and
 * containers found by the node's folder and cgroups), no mount, no cgroup folder in any
 * hierarchy, no interface, route or nftables rule on the host. Needs root.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { onLines } from '../../scripts/lib/process.ts';
import { cgroupRootOf } from '../../scripts/node/cgroups.ts';
import { sweepNode } from '../../scripts/node/namespace.ts';
import { REPO_ROOT } from '../../scripts/tools/build.ts';
import { eventually } from '../helpers/cluster.ts';
import { cgroupFolders, hostState, nodeProcesses } from '../helpers/node.ts';

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
    // What the comparison must see, so that it could see it left behind.
    const programs = nodeProcesses(nodeDir).map((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      } catch {
        return [];
      }
    });
    for (const program of ['kubelet', 'containerd', 'containerd-shim-runc-v2', 'kube-proxy', 'coredns'])
      assert.ok(
        programs.some((argv) => argv[0]?.endsWith(`/${program}`)),
        `${program} runs`,
      );
    assert.ok(
      programs.some((argv) => argv.includes('/app/dist/main.mjs')),
      "the pod's container (a namespace of its own) is among the node's processes",
    );
    assert.ok(
      cgroupFolders(nodeDir).some((c) => c.startsWith(`memory/${cgroupRootOf(nodeDir)}/kubepods/`)),
      "the pod's cgroups are among the folders compared",
    );
    owner.kill('SIGKILL');
    await eventually(
      'nothing of the node to be left',
      async () =>
        nodeProcesses(nodeDir).length === 0 && !cgroupFolders(nodeDir).some((c) => c.includes(cgroupRootOf(nodeDir))),
      60_000,
      500,
    );
    assert.deepEqual(hostState(nodeDir), before);
  });
});
