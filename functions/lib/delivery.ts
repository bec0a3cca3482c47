/**
 * SPEC §11: how a Terraform Job receives an identity's credentials — the pod-spec pieces that
 * mount the namespace's mirror Secret, and a pure helper that adds them to a Job or PodSpec.
 * The provider's manager calls these after mirror-sync's `POST /prepare` answered 200 (§5).
 * Pure: no I/O; inputs are never mutated.
 */
import { isDeepStrictEqual } from 'node:util';
import type {
  V1Container,
  V1EnvFromSource,
  V1Job,
  V1PodSecurityContext,
  V1PodSpec,
  V1Volume,
  V1VolumeMount,
} from '@kubernetes/client-node';
import { mirrorName } from './mirror.ts';

/** Where the mirror's keys appear as files, one file per key (SPEC §11). */
export const CREDENTIALS_MOUNT_PATH = '/var/run/captf/credentials';
/** Name of the pod volume that holds the mirror. */
export const CREDENTIALS_VOLUME = 'captf-credentials';
/** Mode of every credential file: owner and group may read, nobody writes (0440 = 288). */
export const CREDENTIALS_FILE_MODE = 0o440;
/**
 * The `fsGroup` used when the caller names none. Any non-zero group works: the kubelet
 * makes the secret volume's files group-owned by `fsGroup` and adds that group to every
 * container's supplementary groups, so the runner reads the 0440 files whatever its UID.
 * 65532 is the conventional "nonroot" group of distroless-style images.
 */
export const DEFAULT_FS_GROUP = 65532;
/** Largest `fsGroup` the API server accepts (its group-ID validation allows 0..2^31-1). */
export const MAX_FS_GROUP = 2_147_483_647;

/** The pod-spec pieces that deliver one identity's mirror to one container. */
export interface CredentialDelivery {
  /** The mirror Secret the pieces reference (`mirrorName(identity)`). */
  mirror: string;
  /** Container to receive `envFrom` and the mount; undefined means "the pod's only container". */
  containerName: string | undefined;
  /** For the container: `[{ secretRef: { name: mirror, optional: false } }]`. */
  envFrom: V1EnvFromSource[];
  /** For the container: one read-only mount of {@link CREDENTIALS_VOLUME} at {@link CREDENTIALS_MOUNT_PATH}. */
  volumeMounts: V1VolumeMount[];
  /** For the pod: one `secret` volume of the mirror with `defaultMode` 0440. */
  volumes: V1Volume[];
  /** For the pod: `{ fsGroup }`, so a non-root runner can read the 0440 files. */
  securityContext: V1PodSecurityContext;
}

/**
 * SPEC §11: builds the pieces a Job's pod needs to receive the credentials of `identityName`:
 * the mirror as environment (`envFrom`) and as read-only files (a `secret` volume, mode
 * 0440, mounted at `/var/run/captf/credentials`), plus the pod's `fsGroup`.
 *
 * Both references say `optional: false` so a pod whose mirror is missing does not start
 * (the kubelet reports `CreateContainerConfigError`) instead of running Terraform without
 * credentials.
 *
 * @param identityName the TerraformClusterIdentity's `metadata.name`.
 * @param containerName the container that runs `captf-runner`; omit when the pod has one container.
 * @param opts.fsGroup group ID for `securityContext.fsGroup` (default {@link DEFAULT_FS_GROUP}).
 * @throws Error when `identityName` is empty or `fsGroup` is not an integer in 1..2147483647
 *   (0 is refused: it would put the runner in root's group).
 */
export function credentialDelivery(
  identityName: string,
  containerName?: string,
  opts: { fsGroup?: number } = {},
): CredentialDelivery {
  if (!identityName) throw new Error('credentialDelivery: identityName is required');
  const fsGroup = opts.fsGroup ?? DEFAULT_FS_GROUP;
  if (!Number.isInteger(fsGroup) || fsGroup < 1 || fsGroup > MAX_FS_GROUP) {
    throw new Error(`credentialDelivery: fsGroup must be an integer from 1 to ${MAX_FS_GROUP} (got ${fsGroup})`);
  }
  const mirror = mirrorName(identityName);
  return {
    mirror,
    containerName,
    envFrom: [{ secretRef: { name: mirror, optional: false } }],
    volumeMounts: [{ name: CREDENTIALS_VOLUME, mountPath: CREDENTIALS_MOUNT_PATH, readOnly: true }],
    volumes: [
      { name: CREDENTIALS_VOLUME, secret: { secretName: mirror, defaultMode: CREDENTIALS_FILE_MODE, optional: false } },
    ],
    securityContext: { fsGroup },
  };
}

// Objects read back from the API are class instances; compare them as JSON values.
const sameValue = (a: unknown, b: unknown): boolean =>
  isDeepStrictEqual(JSON.parse(JSON.stringify(a ?? null)), JSON.parse(JSON.stringify(b ?? null)));

function targetIndex(containers: readonly V1Container[], name: string | undefined): number {
  if (name === undefined) {
    if (containers.length !== 1) {
      throw new Error(`the pod has ${containers.length} containers: name the one that runs captf-runner`);
    }
    return 0;
  }
  const i = containers.findIndex((c) => c.name === name);
  if (i < 0) throw new Error(`the pod has no container named ${JSON.stringify(name)}`);
  return i;
}

/**
 * Returns a copy of `podSpec` with `delivery` applied: the volume added to the pod, `envFrom`
 * and the mount added to the target container (other containers and init containers get
 * nothing), and `securityContext.fsGroup` set unless the pod already sets one (an existing
 * `fsGroup` serves the same purpose, so it is kept). Applying the same delivery twice
 * changes nothing. The mirror's `envFrom` entry is appended, so it wins over earlier
 * `envFrom` sources, while the container's own `env` entries still win over all of them
 * (Kubernetes `Container.envFrom` precedence).
 *
 * @param podSpec the pod template's spec; not modified.
 * @throws Error when the target container is missing or ambiguous, when a different volume
 *   already uses the name {@link CREDENTIALS_VOLUME}, when the container already mounts
 *   something else at {@link CREDENTIALS_MOUNT_PATH}, or when the pod is a Windows pod
 *   (`fsGroup` is not allowed there).
 */
export function withCredentialDelivery(podSpec: V1PodSpec, delivery: CredentialDelivery): V1PodSpec {
  if (podSpec.os?.name === 'windows')
    throw new Error('fsGroup cannot be set on a Windows pod; credential delivery needs it');
  const containers = podSpec.containers ?? [];
  const index = targetIndex(containers, delivery.containerName);
  const target = containers[index]!;
  const volumes = mergeVolumes(podSpec.volumes ?? [], delivery.volumes);
  const volumeMounts = mergeMounts(target, delivery.volumeMounts);
  const envFrom = [...(target.envFrom ?? [])];
  for (const want of delivery.envFrom) {
    if (!envFrom.some((e) => sameValue(e, want))) envFrom.push(structuredClone(want));
  }
  const securityContext: V1PodSecurityContext = { ...(podSpec.securityContext ?? {}) };
  securityContext.fsGroup ??= delivery.securityContext.fsGroup!;
  const newContainers = containers.map((c, i) => (i === index ? { ...c, envFrom, volumeMounts } : c));
  return { ...podSpec, containers: newContainers, volumes, securityContext };
}

/** The pod's volumes plus the delivery's; throws when a different volume has the same name. */
function mergeVolumes(have: readonly V1Volume[], wanted: readonly V1Volume[]): V1Volume[] {
  const volumes = [...have];
  for (const want of wanted) {
    const same = volumes.find((v) => v.name === want.name);
    if (!same) volumes.push(structuredClone(want));
    else if (!sameValue(same, want))
      throw new Error(`the pod already has a different volume named ${JSON.stringify(want.name)}`);
  }
  return volumes;
}

/** The container's mounts plus the delivery's; throws when something else is at the path or name. */
function mergeMounts(target: V1Container, wanted: readonly V1VolumeMount[]): V1VolumeMount[] {
  const mounts = [...(target.volumeMounts ?? [])];
  for (const want of wanted) {
    const have = mounts.find((m) => m.mountPath === want.mountPath || m.name === want.name);
    if (!have) mounts.push(structuredClone(want));
    else if (!sameValue(have, want)) {
      throw new Error(
        `container ${JSON.stringify(target.name)} already mounts ${JSON.stringify(have.name)} at ${JSON.stringify(have.mountPath)}`,
      );
    }
  }
  return mounts;
}

/**
 * Returns a copy of `job` whose pod template receives the credentials of `identityName`
 * ({@link credentialDelivery} applied with {@link withCredentialDelivery}).
 *
 * @param job a `batch/v1` Job with `spec.template.spec`; not modified.
 * @param containerName the container that runs `captf-runner` (optional with one container).
 * @param opts.fsGroup as in {@link credentialDelivery}.
 * @throws Error when the Job has no pod template spec, or as {@link credentialDelivery} and
 *   {@link withCredentialDelivery} do.
 */
export function jobWithCredentials(
  job: V1Job,
  identityName: string,
  containerName?: string,
  opts: { fsGroup?: number } = {},
): V1Job {
  const podSpec = job.spec?.template?.spec;
  if (!podSpec) throw new Error('the Job has no spec.template.spec');
  const delivery = credentialDelivery(identityName, containerName, opts);
  return {
    ...job,
    spec: { ...job.spec!, template: { ...job.spec!.template, spec: withCredentialDelivery(podSpec, delivery) } },
  };
}
