/**
 * The README's "Install on a cluster", run as written, against the cluster it asks for: the
 * Serving node of `npm run controlplane -- --serving` (`startSystem({ serving, events: 'knative',
 * product: false, registry })`): Knative Serving, Knative Eventing's own installation (its
 * upstream controllers, webhook and data plane as pods from images of the pinned module,
 * scripts/eventing/install.ts), cert-manager's stand-in, a registry, and nothing of the product.
 * Then what a platform team checks first: the nodes pulled the image from the registry by the
 * digest the build printed; Eventing's controllers made the Broker, Triggers, PingSources and
 * ApiServerSource Ready, no stand-in writing a field; an allowed user's identity is admitted and
 * a refused user's refused in the webhook's words; a consumer is mirrored through Knative's
 * ApiServerSource adapter pod, the Broker and a Trigger; the Terraform Job built with the
 * delivery fragment runs with the credentials. One node for the file; needs root.
 *
 * Three things differ from a user's shell: `npm ci` is left out (the suite's own install: a
 * second one would replace node_modules under the other test files); the lines after the
 * image build run in a copy of the checkout's `manifests/` (`kustomize edit` writes into it)
 * beside a link to its `.cache/`; and skopeo gets `--dest-tls-verify=false`, the registry
 * being plain HTTP.
 */
import assert from 'node:assert/strict';
import { cpSync, mkdirSync, readFileSync, symlinkSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, it } from 'node:test';
import { AppsV1Api, CoreV1Api, CustomObjectsApi } from '@kubernetes/client-node';
import { SYSTEM_NAMESPACE } from '../../scripts/eventing/dataplane.ts';
import { EVENTING_DEPLOYMENTS } from '../../scripts/eventing/install.ts';
import { runCommand } from '../../scripts/lib/command.ts';
import { ensureTool, REPO_ROOT } from '../../scripts/tools/build.ts';
import { ensureKustomize, render } from '../../scripts/tools/kustomize.ts';
import { identityThroughWebhook } from '../helpers/admission.ts';
import { eventually } from '../helpers/cluster.ts';
import { SENTINEL_KEY } from '../helpers/leaks.ts';
import { assertNoSecret } from '../helpers/logs.ts';
import { assertTerraformSaw, nodeWorld, runTerraformJob, terraformConsumer, TERRAFORM_KEYS } from '../helpers/node.ts';

const { system, w, work, mirrorOwnedBy } = await nodeWorld('install', {
  serving: true,
  events: 'knative',
  product: false,
  registry: true,
});
const registry = system.registry!;

const NAMESPACE = 'captf-system';
const core = system.kc.makeApiClient(CoreV1Api);
const custom = system.kc.makeApiClient(CustomObjectsApi);

type Conditioned = {
  metadata: { name: string; managedFields?: { manager?: string; subresource?: string }[] };
  status?: {
    conditions?: { type: string; status: string; reason?: string; message?: string }[];
    address?: { url?: string };
  };
};

/** The first `sh` block of the README's section `heading`, a line per command. */
function readmeBlock(heading: string): string[] {
  const readme = readFileSync(join(REPO_ROOT, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf(`\n## ${heading}\n`));
  const block = /```sh\n([\s\S]*?)```/.exec(section);
  assert.ok(block, `README's "${heading}" has a sh block`);
  return block[1]!.split('\n').filter((l) => l.trim());
}

/**
 * Runs `script` with bash in `cwd`, stopping at the first failing line; its stdout. Ended after
 * 15 minutes: it runs before any test, where no test timeout applies.
 */
const bash = (script: string, cwd: string, env: NodeJS.ProcessEnv): Promise<string> =>
  runCommand('bash', ['-c', `set -euo pipefail\n${script}`], { cwd, env, timeoutMs: 15 * 60_000 });

/**
 * The README's block in a user's shell: the pinned kubectl and a standalone kustomize on PATH
 * and the cluster's kubeconfig (`npm run controlplane -- --serving` prints it).
 * @returns the digest the build printed, and what the lines after it printed.
 */
async function installAsTheReadmeSays(): Promise<{ digest: string; installed: string; checkout: string }> {
  const [kubectl, kustomize] = await Promise.all([ensureTool('kubectl'), ensureKustomize()]);
  const shell: NodeJS.ProcessEnv = {
    ...process.env,
    PATH: [dirname(kubectl), dirname(kustomize), process.env.PATH].join(':'),
    KUBECONFIG: system.kubeconfigPath,
  };
  const checkout = join(work, 'checkout');
  mkdirSync(checkout);
  cpSync(join(REPO_ROOT, 'manifests'), join(checkout, 'manifests'), { recursive: true });
  symlinkSync(join(REPO_ROOT, '.cache'), join(checkout, '.cache'));
  const [build, ...steps] = readmeBlock('Install on a cluster');
  assert.match(build!, /^npm ci && npm run -s image -- captf-credentials\b/);
  const [tar, digest] = (await bash(build!.replace(/^npm ci && /, ''), REPO_ROOT, shell)).trim().split(/\s+/);
  assert.match(digest!, /^sha256:[0-9a-f]{64}$/, `npm run image printed "${tar} ${digest}"`);
  // The registry speaks plain HTTP, which Debian's skopeo takes only with this flag (docs/deploy-knative.md).
  const filled = steps.map((l) =>
    l
      .replace(/^skopeo copy /, 'skopeo copy --dest-tls-verify=false ')
      .replaceAll('<registry>', registry.host)
      .replaceAll('<digest>', digest!),
  );
  return { digest: digest!, installed: await bash(filled.join('\n'), checkout, shell), checkout };
}

// Before any test, where no test timeout applies: a failure stops the node at once.
const { digest, installed, checkout } = await installAsTheReadmeSays().catch(async (err: unknown) => {
  await system.stop();
  throw err;
});
const applied = await render(join(checkout, 'manifests'));

/** Every object of one eventing kind in the manifests' namespace. */
const list = async (group: string, plural: string): Promise<Conditioned[]> =>
  (
    (await custom.listNamespacedCustomObject({ group, version: 'v1', namespace: NAMESPACE, plural })) as {
      items: Conditioned[];
    }
  ).items;

const ready = (o: Conditioned) => o.status?.conditions?.find((c) => c.type === 'Ready');

describe("the README's install steps on a cluster with Knative Serving, Eventing and cert-manager", () => {
  it('apply the image by the digest the build printed, and the node pulled it from the registry', async () => {
    const running = applied.filter((o) => JSON.stringify(o).includes('captf-credentials@'));
    const kinds = new Set(running.map((o) => o.kind));
    assert.ok(
      kinds.has('Deployment') && kinds.has('Service'),
      `admission and the Knative Services: ${[...kinds].join(' ')}`,
    );
    const images = running.flatMap((o) => JSON.stringify(o).match(/"image":"[^"]*captf-credentials[^"]*"/g) ?? []);
    for (const i of images) assert.equal(i, `"image":"${registry.host}/captf-credentials@${digest}"`);
    const log = readFileSync(registry.log, 'utf8');
    assert.ok(
      log.includes(`/v2/captf-credentials/manifests/${digest}`),
      `the registry served the image by digest:\n${log}`,
    );
    assert.match(installed, /deployment "captf-admission" successfully rolled out/);
    // The entry point is in kustomize's own layout: the user's edit adds the image and nothing else.
    const shipped = readFileSync(join(REPO_ROOT, 'manifests', 'kustomization.yaml'), 'utf8');
    const edited = readFileSync(join(checkout, 'manifests', 'kustomization.yaml'), 'utf8');
    assert.ok(edited.startsWith(shipped), `kustomize edit changed only the end:\n${edited}`);
    assert.match(edited.slice(shipped.length), /^images:\n- digest: sha256:[0-9a-f]{64}\n/);
  });

  it("runs Eventing's controllers, webhook and data plane as pods, Available", async () => {
    const apps = system.kc.makeApiClient(AppsV1Api);
    for (const name of EVENTING_DEPLOYMENTS) {
      // The PingSource adapter is scaled from 0 to 1 by the PingSource reconciler once a PingSource exists.
      const d = await eventually(
        `${name} Available`,
        async () => {
          const got = await apps.readNamespacedDeployment({ namespace: SYSTEM_NAMESPACE, name });
          return got.status?.conditions?.some((c) => c.type === 'Available' && c.status === 'True') && got;
        },
        120_000,
        1000,
      );
      assert.match(d.spec!.template.spec!.containers[0]!.image!, /^ko\.local\/knative-/);
    }
  });

  it("reconciles the manifests' Broker, Triggers, PingSources and ApiServerSource to Ready, with Knative's own status writers", async () => {
    const kinds = [
      ['eventing.knative.dev', 'brokers', 'Broker'],
      ['eventing.knative.dev', 'triggers', 'Trigger'],
      ['sources.knative.dev', 'pingsources', 'PingSource'],
      ['sources.knative.dev', 'apiserversources', 'ApiServerSource'],
    ] as const;
    for (const [group, plural, kind] of kinds) {
      const wanted = applied.filter((o) => o.kind === kind).map((o) => o.metadata!.name!);
      assert.ok(wanted.length > 0, `the manifests hold a ${kind}`);
      const items = await eventually(
        `every ${kind} of the manifests Ready`,
        async () => {
          const all = await list(group, plural);
          const mine = all.filter((o) => wanted.includes(o.metadata.name));
          return mine.length === wanted.length && mine.every((o) => ready(o)?.status === 'True') && mine;
        },
        240_000,
        1000,
      ).catch(async (err: unknown) => {
        const now = (await list(group, plural)).map((o) => `${o.metadata.name}: ${JSON.stringify(ready(o))}`);
        throw new Error(`${(err as Error).message}\n${now.join('\n')}`);
      });
      for (const o of items) {
        const writers = (o.metadata.managedFields ?? [])
          .filter((f) => f.subresource === 'status')
          .map((f) => f.manager);
        assert.ok(writers.length > 0, `${kind} ${o.metadata.name}'s status was written`);
        assert.ok(
          writers.every((m) => !m?.startsWith('captf')),
          `${kind} ${o.metadata.name}'s status is Knative's own, not a stand-in's: ${writers.join(', ')}`,
        );
      }
    }
    const [broker] = await list('eventing.knative.dev', 'brokers');
    assert.equal(
      broker!.status?.address?.url,
      `http://broker-ingress.${SYSTEM_NAMESPACE}.svc.cluster.local/${NAMESPACE}/${broker!.metadata.name}`,
    );
  });

  it("admission's webhook: an allowed user's identity admitted, a refused user's refused in its words", async () => {
    const walk = await identityThroughWebhook(w);
    assertNoSecret(walk.messages.join('\n'), [walk.planted], 'what the users were told');
  });

  it("a new consumer is mirrored through Knative's ApiServerSource adapter pod, the Broker and a Trigger; the Terraform Job runs with it", async () => {
    const { ns, id, consumer } = await terraformConsumer(w, 'c');
    const mirror = await mirrorOwnedBy(ns, id, consumer, 180_000);
    assert.equal(Buffer.from(mirror.data!.AWS_ACCESS_KEY_ID!, 'base64').toString(), TERRAFORM_KEYS.AWS_ACCESS_KEY_ID);
    const adapters = await core.listNamespacedPod({
      namespace: NAMESPACE,
      // The labels Knative's ApiServerSource reconciler puts on its adapter (resources/labels.go).
      labelSelector: `eventing.knative.dev/sourceName=${applied.find((o) => o.kind === 'ApiServerSource')!.metadata!.name}`,
    });
    assert.ok(
      adapters.items.some((p) => p.status?.phase === 'Running'),
      "the ApiServerSource's adapter runs as Knative's controller made it, in a pod",
    );
    const image = `${registry.host}/captf-credentials@${digest}`;
    const ran = await runTerraformJob(w, work, { namespace: ns, identity: id, image, pull: 'IfNotPresent' });
    assertTerraformSaw(ran, [...Object.keys(TERRAFORM_KEYS), SENTINEL_KEY]);
  });
});
