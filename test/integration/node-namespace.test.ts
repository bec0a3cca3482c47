/**
 * The test node's namespaces (scripts/node/namespace.ts): a process inside serves on the node's
 * address and the host reaches it on 127.0.0.1; the host's interfaces, routes and mounts never
 * change; and nothing is left — no process, mount, interface, route or cgroup — after a stop,
 * after the process that started the node is SIGKILLed, or, once the next start from the same
 * folder has swept, after the holder itself is SIGKILLed. A second node from the same folder is
 * refused; one from another folder runs beside it. Needs root (namespaces, cgroups): without it the node's start fails saying so.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { onLines } from '../../scripts/lib/process.ts';
import {
  cgroupHierarchies,
  cgroupRootOf,
  markedProcesses,
  startNodeNamespace,
  sweepNode,
  type NodeNamespace,
} from '../../scripts/node/namespace.ts';
import { REPO_ROOT } from '../../scripts/tools/build.ts';
import { eventually } from '../helpers/cluster.ts';
import { hostShared } from '../helpers/node.ts';

const work = mkdtempSync(join(tmpdir(), 'captf-node-test-'));
after(async () => {
  // A failed test may leave a node behind: its processes would keep this file from ending.
  for (const name of existsSync(work) ? readdirSync(work) : []) await sweepNode(join(work, name));
  rmSync(work, { recursive: true, force: true });
});

/** What is left of the node from `dir`: marked processes and its cgroup folders. */
function leftOf(dir: string): { processes: number[]; cgroups: string[] } {
  const processes = markedProcesses(dir);
  const cgroups = cgroupHierarchies()
    .map((h) => join('/sys/fs/cgroup', h, cgroupRootOf(dir)))
    .filter((d) => existsSync(d));
  return { processes, cgroups };
}

const nothingLeft = (dir: string) => {
  const left = leftOf(dir);
  return left.processes.length === 0 && left.cgroups.length === 0;
};

/** A web server on port 8080 of the address given as its argument. */
const WEB_SERVER = "require('node:http').createServer((q, s) => s.end('ok')).listen(8080, process.argv[1])";

/** A web server on the node's address, and a sleeper, inside. */
function serveInside(ns: NodeNamespace): ChildProcess[] {
  return [
    ns.spawn(process.execPath, ['-e', WEB_SERVER, ns.address], { stdio: 'ignore' }),
    ns.spawn('sleep', ['3600'], { stdio: 'ignore' }),
  ];
}

/** GET / through the host's forward of the node's port 8080, once it answers. */
const throughForward = (port: number) =>
  eventually('the server inside to answer through the forward', async () => {
    try {
      return (await fetch(`http://127.0.0.1:${port}/`)).status === 200;
    } catch {
      return false;
    }
  });

describe("the test node's namespaces", () => {
  it('refuses to start without root, and says why', () => {
    const script = `import(${JSON.stringify(join(REPO_ROOT, 'scripts/node/namespace.ts'))})
      .then((m) => m.startNodeNamespace({ dir: ${JSON.stringify(join(work, 'unprivileged'))} }))
      .then(() => console.log('started'), (e) => console.log(e.message));`;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
      uid: 65532,
      gid: 65532,
      encoding: 'utf8',
    });
    assert.match(r.stdout, /the test node needs root: it makes network and mount namespaces and cgroups/, r.stderr);
  });

  it('serve on the node address, reached from the host; stop leaves nothing', async () => {
    const before = hostShared();
    const dir = join(work, 'stop');
    const ns = await startNodeNamespace({ dir, forwards: [8080], graceMs: 2000 });
    serveInside(ns);
    await throughForward(ns.forwarded.get(8080)!);
    assert.deepEqual(
      hostShared(),
      before,
      'the host shows no new interface, route, nftables rule, mount or kernel setting',
    );
    assert.ok(cgroupHierarchies().every((h) => existsSync(join('/sys/fs/cgroup', h, ns.cgroupRoot))));
    await ns.stop();
    assert.deepEqual(leftOf(dir), { processes: [], cgroups: [] });
    assert.deepEqual(hostShared(), before);
  });

  it('the process that started the node is SIGKILLed: the holder notices and leaves nothing', async () => {
    const before = hostShared();
    const dir = join(work, 'killed-parent');
    const parent = spawn(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `const { startNodeNamespace } = await import(${JSON.stringify(join(REPO_ROOT, 'scripts/node/namespace.ts'))});
         const ns = await startNodeNamespace({ dir: ${JSON.stringify(dir)}, forwards: [8080], graceMs: 2000 });
         ns.spawn(process.execPath, ['-e', ${JSON.stringify(WEB_SERVER)}, ns.address], { stdio: 'ignore' });
         ns.spawn('sleep', ['3600'], { stdio: 'ignore' });
         console.log(JSON.stringify({ port: ns.forwarded.get(8080) }));
         setInterval(() => {}, 1 << 30);`,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    const port = await new Promise<number>((resolve) => onLines(parent.stdout!, (l) => resolve(JSON.parse(l).port)));
    await throughForward(port);
    assert.ok(leftOf(dir).processes.length >= 3, 'the holder, the server and the sleeper run');
    parent.kill('SIGKILL');
    await eventually('nothing of the node to be left', async () => nothingLeft(dir), 20_000);
    assert.deepEqual(hostShared(), before);
  });

  it('the holder itself is SIGKILLed: the next start from the folder sweeps what it left', async () => {
    const dir = join(work, 'killed-holder');
    const first = await startNodeNamespace({ dir, forwards: [8080], graceMs: 2000 });
    serveInside(first);
    await throughForward(first.forwarded.get(8080)!);
    process.kill(first.pid, 'SIGKILL');
    await eventually('the holder to be gone', async () => !existsSync(`/proc/${first.pid}`));
    assert.ok(leftOf(dir).processes.length >= 2, 'what ran inside outlives a killed holder');
    await first.stop(); // this side's forward; the holder is already gone
    const second = await startNodeNamespace({ dir, graceMs: 2000 });
    assert.ok(!leftOf(dir).processes.some((p) => p !== second.pid && !isHolderOf(p, second)), 'swept');
    await second.stop();
    assert.deepEqual(leftOf(dir), { processes: [], cgroups: [] });
  });

  it('a second node from the same folder is refused; one from another folder runs beside it', async () => {
    const dir = join(work, 'one');
    const ns = await startNodeNamespace({ dir, forwards: [8080], graceMs: 2000 });
    try {
      await assert.rejects(startNodeNamespace({ dir }), /a test node from .* is already running \(holder PID \d+\)/);
      const other = await startNodeNamespace({ dir: join(work, 'two'), forwards: [8080], graceMs: 2000 });
      serveInside(ns);
      serveInside(other);
      await throughForward(ns.forwarded.get(8080)!);
      await throughForward(other.forwarded.get(8080)!);
      await other.stop();
    } finally {
      await ns.stop();
    }
    assert.ok(nothingLeft(dir) && nothingLeft(join(work, 'two')));
  });

  it('two starts from one folder at once: one runs, the other is refused, and the first is untouched', async () => {
    const dir = join(work, 'race');
    const [a, b] = await Promise.allSettled([
      startNodeNamespace({ dir, forwards: [8080], graceMs: 2000 }),
      startNodeNamespace({ dir, forwards: [8080], graceMs: 2000 }),
    ]);
    const started = [a, b].filter((r) => r.status === 'fulfilled').map((r) => r.value);
    const refused = [a, b].filter((r) => r.status === 'rejected').map((r) => String(r.reason));
    assert.equal(started.length, 1, refused.join('\n'));
    assert.match(refused[0] ?? '', /a test node from .* is (being started|already running)/);
    serveInside(started[0]!);
    await throughForward(started[0]!.forwarded.get(8080)!);
    await started[0]!.stop();
    assert.ok(nothingLeft(dir));
  });

  it('a folder too long for its socket is refused before anything starts', async () => {
    const dir = join(work, 'x'.repeat(120));
    await assert.rejects(startNodeNamespace({ dir }), /too long: its socket path must fit 107 bytes/);
    assert.ok(nothingLeft(dir));
  });

  it("the way in: root's only; a half-closing client gets the whole reply; a bad first line is closed", async () => {
    const dir = join(work, 'way-in');
    const ns = await startNodeNamespace({ dir, forwards: [8080], graceMs: 2000 });
    try {
      serveInside(ns);
      await throughForward(ns.forwarded.get(8080)!);
      const socket = join(dir, 'forward.sock');
      assert.equal(statSync(socket).mode & 0o777, 0o600);
      // HTTP/1.0 with the request side ended at once: the answer still comes back whole.
      const reply = await exchange(socket, `${ns.address}:8080\nGET / HTTP/1.0\r\n\r\n`);
      assert.match(reply, /^HTTP\/1\.1 200 OK[\s\S]*\r\n\r\nok$/);
      for (const bad of ['kubernetes:443\n', 'x'.repeat(100), '10.0.0.1:99999\n'])
        assert.equal(await exchange(socket, bad), '', `closed without an answer: ${bad.slice(0, 20)}`);
    } finally {
      await ns.stop();
    }
  });
});

/** Writes `text` to the Unix socket, ends this side, and resolves with everything read until it closes. */
function exchange(socket: string, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = createConnection({ path: socket, allowHalfOpen: true });
    let got = '';
    c.on('data', (d: Buffer) => (got += d.toString()));
    c.on('error', reject);
    c.on('close', () => resolve(got));
    c.end(text);
  });
}

/** Whether `pid` is `ns`'s holder or the unshare that forked it. */
function isHolderOf(pid: number, ns: NodeNamespace): boolean {
  if (pid === ns.pid) return true;
  try {
    return readFileSync(`/proc/${ns.pid}/stat`, 'utf8').split(') ')[1]!.split(' ')[1] === String(pid);
  } catch {
    return false;
  }
}
