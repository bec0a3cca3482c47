import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { V1Job, V1PodSpec } from '@kubernetes/client-node';
import {
  CREDENTIALS_FILE_MODE,
  CREDENTIALS_MOUNT_PATH,
  CREDENTIALS_VOLUME,
  DEFAULT_FS_GROUP,
  credentialDelivery,
  jobWithCredentials,
  withCredentialDelivery,
} from '../../functions/lib/delivery.ts';
import { mirrorName } from '../../functions/lib/mirror.ts';

const pod = (over: Partial<V1PodSpec> = {}): V1PodSpec => ({
  restartPolicy: 'Never',
  containers: [
    { name: 'terraform', image: 'example.invalid/captf:dev', command: ['captf-runner', '--', 'terraform', 'apply'] },
  ],
  ...over,
});

describe('credentialDelivery (SPEC §11)', () => {
  it('builds envFrom, a 0440 secret volume, a read-only mount and fsGroup from the mirror name', () => {
    const d = credentialDelivery('aws-prod', 'terraform');
    assert.deepEqual(d, {
      mirror: 'captf-creds-aws-prod',
      containerName: 'terraform',
      envFrom: [{ secretRef: { name: 'captf-creds-aws-prod', optional: false } }],
      volumeMounts: [{ name: 'captf-credentials', mountPath: '/var/run/captf/credentials', readOnly: true }],
      volumes: [
        {
          name: 'captf-credentials',
          secret: { secretName: 'captf-creds-aws-prod', defaultMode: 288, optional: false },
        },
      ],
      securityContext: { fsGroup: DEFAULT_FS_GROUP },
    });
    assert.equal(CREDENTIALS_FILE_MODE, 0o440);
    assert.equal(CREDENTIALS_MOUNT_PATH, '/var/run/captf/credentials');
  });

  it('uses the hashed mirror name for an identity whose plain mirror name would pass 253 characters', () => {
    const id = 'x'.repeat(250);
    const d = credentialDelivery(id);
    assert.equal(d.mirror, mirrorName(id));
    assert.equal(d.mirror.length, 'captf-creds-'.length + 16);
    assert.equal(d.envFrom[0]!.secretRef!.name, d.mirror);
    assert.equal(d.volumes[0]!.secret!.secretName, d.mirror);
  });

  it('takes a chosen fsGroup and refuses ones the API server or a non-root runner cannot use', () => {
    assert.equal(credentialDelivery('a', undefined, { fsGroup: 1000 }).securityContext.fsGroup, 1000);
    for (const bad of [0, -1, 1.5, 2 ** 31, Number.NaN]) {
      assert.throws(
        () => credentialDelivery('a', undefined, { fsGroup: bad }),
        /fsGroup must be an integer/,
        String(bad),
      );
    }
    assert.throws(() => credentialDelivery(''), /identityName is required/);
  });
});

describe('withCredentialDelivery', () => {
  it('adds the pieces to the only container when no container is named, without touching the input', () => {
    const input = pod({ securityContext: { runAsNonRoot: true, runAsUser: 10001 } });
    const before = structuredClone(input);
    const out = withCredentialDelivery(input, credentialDelivery('aws'));
    assert.deepEqual(input, before, 'input not mutated');
    const c = out.containers[0]!;
    assert.deepEqual(c.envFrom, [{ secretRef: { name: 'captf-creds-aws', optional: false } }]);
    assert.deepEqual(c.volumeMounts, [{ name: CREDENTIALS_VOLUME, mountPath: CREDENTIALS_MOUNT_PATH, readOnly: true }]);
    assert.deepEqual(out.volumes, [
      { name: CREDENTIALS_VOLUME, secret: { secretName: 'captf-creds-aws', defaultMode: 288, optional: false } },
    ]);
    assert.deepEqual(out.securityContext, { runAsNonRoot: true, runAsUser: 10001, fsGroup: DEFAULT_FS_GROUP });
    assert.deepEqual(c.command, input.containers[0]!.command);
  });

  it('gives the credentials to the named container only (not sidecars or init containers)', () => {
    const input = pod({
      initContainers: [{ name: 'fetch-modules', image: 'busybox' }],
      containers: [
        { name: 'log-shipper', image: 'busybox' },
        { name: 'terraform', image: 'tf', envFrom: [{ configMapRef: { name: 'settings' } }] },
      ],
    });
    const out = withCredentialDelivery(input, credentialDelivery('aws', 'terraform'));
    assert.deepEqual(out.initContainers, input.initContainers);
    assert.deepEqual(out.containers[0], input.containers[0]);
    // Appended after existing sources, so the mirror wins over them; the container's env still wins over both.
    assert.deepEqual(out.containers[1]!.envFrom, [
      { configMapRef: { name: 'settings' } },
      { secretRef: { name: 'captf-creds-aws', optional: false } },
    ]);
  });

  it('keeps an fsGroup the pod already sets', () => {
    const out = withCredentialDelivery(
      pod({ securityContext: { fsGroup: 2000 } }),
      credentialDelivery('aws', undefined, { fsGroup: 3000 }),
    );
    assert.equal(out.securityContext!.fsGroup, 2000);
  });

  it('is idempotent: applying twice equals applying once', () => {
    const d = credentialDelivery('aws', 'terraform');
    const once = withCredentialDelivery(pod(), d);
    assert.deepEqual(withCredentialDelivery(once, d), once);
  });

  const refusals: { name: string; spec: V1PodSpec; container?: string; error: RegExp }[] = [
    { name: 'no container of that name', spec: pod(), container: 'tf', error: /no container named "tf"/ },
    {
      name: 'several containers and none named',
      spec: pod({ containers: [{ name: 'a' }, { name: 'b' }] }),
      error: /2 containers: name the one/,
    },
    { name: 'no containers at all', spec: pod({ containers: [] }), error: /0 containers/ },
    {
      name: 'another volume already uses the name',
      spec: pod({ volumes: [{ name: CREDENTIALS_VOLUME, emptyDir: {} }] }),
      error: /different volume named "captf-credentials"/,
    },
    {
      name: 'the volume exists for another identity',
      spec: pod({
        volumes: [
          { name: CREDENTIALS_VOLUME, secret: { secretName: 'captf-creds-gcp', defaultMode: 288, optional: false } },
        ],
      }),
      error: /different volume/,
    },
    {
      name: 'the container already mounts something at the path',
      spec: pod({
        containers: [{ name: 'terraform', volumeMounts: [{ name: 'scratch', mountPath: CREDENTIALS_MOUNT_PATH }] }],
      }),
      error: /already mounts "scratch" at "\/var\/run\/captf\/credentials"/,
    },
    {
      name: 'the mount exists but is writable',
      spec: pod({
        containers: [
          { name: 'terraform', volumeMounts: [{ name: CREDENTIALS_VOLUME, mountPath: CREDENTIALS_MOUNT_PATH }] },
        ],
      }),
      error: /already mounts/,
    },
    { name: 'a Windows pod (fsGroup is not allowed there)', spec: pod({ os: { name: 'windows' } }), error: /Windows/ },
  ];
  for (const r of refusals) {
    it(`refuses when ${r.name}`, () => {
      assert.throws(() => withCredentialDelivery(r.spec, credentialDelivery('aws', r.container)), r.error);
    });
  }

  it('accepts pieces that are already present when they are identical (e.g. read back from the API)', () => {
    const d = credentialDelivery('aws');
    const present = pod({
      volumes: [
        { name: CREDENTIALS_VOLUME, secret: { optional: false, defaultMode: 288, secretName: 'captf-creds-aws' } },
      ],
      containers: [
        {
          name: 'terraform',
          volumeMounts: [{ readOnly: true, mountPath: CREDENTIALS_MOUNT_PATH, name: CREDENTIALS_VOLUME }],
        },
      ],
    });
    const out = withCredentialDelivery(present, d);
    assert.equal(out.volumes!.length, 1);
    assert.equal(out.containers[0]!.volumeMounts!.length, 1);
  });
});

describe('jobWithCredentials', () => {
  it('applies the delivery to the Job pod template and leaves the rest of the Job alone', () => {
    const job: V1Job = {
      apiVersion: 'batch/v1',
      kind: 'Job',
      metadata: { name: 'apply', labels: { a: 'b' } },
      spec: { backoffLimit: 0, template: { metadata: { labels: { app: 'tf' } }, spec: pod() } },
    };
    const out = jobWithCredentials(job, 'aws', 'terraform', { fsGroup: 4242 });
    assert.deepEqual(out.metadata, job.metadata);
    assert.equal(out.spec!.backoffLimit, 0);
    assert.deepEqual(out.spec!.template.metadata, { labels: { app: 'tf' } });
    assert.deepEqual(
      out.spec!.template.spec,
      withCredentialDelivery(pod(), credentialDelivery('aws', 'terraform', { fsGroup: 4242 })),
    );
    assert.equal(job.spec!.template.spec!.volumes, undefined, 'input not mutated');
  });
  it('refuses a Job without a pod template spec', () => {
    assert.throws(() => jobWithCredentials({ spec: {} } as V1Job, 'aws'), /no spec.template.spec/);
  });
});
