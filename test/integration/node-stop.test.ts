/**
 * How a test node ends, and that it leaves nothing either way. Compared with a snapshot taken
 * before the start, nothing of it is left: no process (the node's own, the shims and
 * containers found by the node's folder and cgroups), no mount, no cgroup folder in any
 * hierarchy, no interface, route or nftables rule on the host. Needs root.
 * - A crash: the process that owns a node with a running pod is SIGKILLed; the holder notices
 *   its stdin close and tears everything down.
 * - A terminal's Ctrl-C: SIGINT to the whole foreground process group of `npm run controlplane
 *   -- --node` with a pod running, so npm, the starter and anything else in that group get it,
 *   and npm forwards its own copy to the starter. The starter must stop the node to the end.
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
import { assertNodeGone, assertNodeRunsAPod, hostState, runProductPod } from '../helpers/node.ts';

/** A fresh folder for one node, swept (and its process group, if any, killed) after the file. */
function nodeFolder(prefix: string): { work: string; nodeDir: string; killAfter: (pid: number | undefined) => void } {
  const work = mkdtempSync(join(tmpdir(), `captf-${prefix}-`));
  const nodeDir = join(work, 'node');
  let group: number | undefined;
  after(async () => {
    // A failed test may leave its entry point running: its group is killed before the sweep.
    if (group) {
      try {
        process.kill(-group, 'SIGKILL');
      } catch {
        // Ended already.
      }
    }
    await sweepNode(nodeDir);
    rmSync(work, { recursive: true, force: true });
  });
  return { work, nodeDir, killAfter: (pid) => (group = pid) };
}

describe('the test node after its owner is SIGKILLed', () => {
  const { work, nodeDir } = nodeFolder('node-crash');
  it('leaves nothing: processes, mounts, cgroups, links, routes, nftables rules and kernel settings as before', async () => {
    const before = hostState(nodeDir);
    const owner = spawn(process.execPath, [join(REPO_ROOT, 'test', 'helpers', 'node-owner.ts'), work], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    owner.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
    try {
      const started = await new Promise<boolean>((resolve) => {
        onLines(owner.stdout!, () => resolve(true));
        owner.once('exit', () => resolve(false));
      });
      assert.ok(started, `the node and its pod started:\n${stderr}`);
      assertNodeRunsAPod(nodeDir);
    } finally {
      // Also when a check failed: the owner would keep the node, and the file, running.
      owner.kill('SIGKILL');
    }
    await assertNodeGone(nodeDir, before);
  });
});

describe("a terminal's Ctrl-C to `npm run controlplane -- --node`", () => {
  const { work, nodeDir, killAfter } = nodeFolder('node-interrupt');
  it('stops the node to the end with a pod running, though npm and the starter both get the SIGINT', async () => {
    const before = hostState(nodeDir);
    // A group of its own, as a shell's foreground job is: the SIGINT below reaches all of it.
    const npm = spawn('npm', ['run', 'controlplane', '--', '--node', '--dir', work], {
      cwd: REPO_ROOT,
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    killAfter(npm.pid);
    let output = '';
    const exited = new Promise<void>((r) => npm.once('exit', () => r()));
    // The banner's last line (stderr) comes after the ready line (stdout).
    const banner = new Promise<boolean>((resolve) => {
      const take = (line: string) => {
        output += `${line}\n`;
        if (line.includes('stop with Ctrl-C')) resolve(true);
      };
      onLines(npm.stdout!, take);
      onLines(npm.stderr!, take);
      void exited.then(() => resolve(false));
    });
    assert.ok(await banner, `the control plane started:\n${output.slice(-4000)}`);
    const kubeconfig = /^control plane ready: KUBECONFIG=(\S+)/m.exec(output)?.[1];
    assert.ok(kubeconfig, `the ready line names the kubeconfig:\n${output}`);
    const image = /the product image is (\S+)/.exec(output)?.[1];
    assert.ok(image, `the banner names the product image:\n${output}`);
    await runProductPod(kubeconfig, image, 'interrupted');
    assertNodeRunsAPod(nodeDir);

    process.kill(-npm.pid!, 'SIGINT');
    await exited;
    killAfter(undefined);
    assert.match(output, /SIGINT: stopping the control plane/);
    assert.doesNotMatch(output, /while stopping/, 'no step of the stop failed');
    await assertNodeGone(nodeDir, before);
  });
});
