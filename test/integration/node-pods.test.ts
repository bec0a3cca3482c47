/**
 * The product as pods on a real node (scripts/node/node.ts, started by the system starter with
 * `node: true`): each function runs from the image with its Knative Service's pod spec as
 * rendered (scripts/node/pods.ts adds what Knative would), under its ServiceAccount with the
 * manifests' RBAC, reaches the API server through the `kubernetes` ClusterIP with its projected
 * token and does its job; TERM ends each pod cleanly; a Terraform Job made by the delivery
 * fragment runs `captf-runner` from the image as non-root with the credentials by `envFrom`
 * and as 0440 files readable through `fsGroup`. The only test file with pods (and with its
 * own control plane, inside the node); needs root.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { before, describe, it } from 'node:test';
import { Watch, type KubernetesObject, type V1ContainerStateTerminated, type V1Pod } from '@kubernetes/client-node';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { containerCgroup } from '../../scripts/node/cgroups.ts';
import { applyFunctionRbac, functionPod, runPod } from '../../scripts/node/pods.ts';
import { shippedSender } from '../../scripts/system/senders.ts';
import { FUNCTION_NAMES, startSystem, type FunctionName } from '../../scripts/system/system.ts';
import { render } from '../../scripts/tools/kustomize.ts';
import { admissionReview, identityRequest } from '../helpers/admission.ts';
import { eventually, suffix } from '../helpers/cluster.ts';
import { pingEvent, postEvents, RENDERED_MANIFESTS } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';
import { SENTINEL_KEY } from '../helpers/leaks.ts';
import {
  assertTerraformSaw,
  runTerraformJob,
  scanNodeLogs,
  terraformConsumer,
  TERRAFORM_KEYS,
} from '../helpers/node.ts';
import { consumerEvent, operatorSource } from '../helpers/mirror-sync.ts';
import { manager, postPrepare, prepareTarget } from '../helpers/prepare.ts';

const work = mkdtempSync(join(tmpdir(), 'captf-node-pods-'));
const progress: string[] = [];
const system = await startSystem({ dir: work, progress: (l) => progress.push(l), node: true });
const node = system.node!;
// This file's world lives in the node's control plane, not in the suite's shared one.
process.env.CAPTF_TEST_CONTROLPLANE = system.controlPlane!.dir;
const w = fx.world('pods');
// The world's first cleanup, so its last: after the leak scan, whatever it found.
w.onCleanup(async () => {
  await system.stop();
  rmSync(work, { recursive: true, force: true });
});

const rendered = (await render(RENDERED_MANIFESTS)) as KubernetesObject[];
scanNodeLogs(work);

/** The main process of a pod's first container, and its memory cgroup. */
function containerOf(pod: V1Pod): { pid: number; memory: string } {
  const id = pod.status!.containerStatuses![0]!.containerID!.replace(/^containerd:\/\//, '');
  const memory = containerCgroup(node.namespace.cgroupRoot, 'memory', id);
  const pids = readFileSync(join(memory, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
  const pid = pids.find((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('/app/dist/'));
  assert.ok(pid, `a node process of the image in ${memory}`);
  return { pid, memory };
}

/** One request as the node's API server audited it. */
interface Audited {
  verb: string;
  objectRef?: { resource?: string; namespace?: string; name?: string };
  user: { username: string };
  sourceIPs: string[];
}

/** Every request the node's API server has audited so far. */
const audited = (): Audited[] =>
  readFileSync(join(system.controlPlane!.dir, 'logs', 'audit.log'), 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Audited);

/** The ServiceAccount user of a function's pod. */
const serviceAccountOf = (fn: FunctionName) =>
  `system:serviceaccount:captf-system:${pods[fn].spec!.serviceAccountName}`;

const pods = {} as Record<FunctionName, V1Pod>;
const urls = {} as Record<FunctionName, string>;
/** Each event function's deliveries signed as Knative signs them for one of its shipped Triggers. */
const signed = {} as Record<'mirror-sync' | 'identity-status', string>;

before(async () => {
  await applyFunctionRbac(system.kc, rendered);
  await Promise.all(
    FUNCTION_NAMES.map(async (fn) => {
      pods[fn] = await runPod(system.kc, functionPod(rendered, fn, { image: node.image.ref }), { intervalMs: 500 });
      urls[fn] = `http://127.0.0.1:${await node.forward({ host: pods[fn].status!.podIP!, port: 8080 })}`;
    }),
  );
  for (const fn of ['mirror-sync', 'identity-status'] as const)
    signed[fn] = await shippedSender(system.kc, rendered, fn);
});

describe('each function as a pod from its Knative Service', () => {
  it('runs as 65532 under seccomp, no capabilities, no new privileges, a read-only root, its memory limit', () => {
    for (const fn of FUNCTION_NAMES) {
      const { pid, memory } = containerOf(pods[fn]);
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      assert.match(status, /^Uid:\s+65532\s+65532\s/m, `${fn} runs as 65532`);
      assert.match(status, /^Seccomp:\s+2$/m, `${fn} runs under a seccomp filter`);
      assert.match(status, /^NoNewPrivs:\s+1$/m, `${fn} cannot gain privileges`);
      assert.match(status, /^CapEff:\s+0+$/m, `${fn} holds no capability`);
      const root = readFileSync(`/proc/${pid}/mountinfo`, 'utf8')
        .split('\n')
        .map((l) => l.split(' '))
        .find((f) => f[4] === '/');
      assert.ok(root?.[5]?.split(',').includes('ro'), `${fn}'s root is read-only`);
      const limit = pods[fn].spec!.containers[0]!.resources!.limits!.memory!;
      const mi = Number(/^(\d+)Mi$/.exec(limit)?.[1]);
      assert.equal(Number(readFileSync(join(memory, 'memory.limit_in_bytes'), 'utf8')), mi * 1024 * 1024, fn);
    }
  });

  it('mirror-sync: an event about a new consumer makes its mirror, with its own token through the ClusterIP', async () => {
    const source = await operatorSource(w, fx.data({ AWS_ACCESS_KEY_ID: 'AKIA-pods' }));
    const ns = await w.namespace();
    const id = await source.newIdentity(fx.allowList(ns));
    const consumer = await w.create(fx.consumer('c', fx.inNamespace(ns), fx.identityRef(id)));
    const event = consumerEvent(consumer, 'ref', 'add');
    // The pod checks its sender as shipped: unsigned, the delivery is refused before any work.
    assert.equal((await postEvents(`${urls['mirror-sync']}/`, event)).status, 401);
    const r = await postEvents(`${urls['mirror-sync']}/`, event, 'binary', undefined, signed['mirror-sync']);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.text, '', 'the answer names nothing (SPEC §12): the end state says what happened');
    const mirror = await w.clients.core.readNamespacedSecret({ namespace: ns, name: mirrorName(id) });
    assert.deepEqual(
      mirror.metadata?.ownerReferences?.map((o) => o.name),
      ['c'],
    );
    // Who wrote it, from where: its ServiceAccount, from the pod's own address (the ClusterIP is
    // DNATed, not masqueraded), with the in-cluster configuration the kubelet gave it.
    const { pid } = containerOf(pods['mirror-sync']);
    const environ = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
    assert.ok(environ.includes('KUBERNETES_SERVICE_HOST=10.0.0.1'), 'the kubernetes ClusterIP');
    assert.ok(!environ.some((e) => e.startsWith('KUBECONFIG=')), 'no kubeconfig: the projected token');
    const write = audited().find(
      (e) => e.verb === 'create' && e.objectRef?.resource === 'secrets' && e.objectRef.namespace === ns,
    );
    assert.equal(write?.user.username, serviceAccountOf('mirror-sync'));
    assert.deepEqual(write?.sourceIPs, [pods['mirror-sync'].status!.podIP]);
  });

  it('mirror-sync: prepare answers the provider manager by its audience-bound token, and refuses without one', async () => {
    const source = await operatorSource(w);
    const ns = await w.namespace();
    const id = await source.newIdentity(fx.allowList(ns));
    const consumer = await w.create(fx.consumer('p', fx.inNamespace(ns), fx.identityRef(id)));
    const caller = await manager(w);
    const ok = await postPrepare(urls['mirror-sync'], prepareTarget(consumer), caller);
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.body.mirror, mirrorName(id));
    assert.equal((await postPrepare(urls['mirror-sync'], prepareTarget(consumer), undefined)).status, 401);
  });

  it('admission: an AdmissionReview is decided with a SubjectAccessReview made as its ServiceAccount', async () => {
    const source = await operatorSource(w);
    const review = (user: string) =>
      admissionReview(
        identityRequest('CREATE', fx.identity('aws', source.ref), undefined, {
          uid: suffix(),
          userInfo: { username: user, groups: [] },
        }),
      );
    const post = async (body: unknown) => {
      const r = await fetch(`${urls.admission}/validate`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      assert.equal(r.status, 200);
      return ((await r.json()) as { response: { allowed: boolean; status?: { message?: string } } }).response;
    };
    const refused = await post(review('nobody'));
    assert.equal(refused.allowed, false);
    assert.match(refused.status?.message ?? '', /get/);
    // system:masters may get every Secret.
    const allowed = await post(
      admissionReview(
        identityRequest('CREATE', fx.identity('aws', source.ref), undefined, {
          uid: suffix(),
          userInfo: { username: 'admin', groups: ['system:masters'] },
        }),
      ),
    );
    assert.equal(allowed.allowed, true, JSON.stringify(allowed));
    const reviews = audited().filter((e) => e.objectRef?.resource === 'subjectaccessreviews');
    assert.ok(
      reviews.some(
        (e) => e.user.username === serviceAccountOf('admission') && e.sourceIPs[0] === pods.admission.status!.podIP,
      ),
      'the SubjectAccessReviews came from the admission pod as its ServiceAccount',
    );
  });

  it("identity-status: a ping sets each identity's Ready condition", async () => {
    const source = await operatorSource(w);
    const id = await source.newIdentity();
    const r = await postEvents(
      `${urls['identity-status']}/`,
      pingEvent('status'),
      'binary',
      undefined,
      signed['identity-status'],
    );
    assert.equal(r.status, 200, r.text);
    const stored = await w.read(fx.identity(id));
    assert.equal(fx.conditionOf(stored!, 'Ready')?.status, 'True');
    const write = audited().find((e) => e.objectRef?.name === id && e.verb === 'patch');
    assert.equal(write?.user.username, serviceAccountOf('identity-status'));
  });
});

describe('the Terraform Job', () => {
  it('runs captf-runner from the image as non-root: keys by envFrom, 0440 files through fsGroup, TF_/KUBE_ stripped but still files', async () => {
    const { ns, id, consumer } = await terraformConsumer(w, 'job');
    const event = consumerEvent(consumer, 'ref', 'add');
    assert.equal(
      (await postEvents(`${urls['mirror-sync']}/`, event, 'binary', undefined, signed['mirror-sync'])).status,
      200,
    );
    const ran = await runTerraformJob(w, work, { namespace: ns, identity: id, image: node.image.ref, pull: 'Never' });
    assertTerraformSaw(ran, [...Object.keys(TERRAFORM_KEYS), SENTINEL_KEY]);
  });
});

describe('TERM', () => {
  it('ends each function pod cleanly within its grace period', async () => {
    // The kubelet reports each container's end before the pod object goes (with its log).
    const ended = new Map<string, V1ContainerStateTerminated>();
    const watch = await new Watch(system.kc).watch(
      `/api/v1/namespaces/${pods.admission.metadata!.namespace}/pods`,
      {},
      (_type, p: V1Pod) => {
        const t = p.status?.containerStatuses?.[0]?.state?.terminated;
        if (t) ended.set(p.metadata!.name!, t);
      },
      () => undefined,
    );
    try {
      await Promise.all(
        FUNCTION_NAMES.map((fn) =>
          w.clients.core.deleteNamespacedPod({
            namespace: pods[fn].metadata!.namespace!,
            name: pods[fn].metadata!.name!,
          }),
        ),
      );
      for (const fn of FUNCTION_NAMES) {
        const p = pods[fn];
        const t = await eventually(
          `${fn}'s container to end`,
          async () => ended.get(p.metadata!.name!),
          (p.spec!.terminationGracePeriodSeconds! + 30) * 1000,
          500,
        );
        // Exit 0: it drained and exited on TERM; SIGKILL at the deadline would be 137.
        assert.deepEqual({ exitCode: t.exitCode, reason: t.reason }, { exitCode: 0, reason: 'Completed' }, fn);
      }
    } finally {
      watch.abort();
    }
  });
});
