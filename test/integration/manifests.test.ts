/**
 * Every object every kustomization renders is accepted by the real API server with the real
 * Knative Serving/Eventing and cert-manager CRDs installed (server-side apply, dryRun=All,
 * fieldValidation=Strict) — SPEC §13, issue 8 item 3.
 */
import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';
import {
  KubernetesObjectApi,
  PatchStrategy,
  ServerConfiguration,
  createConfiguration,
  type KubeConfig,
  type KubernetesObject,
} from '@kubernetes/client-node';
import { FIELD_MANAGER } from '../../functions/lib/api.ts';
import { apiStatus, describeError } from '../../functions/lib/kube.ts';
import { installThirdPartyCRDs, loadThirdPartyCRDs } from '../../scripts/knative.ts';
import { KUSTOMIZATIONS, relocate, render } from '../../scripts/kustomize.ts';
import { admin, namespaces } from '../helpers/cluster.ts';

const a = admin();
const ns = namespaces('manifests');

/** A generic object client whose every request carries `fieldValidation=Strict`. */
function strictObjects(kc: KubeConfig): KubernetesObjectApi {
  const cluster = kc.getCurrentCluster()!;
  const config = createConfiguration({
    baseServer: new ServerConfiguration(cluster.server, {}),
    authMethods: { default: kc },
    promiseMiddleware: [
      {
        pre: async (ctx) => {
          ctx.setQueryParam('fieldValidation', 'Strict');
          return ctx;
        },
        post: async (ctx) => ctx,
      },
    ],
  });
  return new KubernetesObjectApi(config);
}

const strict = strictObjects(a.kc);
/**
 * A dry-run create (validates against the schema, strict, and runs admission; stores
 * nothing). An object that already exists (e.g. a namespace another test made) is
 * dry-run applied instead, server-side apply being as strict about undeclared fields.
 */
const dryRunApply = async (o: KubernetesObject) => {
  try {
    return await strict.create(o, undefined, 'All', FIELD_MANAGER);
  } catch (err) {
    if (apiStatus(err) !== 409) throw err;
    return strict.patch(o, undefined, 'All', FIELD_MANAGER, true, PatchStrategy.ServerSideApply);
  }
};

before(async () => {
  await installThirdPartyCRDs(a.kc);
});

describe('the rendered manifests against the real CRD schemas', () => {
  it('fetches the pinned Knative Serving, Eventing and cert-manager CRDs from their Go modules', async () => {
    const sources = (await loadThirdPartyCRDs()).map((c) => `${c.crd.metadata!.name} ← ${c.source}`);
    for (const name of ['services.serving.knative.dev', 'apiserversources.sources.knative.dev', 'pingsources.sources.knative.dev',
      'brokers.eventing.knative.dev', 'triggers.eventing.knative.dev', 'issuers.cert-manager.io', 'certificates.cert-manager.io']) {
      assert.ok(sources.some((s) => s.startsWith(`${name} ← `)), `${name} in ${sources.join(', ')}`);
    }
    assert.ok(sources.some((s) => /knative\.dev\/serving@v0\.49\.\d+\//.test(s)));
    assert.ok(sources.some((s) => /knative\.dev\/eventing@v0\.49\.\d+\//.test(s)));
  });

  for (const dir of KUSTOMIZATIONS) {
    it(`accepts every object of ${dir} (dryRun=All, fieldValidation=Strict)`, async () => {
      const target = await ns.create();
      const objects = relocate(await render(dir), target);
      assert.ok(objects.length > 20, `${dir} renders ${objects.length} objects`);
      const failures: string[] = [];
      for (const o of objects) {
        try {
          const out = await dryRunApply(o);
          assert.equal(out.kind, o.kind);
        } catch (err) {
          failures.push(`${o.kind}/${o.metadata?.name}: ${describeError(err)}`);
        }
      }
      assert.deepEqual(failures, []);
      // Dry run: nothing was stored.
      await assert.rejects(strict.read({ apiVersion: 'serving.knative.dev/v1', kind: 'Service', metadata: { name: 'captf-mirror-sync', namespace: target } }), (e: unknown) => apiStatus(e) === 404);
    });
  }

  it('the validation is strict: a misspelled or ill-typed field is rejected', async () => {
    const target = await ns.create();
    const objects = relocate(await render('manifests/overlays/without-crds'), target);
    const ksvc = structuredClone(objects.find((o) => o.kind === 'Service' && o.metadata?.name === 'captf-mirror-sync')!) as KubernetesObject & { spec: { template: { spec: Record<string, unknown> } } };
    ksvc.spec.template.spec.containerConcurency = 5;
    await assert.rejects(dryRunApply(ksvc), (e: unknown) => {
      assert.equal(apiStatus(e), 400, describeError(e));
      assert.match(describeError(e), /unknown field "spec\.template\.spec\.containerConcurency"/);
      return true;
    });
    const trigger = structuredClone(objects.find((o) => o.kind === 'Trigger')!) as KubernetesObject & { spec: { delivery: Record<string, unknown> } };
    trigger.spec.delivery.retry = 'five';
    await assert.rejects(dryRunApply(trigger), (e: unknown) => apiStatus(e) === 422 && /retry/.test(describeError(e)));
    const cert = structuredClone(objects.find((o) => o.kind === 'Certificate')!) as KubernetesObject & { spec: Record<string, unknown> };
    cert.spec.dnsName = ['typo'];
    await assert.rejects(dryRunApply(cert), (e: unknown) => apiStatus(e) === 400 && /dnsName/.test(describeError(e)));
  });
});
