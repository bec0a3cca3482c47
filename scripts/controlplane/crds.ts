/**
 * Installs CRDs with server-side apply and waits until each is Established — used by the test
 * harness and the local mode: the project's own (manifests/crds/), and the real ones of Knative
 * Serving/Eventing, cert-manager and prometheus-operator, read from the module cache at the versions pinned in
 * scripts/tools/go/crds/go.mod, so manifests can be server-side dry-run against them (SPEC §13).
 */
import { execFile } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import {
  ApiextensionsV1Api,
  KubernetesObjectApi,
  loadAllYaml,
  type KubeConfig,
  type KubernetesObject,
  type V1CustomResourceDefinition,
} from '@kubernetes/client-node';
import { FIELD_MANAGER } from '../../functions/lib/api.ts';
import { serverSideApply } from '../lib/kube.ts';
import { eventually } from '../lib/wait.ts';
import { REPO_ROOT } from '../tools/build.ts';

const execFileP = promisify(execFile);

/** Every CRD document in manifests/crds/*.yaml (kustomization.yaml excluded). */
export function loadCRDs(): V1CustomResourceDefinition[] {
  const dir = join(REPO_ROOT, 'manifests', 'crds');
  return readdirSync(dir)
    .filter((f) => f.endsWith('.yaml') && f !== 'kustomization.yaml')
    .flatMap((f) => loadAllYaml(readFileSync(join(dir, f), 'utf8')) as V1CustomResourceDefinition[]);
}

/**
 * Applies CRDs (server-side apply, field manager `captf-credentials`, forced), waits for
 * `Established=True` on each, then until each resource answers a list (right after
 * Established, lists may still get 429 while its storage initialises).
 * @returns the CRD names.
 * @throws Error naming the CRD when the API server rejects it, or when they are not all ready within a minute.
 */
export async function applyCRDs(kc: KubeConfig, crds: readonly V1CustomResourceDefinition[]): Promise<string[]> {
  const objects = KubernetesObjectApi.makeApiClient(kc);
  const ext = kc.makeApiClient(ApiextensionsV1Api);
  for (const crd of crds) await serverSideApply(kc, crd as KubernetesObject, FIELD_MANAGER);
  const deadline = Date.now() + 60_000;
  const waitFor = (what: string, ready: () => Promise<boolean>) =>
    eventually(what, ready, Math.max(0, deadline - Date.now()));
  for (const crd of crds) {
    const name = crd.metadata!.name!;
    await waitFor(`CRD ${name} to be Established`, async () =>
      Boolean(
        (await ext.readCustomResourceDefinition({ name })).status?.conditions?.some(
          (c) => c.type === 'Established' && c.status === 'True',
        ),
      ),
    );
    const { group, names, versions } = crd.spec;
    const version = versions.find((v) => v.storage)?.name ?? versions[0]!.name;
    await waitFor(`CRD ${name} to serve lists`, async () => {
      await objects.list(
        `${group}/${version}`,
        names.kind,
        undefined,
        undefined,
        undefined,
        undefined,
        undefined,
        undefined,
        1,
      );
      return true;
    });
  }
  return crds.map((c) => c.metadata!.name!);
}

/** Installs the project's own CRDs (manifests/crds/) with {@link applyCRDs}. */
export function installCRDs(kc: KubeConfig): Promise<string[]> {
  return applyCRDs(kc, loadCRDs());
}

/** Third-party CRD files and the pinned module they come from. */
export interface CrdSource {
  module: string;
  files: string[];
}

/**
 * The CRDs the manifests use, by module (paths inside the module). Knative Serving's
 * Service; Eventing's ApiServerSource, PingSource, Broker, Trigger, EventPolicy; cert-manager's Issuer
 * and Certificate; prometheus-operator's PrometheusRule (components/observability).
 */
export const THIRD_PARTY_CRDS: readonly CrdSource[] = [
  { module: 'knative.dev/serving', files: ['config/core/300-resources/service.yaml'] },
  {
    module: 'knative.dev/eventing',
    files: ['apiserversource', 'pingsource', 'broker', 'trigger', 'eventpolicy'].map(
      (n) => `config/core/resources/${n}.yaml`,
    ),
  },
  {
    module: 'github.com/cert-manager/cert-manager',
    files: ['cert-manager.io_issuers.yaml', 'cert-manager.io_certificates.yaml'].map((n) => `deploy/crds/${n}`),
  },
  {
    module: 'github.com/prometheus-operator/prometheus-operator',
    files: ['example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml'],
  },
];

/** The module that pins the third-party CRDs' modules; nothing is built from it. */
const CRDS_MODULE_DIR = join(REPO_ROOT, 'scripts', 'tools', 'go', 'crds');

/**
 * Downloads (or finds in the module cache) a module at the version a wrapper module pins.
 * @param wrapper the wrapper module's folder (default the one pinning the third-party CRDs).
 * @returns its folder in the module cache and its version.
 * @throws Error with `go`'s answer when the proxy does not serve it or the wrapper does not pin it.
 */
export async function downloadModule(
  module: string,
  wrapper = CRDS_MODULE_DIR,
): Promise<{ Dir: string; Version: string }> {
  const { stdout } = await execFileP('go', ['mod', 'download', '-json', module], {
    cwd: wrapper,
    env: { ...process.env, GOFLAGS: '-mod=readonly' },
    maxBuffer: 1 << 20,
  }).catch((err: { stdout?: string; message: string }) => {
    throw new Error(`go mod download ${module} (in ${wrapper}): ${err.stdout || err.message}`);
  });
  const info = JSON.parse(stdout) as { Dir?: string; Version: string; Error?: string };
  if (!info.Dir) throw new Error(`go mod download ${module}: ${info.Error ?? 'no Dir'}`);
  return { Dir: info.Dir, Version: info.Version };
}

/**
 * Downloads (or finds in the module cache) each pinned module and parses its CRD files.
 * @param sources which files of which modules (default {@link THIRD_PARTY_CRDS}).
 * @returns the CRDs, each with the module@version it came from.
 * @throws Error when `go mod download` fails (the module proxy does not serve a version).
 */
export async function loadThirdPartyCRDs(
  sources: readonly CrdSource[] = THIRD_PARTY_CRDS,
): Promise<{ source: string; crd: V1CustomResourceDefinition }[]> {
  const out: { source: string; crd: V1CustomResourceDefinition }[] = [];
  for (const src of sources) {
    const info = await downloadModule(src.module);
    for (const f of src.files) {
      for (const doc of loadAllYaml(readFileSync(join(info.Dir, f), 'utf8')) as V1CustomResourceDefinition[]) {
        if (doc?.kind === 'CustomResourceDefinition')
          out.push({ source: `${src.module}@${info.Version}/${f}`, crd: doc });
      }
    }
  }
  return out;
}

/**
 * Installs third-party CRDs with the project's {@link applyCRDs} (server-side apply, then
 * Established and serving lists).
 * @param sources which files of which modules (default {@link THIRD_PARTY_CRDS}).
 * @returns the CRD names installed.
 * @throws Error when the API server rejects one or it is not ready in a minute.
 */
export async function installThirdPartyCRDs(
  kc: KubeConfig,
  sources: readonly CrdSource[] = THIRD_PARTY_CRDS,
): Promise<string[]> {
  return applyCRDs(
    kc,
    (await loadThirdPartyCRDs(sources)).map((c) => c.crd),
  );
}

/**
 * The CRDs Knative Eventing's broker data plane reads or writes (scripts/eventing/dataplane.ts): Broker,
 * Trigger, EventPolicy, EventType, Subscription (the ingress, filter and dispatcher watch
 * them), PingSource, ApiServerSource, and the InMemoryChannel, all from knative.dev/eventing
 * at the version pinned in scripts/tools/go/crds/go.mod.
 */
export const EVENTING_CRDS: readonly CrdSource[] = [
  {
    module: 'knative.dev/eventing',
    files: [
      ...['broker', 'trigger', 'eventpolicy', 'eventtype', 'subscription', 'pingsource', 'apiserversource'].map(
        (n) => `config/core/resources/${n}.yaml`,
      ),
      'config/channels/in-memory-channel/resources/in-memory-channel.yaml',
    ],
  },
];

/**
 * cert-manager's CRDs as its controller and Knative Serving's cert-manager integration need them
 * (Serving's controller refuses to start without all five: `cmd/controller/main.go`
 * `certManagerCRDsExist`), for the cert-manager stand-in (scripts/certmanager/).
 */
export const CERT_MANAGER_CRDS: readonly CrdSource[] = [
  {
    module: 'github.com/cert-manager/cert-manager',
    files: [
      'cert-manager.io_issuers.yaml',
      'cert-manager.io_clusterissuers.yaml',
      'cert-manager.io_certificates.yaml',
      'cert-manager.io_certificaterequests.yaml',
      'acme.cert-manager.io_challenges.yaml',
    ].map((n) => `deploy/crds/${n}`),
  },
];

/**
 * Installs {@link EVENTING_CRDS} with {@link installThirdPartyCRDs}. Idempotent, and safe beside
 * installing {@link THIRD_PARTY_CRDS} (and a concurrent call): both apply the same files with the
 * same field manager, so the CRDs they share come out unchanged.
 */
export const installEventingCRDs = (kc: KubeConfig): Promise<string[]> => installThirdPartyCRDs(kc, EVENTING_CRDS);
