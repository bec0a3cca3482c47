/**
 * How a test node ends, and that it leaves nothing either way. Compared with a snapshot taken
 * before the start, nothing of it is left: no process (the node's own, the shims and
 * containers found by the node's folder and cgroups), no mount, no cgroup folder in any
 * hierarchy, no interface, route or nftables rule on the host. Needs root.
 * - A crash: the process that owns a node with a running pod is SIGKILLed; the holder notices
 *   its stdin close and tears everything down.
 * - A terminal's Ctrl-C: SIGINT to the whole foreground process group of `npm run controlplane
 *   -- --node` with a pod running, so npm, the starter and anything else in that group get it,
 *   and npm forwards its own copy to the starter. The starter must stop the node to the end;
 *   a second Ctrl-C past the same keypress's window exits at once, and the holder, its stdin
 *   closed, still tears the node down.
 * - `npm test` interrupted the same way while a node file (test/helpers/node-file.ts) runs a
 *   pod: the runner stops its control plane, the file dies, and the node's holder tears down.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { onLines } from '../../scripts/lib/process.ts';
import { sweepNode } from '../../scripts/node/namespace.ts';
import { REPO_ROOT } from '../../scripts/tools/build.ts';
import { eventually } from '../helpers/cluster.ts';
import { assertNodeGone, assertNodeRunsAPod, hostState, nodeProcesses, runProductPod } from '../helpers/node.ts';

/**
 * A fresh folder for one node, swept after the file (its process group, if any, killed first),
 * with any other node folder a test names.
 */
function nodeFolder(prefix: string): {
  work: string;
  nodeDir: string;
  killAfter: (pid: number | undefined) => void;
  sweepAlso: (dir: string) => void;
} {
  const work = mkdtempSync(join(tmpdir(), `captf-${prefix}-`));
  const nodeDir = join(work, 'node');
  const dirs = [nodeDir];
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
    for (const dir of dirs) await sweepNode(dir);
    rmSync(work, { recursive: true, force: true });
  });
  return { work, nodeDir, killAfter: (pid) => (group = pid), sweepAlso: (dir) => dirs.push(dir) };
}

describe('the test node after its owner is SIGKILLed', () => {
  const { work, nodeDir } = nodeFolder('node-crash');
  it('leaves nothing: processes, mounts, cgroups, links, routes, nftables rules and kernel settings as before', async () => {
    const before = hostState(nodeDir);
    const owner = spawn(process.execPath, [join(REPO_ROOT, 'test', 'helpers', 'node-owner.ts'), work], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    let holder: number;
    owner.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
    try {
      const started = await new Promise<boolean>((resolve) => {
        onLines(owner.stdout!, () => resolve(true));
        owner.once('exit', () => resolve(false));
      });
      assert.ok(started, `the node and its pod started:\n${stderr}`);
      holder = assertNodeRunsAPod(nodeDir);
    } finally {
      // Also when a check failed: the owner would keep the node, and the file, running.
      owner.kill('SIGKILL');
    }
    await assertNodeGone(nodeDir, before, holder);
  });
});

describe("a terminal's Ctrl-C to `npm run controlplane -- --node`", () => {
  for (const again of [false, true]) {
    const { work, nodeDir, killAfter } = nodeFolder(again ? 'node-interrupt-twice' : 'node-interrupt');
    it(
      again
        ? 'a second Ctrl-C after 2 s exits at once, and the holder still tears the node down to the end'
        : 'stops the node to the end with a pod running, though npm and the starter both get the SIGINT',
      async () => {
        const before = hostState(nodeDir);
        // A group of its own, as a shell's foreground job is: the SIGINT below reaches all of it.
        const npm = spawn('npm', ['run', 'controlplane', '--', '--node', '--dir', work], {
          cwd: REPO_ROOT,
          detached: true,
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        killAfter(npm.pid);
        const run = outputOf(npm);
        assert.ok(await run.saw('stop with Ctrl-C'), `the control plane started:\n${run.text().slice(-4000)}`);
        const kubeconfig = /^control plane ready: KUBECONFIG=(\S+)/m.exec(run.text())?.[1];
        assert.ok(kubeconfig, `the ready line names the kubeconfig:\n${run.text()}`);
        const image = /the product image is (\S+)/.exec(run.text())?.[1];
        assert.ok(image, `the banner names the product image:\n${run.text()}`);
        await runProductPod(kubeconfig, image, 'interrupted');
        const holder = assertNodeRunsAPod(nodeDir);
        // The stop's first step stops the kubelet: stopped itself, it holds that step for its
        // grace (10 s), so the second signal surely comes while the first stop still runs.
        const kubelet = again ? nodeProgram(nodeDir, 'kubelet') : undefined;
        if (kubelet) process.kill(kubelet, 'SIGSTOP');

        process.kill(-npm.pid!, 'SIGINT');
        if (kubelet) {
          // Past the window in which a second signal is the same keypress.
          await new Promise((r) => setTimeout(r, 3000));
          assert.ok(!run.ended(), 'the first stop still waits for the kubelet');
          process.kill(-npm.pid!, 'SIGINT');
          await run.exited;
          // Still there: the starter did not wait for its stop. The holder ends it (SIGKILL after its grace).
          assert.ok(existsSync(`/proc/${kubelet}`), 'the starter exited at once, its stop unfinished');
        }
        await run.exited;
        killAfter(undefined);
        assert.match(run.text(), /SIGINT: stopping the control plane/);
        if (!again) {
          assert.doesNotMatch(run.text(), /while stopping/, 'no step of the stop failed');
          assert.match(run.text(), /^stopped\.$/m, 'the starter says when its stop is done');
        }
        await assertNodeGone(nodeDir, before, holder);
      },
    );
  }
});

describe('`npm test` interrupted while a node file runs', () => {
  const { work, killAfter, sweepAlso } = nodeFolder('node-test-run');
  it("the runner's stop, the file's end and the node's holder leave nothing: no process, cgroup, mount or control plane folder", async () => {
    const ready = join(work, 'ready');
    // Nothing of a node is in it yet: the snapshot is the one the node's folder would have given.
    const before = hostState(join(work, 'no-node-yet'));
    // The runner as `npm test` execs it, with a node file, in a group of its own like a
    // terminal's foreground job; the file's node lands under `work` (its folder is a temporary one).
    const runner = spawn(process.execPath, [join(REPO_ROOT, 'scripts', 'test.ts'), join(REPO_ROOT, NODE_FILE)], {
      cwd: REPO_ROOT,
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
      // Without this file's NODE_TEST_CONTEXT: a runner that sees it takes itself for a nested run and runs no file.
      env: { ...withoutTestContext(process.env), TMPDIR: work, CAPTF_NODE_FILE_READY: ready },
    });
    killAfter(runner.pid);
    const run = outputOf(runner);
    const controlPlaneDir = join(REPO_ROOT, '.local', `test-controlplane-${runner.pid}`);
    await eventually('the node file to run its pod', async () => existsSync(ready) || run.ended(), 480_000, 500);
    assert.ok(existsSync(ready), `the node file ran its pod:\n${run.text().slice(-4000)}`);
    const nodeDir = readFileSync(ready, 'utf8');
    sweepAlso(nodeDir);
    const holder = assertNodeRunsAPod(nodeDir);

    process.kill(-runner.pid!, 'SIGINT');
    const code = await run.exited;
    killAfter(undefined);
    assert.equal(code, 130, run.text().slice(-4000));
    assert.match(run.text(), /SIGINT: stopping the control plane/);
    await assertNodeGone(nodeDir, before, holder);
    assert.ok(!existsSync(controlPlaneDir), "the run's control plane folder is removed");
    assert.deepEqual(nodeProcesses(controlPlaneDir), [], "no process of the run's control plane is left");
  });
});

/** The PID of the node's program `name` (its first argument ends with `/<name>`). */
function nodeProgram(nodeDir: string, name: string): number {
  const pid = nodeProcesses(nodeDir).find((p) => {
    try {
      return readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0')[0]!.endsWith(`/${name}`);
    } catch {
      return false;
    }
  });
  assert.ok(pid, `the node runs ${name}`);
  return pid;
}

/** `env` without node:test's marker of a test file's process. */
function withoutTestContext(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const { NODE_TEST_CONTEXT: _, ...rest } = env;
  return rest;
}

/** A node test file that holds a node with a pod until it is interrupted. */
const NODE_FILE = 'test/helpers/node-file.ts';

/** The output (stdout and stderr, by lines) of `child` as it comes, and its end. */
function outputOf(child: ChildProcess): {
  text: () => string;
  /** Resolves true once a line holds `needle`, false if the child exits first. */
  saw: (needle: string) => Promise<boolean>;
  exited: Promise<number | null>;
  ended: () => boolean;
} {
  let text = '';
  let ended = false;
  const exited = new Promise<number | null>((r) =>
    child.once('exit', (code) => {
      ended = true;
      r(code);
    }),
  );
  const waiting: { needle: string; resolve: (seen: boolean) => void }[] = [];
  const take = (line: string) => {
    text += `${line}\n`;
    for (const w of waiting) if (line.includes(w.needle)) w.resolve(true);
  };
  onLines(child.stdout!, take);
  onLines(child.stderr!, take);
  void exited.then(() => waiting.forEach((w) => w.resolve(false)));
  return {
    text: () => text,
    saw: (needle) =>
      text.includes(needle) ? Promise.resolve(true) : new Promise((resolve) => waiting.push({ needle, resolve })),
    exited,
    ended: () => ended,
  };
}
