/**
 * The product image under the test node's containerd and runc (scripts/node/containerd.ts):
 * `npm run image`'s tars import with the digests it printed; mirror-sync runs from the image as
 * 65532 on a read-only root with the default seccomp profile, in a cgroup under the node's
 * root, answers `/healthz` through the node's forward, and stops on SIGTERM with exit 0; the
 * node's stop leaves no process or cgroup. Needs root: without it the node's start fails saying so.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { buildImage, type BuiltImage } from '../../scripts/image/build.ts';
import { PRODUCT_CONFIG } from '../../scripts/image/images.ts';
import { PLACEHOLDER_KUBECONFIG } from '../../scripts/lib/warm-compile-cache.ts';
import { nodeBinaries } from '../../scripts/node/binaries.ts';
import { startContainerd, type Containerd } from '../../scripts/node/containerd.ts';
import {
  cgroupHierarchies,
  markedProcesses,
  startNodeNamespace,
  sweepNode,
  type NodeNamespace,
} from '../../scripts/node/namespace.ts';
import { eventually } from '../helpers/cluster.ts';
import { UNSIGNED_EVENTS } from '../helpers/events.ts';

const work = mkdtempSync(join(tmpdir(), 'captf-node-ctr-test-'));
const dir = join(work, 'node');
let product: BuiltImage;
let pause: BuiltImage;
let ns: NodeNamespace;
let containerd: Containerd;

before(async () => {
  const quiet = { log: () => undefined };
  [product, pause] = [await buildImage('captf-credentials', quiet), await buildImage('pause', quiet)];
  ns = await startNodeNamespace({ dir, forwards: [8080], graceMs: 5000 });
  containerd = await startContainerd(ns, { dir, bin: await nodeBinaries(), sandboxImage: pause.ref });
});
after(async () => {
  await ns?.stop();
  await sweepNode(dir);
  rmSync(work, { recursive: true, force: true });
});

describe("the product image under the test node's containerd", () => {
  it('imports with the digests npm run image printed', async () => {
    for (const image of [product, pause]) await containerd.ctr(['images', 'import', image.path]);
    const listed = await containerd.ctr(['images', 'ls']);
    for (const image of [product, pause])
      assert.match(listed, new RegExp(`^${image.ref}\\s+\\S+\\s+${image.digest}`, 'm'));
  });

  it('runs mirror-sync as 65532, read-only, seccomp, in the node cgroup; /healthz from the host; SIGTERM exits 0', async () => {
    const kubeconfig = join(work, 'kubeconfig');
    // A server that is never asked: mirror-sync makes no API call until an event arrives.
    writeFileSync(kubeconfig, PLACEHOLDER_KUBECONFIG);
    const run = containerd.ctr([
      'run',
      '--rm',
      '--net-host',
      '--read-only',
      '--seccomp',
      '--user',
      '65532:65532',
      '--cgroup',
      `/${ns.cgroupRoot}/mirror-sync`,
      '--env',
      'KUBECONFIG=/etc/captf/kubeconfig',
      // No event is sent here: the sender check has no Triggers to name.
      ...Object.entries(UNSIGNED_EVENTS).flatMap(([k, v]) => ['--env', `${k}=${v}`]),
      '--mount',
      `type=bind,src=${kubeconfig},dst=/etc/captf/kubeconfig,options=rbind:ro`,
      product.ref,
      'mirror-sync', // the container's ID
      // ctr replaces the image's ENTRYPOINT with the command (a pod's `args` would follow it).
      ...PRODUCT_CONFIG.Entrypoint,
      'mirror-sync',
    ]);
    const url = `http://127.0.0.1:${ns.forwarded.get(8080)}/healthz`;
    await eventually(
      '/healthz through the node',
      async () => (await fetch(url).catch(() => undefined))?.status === 200,
    );
    const task = (await containerd.ctr(['tasks', 'ls'])).split('\n').find((l) => l.startsWith('mirror-sync '));
    const pid = Number(task?.split(/\s+/)[1]);
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    assert.match(status, /^Uid:\s+65532\s/m, 'runs as 65532');
    assert.match(status, /^Seccomp:\s+2$/m, 'under a seccomp filter');
    const root = readFileSync(`/proc/${pid}/mountinfo`, 'utf8')
      .split('\n')
      .map((l) => l.split(' '))
      .find((f) => f[4] === '/');
    assert.ok(root?.[5]?.split(',').includes('ro'), `its root is mounted read-only: ${root?.join(' ')}`);
    assert.equal(readFileSync(`/proc/${pid}/cgroup`, 'utf8').includes(`/${ns.cgroupRoot}/mirror-sync`), true);
    await containerd.ctr(['tasks', 'kill', '-s', 'SIGTERM', 'mirror-sync']);
    assert.match(await run, /"message":"stopped"/, 'stopped on SIGTERM; ctr run exits 0 with the task');
  });

  it('the node stops with nothing left: no process, no cgroup', async () => {
    await ns.stop();
    assert.deepEqual(markedProcesses(dir), []);
    const cgroups = cgroupHierarchies().flatMap((h) =>
      [ns.cgroupRoot, 'k8s.io'].map((c) => join('/sys/fs/cgroup', h, c)).filter((d) => existsSync(d)),
    );
    assert.deepEqual(cgroups, []);
  });
});
