/**
 * SPEC §11 against the real API server: a Job built with the credential delivery fragment
 * (non-root runner, fsGroup) is accepted, in a dry run and for real, and reads back with every
 * field intact; the job controller's Pod carries the same pieces; the example Job of docs/job-contract.md is
 * exactly what the fragment produces and is accepted too. No kubelet runs, so no Pod starts.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { BatchV1Api, loadYaml, type V1Job, type V1PodSpec } from '@kubernetes/client-node';
import {
  CREDENTIALS_MOUNT_PATH,
  CREDENTIALS_VOLUME,
  DEFAULT_FS_GROUP,
  jobWithCredentials,
} from '../../functions/lib/delivery.ts';
import { apiStatus } from '../../functions/lib/kube.ts';
import { desiredMirror, mirrorName, ownerReferenceFor } from '../../functions/lib/mirror.ts';
import { eventually } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';
import { sentinel } from '../helpers/logs.ts';

const w = fx.world('delivery');
const a = w.clients;
const batch = a.kc.makeApiClient(BatchV1Api);

/** Checks every field the fragment sets on a pod spec read back from the API server. */
function assertDelivered(spec: V1PodSpec | undefined, identity: string, fsGroup: number): void {
  assert.ok(spec);
  const c = spec.containers.find((x) => x.name === 'terraform');
  assert.ok(c);
  assert.equal(c.envFrom?.length, 1);
  assert.equal(c.envFrom[0]!.secretRef?.name, mirrorName(identity));
  assert.equal(c.envFrom[0]!.secretRef?.optional, false);
  assert.equal(c.envFrom[0]!.prefix, undefined, 'no prefix: keys keep their names');
  const mount = c.volumeMounts?.find((m) => m.name === CREDENTIALS_VOLUME);
  assert.equal(mount?.mountPath, '/var/run/captf/credentials');
  assert.equal(mount?.readOnly, true);
  assert.equal(mount?.subPath, undefined, 'no subPath: the kubelet can refresh the files');
  const vol = spec.volumes?.find((v) => v.name === CREDENTIALS_VOLUME);
  assert.equal(vol?.secret?.secretName, mirrorName(identity));
  assert.equal(vol?.secret?.defaultMode, 288);
  assert.equal(vol?.secret?.optional, false);
  assert.equal(vol?.secret?.items, undefined, 'every key becomes a file');
  assert.equal(spec.securityContext?.fsGroup, fsGroup);
  assert.equal(spec.securityContext?.runAsNonRoot, true);
  // The Job's own env entries are kept (they win over envFrom for the same names).
  assert.deepEqual(
    c.env?.map((e) => e.name),
    ['TF_IN_AUTOMATION', 'TF_INPUT', 'KUBE_NAMESPACE'],
  );
}

/**
 * Creates an identity allowing `namespace`, its source, a consumer, and the mirror it owns as
 * mirror-sync would write it (SPEC §3); returns the identity's name. The whole key is real and current: other files'
 * resyncs run cluster-wide on the shared control plane, and would rightly delete a mirror
 * whose identity does not exist.
 */
async function createMirror(namespace: string): Promise<string> {
  const id = w.name('aws');
  const source = await w.create(
    fx.sourceSecret(
      'source',
      fx.inNamespace(namespace),
      fx.data({ AWS_ACCESS_KEY_ID: sentinel(), TF_VAR_token: sentinel() }),
    ),
  );
  await w.create(fx.identity(id, fx.secretRef(namespace, 'source'), fx.allowList(namespace)));
  const owner = await w.create(fx.consumer('cluster-a', fx.inNamespace(namespace), fx.identityRef(id)));
  // Another file's mirror-sync may reconcile this key first (a resync runs cluster-wide): then
  // it wrote this same mirror, and that is as good.
  await a.core
    .createNamespacedSecret({ namespace, body: desiredMirror(id, namespace, source.data, ownerReferenceFor(owner)) })
    .catch((err: unknown) => {
      if (apiStatus(err) !== 409) throw err;
    });
  return id;
}

describe('a Job built with the credential delivery fragment', () => {
  it('is accepted by the API server (dry run and for real) and reads back with every field', async () => {
    const n = await w.namespace();
    const id = await createMirror(n);
    const job = jobWithCredentials(fx.terraformJob('tf-apply', 'apply'), id, 'terraform');

    const dry = await batch.createNamespacedJob({ namespace: n, body: job, dryRun: 'All' });
    assertDelivered(dry.spec?.template.spec, id, DEFAULT_FS_GROUP);
    await assert.rejects(
      batch.readNamespacedJob({ name: 'tf-apply', namespace: n }),
      (e: unknown) => apiStatus(e) === 404,
      'dry run wrote nothing',
    );

    await batch.createNamespacedJob({ namespace: n, body: job });
    const back = await batch.readNamespacedJob({ name: 'tf-apply', namespace: n });
    assertDelivered(back.spec?.template.spec, id, DEFAULT_FS_GROUP);

    // The mirror the Job references exists in the Job's namespace.
    const mirror = await a.core.readNamespacedSecret({
      name: back.spec!.template.spec!.volumes!.find((v) => v.name === CREDENTIALS_VOLUME)!.secret!.secretName!,
      namespace: n,
    });
    assert.equal(mirror.metadata?.annotations?.['captf.io/identity'], id);
  });

  it('makes the job controller create a Pod that carries the same pieces (the Pod never starts: no kubelet)', async () => {
    const n = await w.namespace();
    const id = await createMirror(n);
    await batch.createNamespacedJob({
      namespace: n,
      body: jobWithCredentials(fx.terraformJob('tf-plan', 'apply'), id, 'terraform', { fsGroup: 4242 }),
    });
    const pod = await eventually(
      'the job controller to create the Job Pod',
      async () => {
        const pods = await a.core.listNamespacedPod({
          namespace: n,
          labelSelector: 'batch.kubernetes.io/job-name=tf-plan',
        });
        return pods.items[0];
      },
      120_000,
    );
    assertDelivered(pod.spec, id, 4242);
  });

  it('is checked for real: the same Job with a defaultMode above 0777 is refused', async () => {
    // The API server validates these fields, so the acceptance above means something.
    const n = await w.namespace();
    const job = jobWithCredentials(fx.terraformJob('tf-bad', 'apply'), 'aws', 'terraform');
    job.spec!.template.spec!.volumes![0]!.secret!.defaultMode = 0o1000;
    await assert.rejects(
      batch.createNamespacedJob({ namespace: n, body: job, dryRun: 'All' }),
      (e: unknown) => apiStatus(e) === 422,
    );
  });
});

describe('the example Job of docs/job-contract.md', () => {
  const readme = readFileSync(new URL('../../docs/job-contract.md', import.meta.url), 'utf8');
  const match = /<!-- example-job -->\s*```yaml\n([\s\S]*?)```/.exec(readme);

  it('is exactly what the fragment produces and is accepted by the API server', async () => {
    assert.ok(match, 'docs/job-contract.md has a yaml block after <!-- example-job -->');
    // loadYaml returns client-node class instances; compare plain JSON values.
    const job = JSON.parse(JSON.stringify(loadYaml<V1Job>(match[1]!))) as V1Job;
    const identity = 'aws-prod';
    // Applying the fragment again changes nothing: the example already holds exactly its pieces.
    assert.deepEqual(JSON.parse(JSON.stringify(jobWithCredentials(job, identity, 'terraform'))), job);
    assert.equal(job.spec?.template.spec?.securityContext?.fsGroup, DEFAULT_FS_GROUP);
    assert.equal(job.spec?.template.spec?.containers[0]?.volumeMounts?.[0]?.mountPath, CREDENTIALS_MOUNT_PATH);

    const n = await w.namespace();
    const dry = await batch.createNamespacedJob({
      namespace: n,
      body: { ...job, metadata: { ...job.metadata, namespace: n } },
      dryRun: 'All',
    });
    assertDelivered(dry.spec?.template.spec, identity, DEFAULT_FS_GROUP);
  });
});
