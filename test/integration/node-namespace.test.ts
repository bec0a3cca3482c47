/**
 * The test node's namespaces (scripts/node/namespace.ts): a process inside serves on the node's
 * address and the host reaches it on 127.0.0.1; the host's interfaces, routes and mounts never
 * change; and nothing is left — no process, mount, interface, route or cgroup — after a stop,
 * after the process that started the node is SIGKILLed, or, once the next start from the same
 * folder has swept, after the holder itself is SIGKILLed. A second node from the same folder is
 * refused; one from another folder runs beside it. Needs root (namespaces, cgroups): without it the node's start fails saying so.
 */
import assert from 'node:assert/strict';
import { execFile, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { onLines } from '../../scripts/lib/process.ts';
import {
  cgroupHierarchies,
  cgroupRootOf,
  holderOf,
  markedProcesses,
  startNodeNamespace,
  sweepNode,
  type NodeNamespace,
} from '../../scripts/node/namespace.ts';
import { REPO_ROOT } from '../../scripts/tools/build.ts';
import { eventually } from '../helpers/cluster.ts';
import { hostShared } from '../helpers/node.ts';

const execFileAsync = promisify(execFile);
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

  it("a node nothing owns any more (its holder and owner killed) is swept by another folder's start, and by npm run sweep", async () => {
    // One left with its marked processes and a contained one: found by the folder it names.
    const named = await orphan(join(work, 'orphan-named'));
    const runningDir = join(work, 'swept-by-start');
    const running = await startNodeNamespace({ dir: runningDir, forwards: [8080], graceMs: 2000 });
    let ownedNs: NodeNamespace | undefined;
    try {
      serveInside(running);
      // Asserted as end states: a node file starting beside this one may have swept first.
      assert.deepEqual(leftOf(named.dir), { processes: [], cgroups: [] });
      await named.contained.gone;
      // One left with only a process in its cgroups, as containers whose shims died are: found by its root.
      const rootOnly = await orphan(join(work, 'orphan-root'));
      const contained = rootOnly.contained.child.pid!;
      for (const pid of markedProcesses(rootOnly.dir)) if (pid !== contained) process.kill(pid, 'SIGKILL');
      await eventually('only the contained process to be left', async () =>
        markedProcesses(rootOnly.dir).every((pid) => pid === contained),
      );
      // And one whose holder was killed while its owner, this process, lives: it must be left alone.
      const ownedDir = join(work, 'holder-killed-owner-lives');
      const owned = (ownedNs = await startNodeNamespace({ dir: ownedDir, forwards: [8080], graceMs: 2000 }));
      serveInside(owned);
      await throughForward(owned.forwarded.get(8080)!);
      process.kill(owned.pid, 'SIGKILL');
      await eventually('the holder to be gone', async () => !existsSync(`/proc/${owned.pid}`));
      const ownedLeft = leftOf(ownedDir).processes;
      assert.ok(ownedLeft.length >= 2, 'what ran inside outlives the killed holder');

      const sweep = await execFileAsync('npm', ['run', '-s', 'sweep'], { cwd: REPO_ROOT }).catch(
        (err: { code?: number; stdout?: string; stderr?: string }) => err,
      );
      // Another run's leftovers may fail the sweep as a whole; none of this file's may.
      assert.doesNotMatch(String(sweep.stderr), new RegExp(`could not sweep ${work}`), String(sweep.stderr));
      assert.deepEqual(leftOf(rootOnly.dir), { processes: [], cgroups: [] });
      await rootOnly.contained.gone;
      assert.match(String(sweep.stdout), new RegExp(`left running: the node from ${runningDir} `));
      assert.match(String(sweep.stdout), new RegExp(`left running: the node from ${ownedDir} `));
      assert.deepEqual(
        ownedLeft.filter((pid) => existsSync(`/proc/${pid}`)),
        ownedLeft,
        "an owned node's processes are untouched",
      );
      await throughForward(running.forwarded.get(8080)!);
    } finally {
      // This side's forwards too: they would keep the file from ending.
      await ownedNs?.stop();
      await running.stop();
    }
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

/**
 * Leaves a node from `dir` that nothing owns: a process starts it and a server and a sleeper
 * inside, an unmarked sleeper of this file is put in its cgroups (as a container would be),
 * then its holder and the process that started it are SIGKILLed.
 * @returns the folder, and the contained sleeper with a promise of its end.
 */
async function orphan(dir: string): Promise<{ dir: string; contained: { child: ChildProcess; gone: Promise<void> } }> {
  const owner = spawn(
    process.execPath,
    [
      '--input-type=module',
      '-e',
      `const { startNodeNamespace } = await import(${JSON.stringify(join(REPO_ROOT, 'scripts/node/namespace.ts'))});
       const ns = await startNodeNamespace({ dir: ${JSON.stringify(dir)}, graceMs: 2000 });
       ns.spawn(process.execPath, ['-e', ${JSON.stringify(WEB_SERVER)}, ns.address], { stdio: 'ignore' });
       ns.spawn('sleep', ['3600'], { stdio: 'ignore' });
       console.log(JSON.stringify({ holder: ns.pid }));
       setInterval(() => {}, 1 << 30);`,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const started = await new Promise<{ holder?: number }>((resolve) => {
    onLines(owner.stdout!, (l) => resolve(JSON.parse(l) as { holder: number }));
    owner.once('exit', () => resolve({}));
  });
  assert.ok(started.holder, `the node from ${dir} started`);
  // A child of this file, so its end is seen here (reaped, not a zombie in /proc).
  const child = spawn('sleep', ['3600'], { stdio: 'ignore' });
  const gone = new Promise<void>((r) => child.once('exit', () => r()));
  // A leaf of its own: a v2 cgroup with controllers for its children takes no process itself.
  const hierarchy = cgroupHierarchies().includes('memory') ? 'memory' : '';
  const leaf = join('/sys/fs/cgroup', hierarchy, cgroupRootOf(dir), 'contained');
  mkdirSync(leaf);
  writeFileSync(join(leaf, 'cgroup.procs'), String(child.pid));
  process.kill(started.holder, 'SIGKILL');
  owner.kill('SIGKILL');
  await eventually(
    'the holder (and the unshare that forked it) and its owner to be gone',
    async () => holderOf(dir) === undefined && !existsSync(`/proc/${owner.pid}`),
  );
  return { dir, contained: { child, gone } };
}

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
