/**
 * Every object every kustomization renders is accepted by the real API server with the real
 * Knative Serving/Eventing and cert-manager CRDs installed (server-side apply, dryRun=All,
 * fieldValidation=Strict) — SPEC §13.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { before, describe, it } from 'node:test';
import type { KubernetesObject } from '@kubernetes/client-node';
import { FIELD_MANAGER } from '../../functions/lib/api.ts';
import { untrustedServerMessage } from '../../functions/lib/api-errors.ts';
import { apiStatus } from '../../functions/lib/kube.ts';
import { installThirdPartyCRDs, loadThirdPartyCRDs } from '../../scripts/controlplane/crds.ts';
import { WireObjects } from '../../scripts/lib/kube.ts';
import { Broker, type IBroker } from '@kubernetes-models/knative/eventing.knative.dev/v1/Broker';
import { Trigger, type ITrigger } from '@kubernetes-models/knative/eventing.knative.dev/v1/Trigger';
import { EventPolicy, type IEventPolicy } from '@kubernetes-models/knative/eventing.knative.dev/v1alpha1/EventPolicy';
import {
  ApiServerSource,
  type IApiServerSource,
} from '@kubernetes-models/knative/sources.knative.dev/v1/ApiServerSource';
import { PingSource, type IPingSource } from '@kubernetes-models/knative/sources.knative.dev/v1/PingSource';
import { REPO_ROOT } from '../../scripts/tools/build.ts';
import { ENTRY_POINT, KNATIVE_LAYOUT, KUSTOMIZATIONS, relocate, render } from '../../scripts/tools/kustomize.ts';
import * as fx from '../helpers/fixtures.ts';

const w = fx.world('manifests');

/** The distinct images of every container the manifests run: the product's, and nothing else. */
const productImages = (objects: readonly KubernetesObject[]): string[] => [
  ...new Set([...JSON.stringify(objects).matchAll(/"image":"([^"]*)"/g)].map((m) => m[1]!)),
];
const a = w.clients;

/**
 * Sends objects to the API server exactly as rendered (no typed model in between that could
 * drop a misspelled field), with `dryRun=All` and `fieldValidation=Strict`: a create, or for an
 * object that already exists (a namespace another test made) a server-side apply, as strict.
 */
async function dryRunApply(o: KubernetesObject): Promise<KubernetesObject> {
  const q = `dryRun=All&fieldValidation=Strict&fieldManager=${FIELD_MANAGER}`;
  const created = await wire.createAsSpelled(o, q);
  const r = created.status === 409 ? await wire.applyAsSpelled(o, `${q}&force=true`) : created;
  if (r.status >= 200 && r.status < 300) return JSON.parse(r.body) as KubernetesObject;
  throw Object.assign(new Error(`HTTP ${r.status}`), { code: r.status, body: r.body });
}
const wire = new WireObjects(a.kc);

before(async () => {
  await installThirdPartyCRDs(a.kc);
});

describe('the rendered manifests against the real CRD schemas', () => {
  it('fetches the pinned Knative Serving, Eventing and cert-manager CRDs from their Go modules', async () => {
    const sources = (await loadThirdPartyCRDs()).map((c) => `${c.crd.metadata!.name} ← ${c.source}`);
    for (const name of [
      'services.serving.knative.dev',
      'apiserversources.sources.knative.dev',
      'pingsources.sources.knative.dev',
      'brokers.eventing.knative.dev',
      'triggers.eventing.knative.dev',
      'issuers.cert-manager.io',
      'certificates.cert-manager.io',
      'prometheusrules.monitoring.coreos.com',
    ]) {
      assert.ok(
        sources.some((s) => s.startsWith(`${name} ← `)),
        `${name} in ${sources.join(', ')}`,
      );
    }
    assert.ok(sources.some((s) => /knative\.dev\/serving@v0\.49\.\d+\//.test(s)));
    assert.ok(sources.some((s) => /knative\.dev\/eventing@v0\.49\.\d+\//.test(s)));
  });

  for (const dir of KUSTOMIZATIONS) {
    it(`accepts every object of ${dir} (dryRun=All, fieldValidation=Strict)`, async () => {
      const target = await w.namespace();
      const objects = relocate(await render(dir), target);
      assert.ok(objects.length > 20, `${dir} renders ${objects.length} objects`);
      // Renamed nowhere: the one `images` entry a user writes (next test) reaches every container.
      assert.deepEqual(productImages(objects), ['captf-credentials']);
      const failures: string[] = [];
      for (const o of objects) {
        try {
          const out = await dryRunApply(o);
          assert.equal(out.kind, o.kind);
        } catch (err) {
          failures.push(`${o.kind}/${o.metadata?.name}: ${untrustedServerMessage(err)}`);
        }
      }
      assert.deepEqual(failures, []);
      // Dry run: nothing was stored.
      await assert.rejects(
        wire.read({
          apiVersion: 'serving.knative.dev/v1',
          kind: 'Service',
          metadata: { name: 'captf-mirror-sync', namespace: target },
        }),
        (e: unknown) => apiStatus(e) === 404,
      );
    });
  }

  it("every Eventing object of the manifests passes its @kubernetes-models/knative model's validate()", async () => {
    // Knative Services are left to the dry run against Knative's own CRDs and webhook rules: the
    // models' schema takes a probe's httpGet.port from the core PodSpec, where it is required,
    // and Knative fills it in from the container's port (the shipped probes leave it out).
    const models: Record<string, (o: object) => { validate(): void }> = {
      'eventing.knative.dev/v1/Broker': (o) => new Broker(o as IBroker),
      'eventing.knative.dev/v1/Trigger': (o) => new Trigger(o as ITrigger),
      'sources.knative.dev/v1/ApiServerSource': (o) => new ApiServerSource(o as IApiServerSource),
      'sources.knative.dev/v1/PingSource': (o) => new PingSource(o as IPingSource),
      'eventing.knative.dev/v1alpha1/EventPolicy': (o) => new EventPolicy(o as IEventPolicy),
    };
    const seen = new Set<string>();
    for (const shipped of KUSTOMIZATIONS)
      for (const o of await render(shipped)) {
        const model = models[`${o.apiVersion}/${o.kind}`];
        if (!model) continue;
        seen.add(o.kind!);
        assert.doesNotThrow(() => model(o).validate(), `${shipped}: ${o.kind} ${o.metadata?.name}`);
      }
    assert.deepEqual([...seen].sort(), ['ApiServerSource', 'Broker', 'EventPolicy', 'PingSource', 'Trigger']);
  });

  it("one `images` entry in a user's own kustomization over any of them sets every product container", async () => {
    const digest = `sha256:${'0123456789abcdef'.repeat(4)}`;
    const dir = mkdtempSync(join(tmpdir(), 'captf-users-kustomization-'));
    try {
      for (const shipped of KUSTOMIZATIONS) {
        writeFileSync(
          join(dir, 'kustomization.yaml'),
          [
            'apiVersion: kustomize.config.k8s.io/v1beta1',
            'kind: Kustomization',
            'resources:',
            `  - ${JSON.stringify(relative(dir, join(REPO_ROOT, shipped)))}`,
            'images:',
            '  - name: captf-credentials',
            '    newName: registry.test/platform/captf-credentials',
            `    digest: ${digest}`,
            '',
          ].join('\n'),
        );
        const objects = await render(dir);
        const want = `registry.test/platform/captf-credentials@${digest}`;
        assert.deepEqual(productImages(objects), [want], shipped);
        // Each function's workload runs it (admission as a Deployment or a Knative Service).
        const running = objects
          .filter((o) => ['Service', 'Deployment'].includes(o.kind!) && JSON.stringify(o).includes(`"image":"${want}"`))
          .map((o) => o.metadata!.name)
          .sort();
        assert.deepEqual(
          running,
          ['captf-admission', 'captf-dead-letters', 'captf-identity-status', 'captf-mirror-sync'],
          shipped,
        );
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('admission as a Deployment runs as the Knative Service would: same image, settings, account, limits and hardening', async () => {
    type Container = {
      image: string;
      env?: { name: string; value?: string }[];
      resources: unknown;
      securityContext: unknown;
    };
    type PodSpec = { serviceAccountName: string; containers: Container[] };
    const podOf = (objects: KubernetesObject[], kind: string) =>
      (
        objects.find((o) => o.kind === kind && o.metadata?.name === 'captf-admission') as unknown as {
          spec: { template: { spec: PodSpec } };
        }
      ).spec.template.spec;
    const ksvc = podOf(await render(KNATIVE_LAYOUT), 'Service');
    const deployment = podOf(await render(ENTRY_POINT), 'Deployment');
    // Only what differs by design: the Deployment serves its own TLS on 8443.
    const env = (c: Container, drop: string) => (c.env ?? []).filter((e) => e.name !== drop);
    const [k, d] = [ksvc.containers[0]!, deployment.containers[0]!];
    assert.deepEqual(
      env(d, 'PORT'),
      env(k, 'CAPTF_ADMISSION_PLAIN_HTTP'),
      'the same environment (add a setting to both)',
    );
    assert.deepEqual(
      [d.image, d.resources, d.securityContext, deployment.serviceAccountName],
      [k.image, k.resources, k.securityContext, ksvc.serviceAccountName],
    );
  });

  it('the validation is strict: a misspelled or ill-typed field is rejected', async () => {
    const target = await w.namespace();
    const objects = relocate(await render('manifests/overlays/without-crds'), target);
    const ksvc = structuredClone(
      objects.find((o) => o.kind === 'Service' && o.metadata?.name === 'captf-mirror-sync')!,
    ) as KubernetesObject & { spec: { template: { spec: Record<string, unknown> } } };
    ksvc.spec.template.spec.containerConcurency = 5;
    await assert.rejects(dryRunApply(ksvc), (e: unknown) => {
      assert.equal(apiStatus(e), 400, untrustedServerMessage(e));
      assert.match(untrustedServerMessage(e), /unknown field "spec\.template\.spec\.containerConcurency"/);
      return true;
    });
    const trigger = structuredClone(objects.find((o) => o.kind === 'Trigger')!) as KubernetesObject & {
      spec: { delivery: Record<string, unknown> };
    };
    trigger.spec.delivery.retry = 'five';
    await assert.rejects(
      dryRunApply(trigger),
      (e: unknown) => apiStatus(e) === 422 && /retry/.test(untrustedServerMessage(e)),
    );
    const cert = structuredClone(objects.find((o) => o.kind === 'Certificate')!) as KubernetesObject & {
      spec: Record<string, unknown>;
    };
    cert.spec.dnsName = ['typo'];
    // Built-in kinds too: the rendered YAML reaches the API server as it is.
    const role = structuredClone(objects.find((o) => o.kind === 'ClusterRole')!) as KubernetesObject & {
      rules: Record<string, unknown>[];
    };
    role.rules[0]!.verb = ['get'];
    await assert.rejects(
      dryRunApply(role),
      (e: unknown) => apiStatus(e) === 400 && /unknown field "rules\[0\]\.verb"/.test(untrustedServerMessage(e)),
    );
    await assert.rejects(
      dryRunApply(cert),
      (e: unknown) => apiStatus(e) === 400 && /dnsName/.test(untrustedServerMessage(e)),
    );
  });
});

describe("admission's callers (components/admission-client-ca, components/admission-network-policy)", () => {
  it("admission's caller components, as a user composes them (the CA's ConfigMap, the control plane's range), are valid and fit the Deployment", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'captf-admission-callers-'));
    try {
      const rel = (p: string) => JSON.stringify(relative(dir, join(REPO_ROOT, p)));
      writeFileSync(join(dir, 'ca.crt'), 'a CA bundle\n');
      writeFileSync(
        join(dir, 'kustomization.yaml'),
        [
          'apiVersion: kustomize.config.k8s.io/v1beta1',
          'kind: Kustomization',
          'resources:',
          `  - ${rel(ENTRY_POINT)}`,
          'components:',
          `  - ${rel('manifests/components/admission-client-ca')}`,
          `  - ${rel('manifests/components/admission-network-policy')}`,
          'configMapGenerator:',
          '  - name: captf-admission-client-ca',
          '    namespace: captf-system',
          '    files: [ca.crt]',
          'patches:',
          '  - target: { kind: NetworkPolicy, name: captf-admission }',
          '    patch: |-',
          '      - op: replace',
          '        path: /spec/ingress/0/from/0/ipBlock/cidr',
          '        value: 10.20.0.0/24',
          '',
        ].join('\n'),
      );
      const objects = await render(dir);
      type Pod = {
        metadata: { labels: Record<string, string> };
        spec: {
          containers: {
            env: { name: string; value?: string }[];
            ports: { name: string; containerPort: number }[];
            volumeMounts: { name: string; mountPath: string }[];
          }[];
          volumes: { name: string; configMap?: { name: string } }[];
        };
      };
      const deployment = objects.find(
        (o) => o.kind === 'Deployment' && o.metadata?.name === 'captf-admission',
      ) as unknown as {
        spec: { template: Pod };
      };
      const pod = deployment.spec.template;
      const c = pod.spec.containers[0]!;
      const caFile = c.env.find((e) => e.name === 'CAPTF_ADMISSION_CLIENT_CA_FILE')?.value;
      const mount = c.volumeMounts.find((m) => caFile?.startsWith(`${m.mountPath}/`));
      assert.ok(mount, `${caFile} lies in a mounted volume`);
      const configMap = objects.find(
        (o) => o.kind === 'ConfigMap' && o.metadata?.name?.startsWith('captf-admission-client-ca'),
      );
      assert.ok(configMap, 'the generated ConfigMap');
      assert.equal(
        pod.spec.volumes.find((v) => v.name === mount.name)?.configMap?.name,
        configMap.metadata!.name,
        "the volume names the generated ConfigMap (kustomize's hashed name reaches it)",
      );
      const policy = objects.find((o) => o.kind === 'NetworkPolicy') as unknown as {
        spec: {
          podSelector: { matchLabels: Record<string, string> };
          ingress: { from: { ipBlock: { cidr: string } }[]; ports: { port: string | number }[] }[];
        };
      };
      for (const [k, v] of Object.entries(policy.spec.podSelector.matchLabels))
        assert.equal(pod.metadata.labels[k], v, `the policy selects admission's pods (${k})`);
      assert.deepEqual(policy.spec.ingress[0]!.from, [{ ipBlock: { cidr: '10.20.0.0/24' } }]);
      const port = policy.spec.ingress[0]!.ports[0]!.port;
      assert.ok(
        c.ports.some((p) => p.name === port),
        `the policy's port ${port} is a named port of the container`,
      );
      const target = await w.namespace();
      const failures: string[] = [];
      for (const o of relocate(objects, target))
        await dryRunApply(o).catch((err: unknown) =>
          failures.push(`${o.kind}/${o.metadata?.name}: ${untrustedServerMessage(err)}`),
        );
      assert.deepEqual(failures, []);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
