/**
 * The production bundles start the way the image runs them (Dockerfile ENTRYPOINT
 * `node /app/dist/main.mjs` + the Knative Service's `args` and `env` from the rendered
 * manifests), from a folder with no node_modules anywhere above it and no compile cache (the
 * image ships none; `npm run image -- --compile-cache` warms one with the script tested here) —
 * SPEC §13.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { buildBundles } from '../../scripts/lib/bundles.ts';
import { KNATIVE_LAYOUT, render } from '../../scripts/tools/kustomize.ts';
import { FUNCTION_NAMES, startUntilHealthy, warmCompileCache } from '../../scripts/lib/warm-compile-cache.ts';
import { controlPlaneDir } from '../helpers/cluster.ts';

interface Container {
  args?: string[];
  env?: { name: string; value?: string }[];
}

const root = mkdtempSync(join(tmpdir(), 'captf-image-'));
const app = join(root, 'app');
let containers: Map<string, Container>;

before(async () => {
  await buildBundles({ outdir: join(app, 'dist') });
  containers = new Map();
  for (const o of await render(KNATIVE_LAYOUT)) {
    if (o.kind !== 'Service' || o.apiVersion !== 'serving.knative.dev/v1') continue;
    const c = (o as unknown as { spec: { template: { spec: { containers: Container[] } } } }).spec.template.spec
      .containers[0]!;
    containers.set(o.metadata!.name!, c);
  }
});
after(() => rmSync(root, { recursive: true, force: true }));

/** The container's environment as the image (no compile cache) + Knative Service give it (plus a kubeconfig). */
function imageEnv(c: Container, port: number): NodeJS.ProcessEnv {
  return {
    PATH: process.env.PATH,
    NODE_ENV: 'production',
    PORT: String(port),
    // In a cluster the in-cluster config; here the test control plane.
    KUBECONFIG: join(controlPlaneDir(), 'admin.kubeconfig'),
    ...Object.fromEntries((c.env ?? []).map((e) => [e.name, e.value ?? ''])),
  };
}

describe('the production bundles', () => {
  it('are self-contained: dist/ holds main.mjs, captf-runner.mjs and chunks, no node_modules', () => {
    const files = readdirSync(join(app, 'dist'));
    assert.ok(files.includes('main.mjs') && files.includes('captf-runner.mjs'), files.join(' '));
    assert.ok(!files.includes('node_modules'));
  });

  it('warm a compile cache for the --compile-cache image: every function writes its entries', async () => {
    const cache = join(root, 'compile-cache');
    const times = await warmCompileCache(cache, join(app, 'dist'));
    assert.deepEqual(Object.keys(times).sort(), [...FUNCTION_NAMES].sort());
    assert.ok(readdirSync(cache).length > 0, 'the compile cache was written');
  });

  for (const fn of FUNCTION_NAMES) {
    it(`${fn}: starts from its Knative Service's args and env and answers /healthz`, async () => {
      const c = containers.get(`captf-${fn}`);
      assert.ok(c, `manifests have a Knative Service captf-${fn}`);
      assert.deepEqual(c.args, [fn]);
      const ms = await startUntilHealthy(join(app, 'dist', 'main.mjs'), c.args![0]!, imageEnv(c, 0));
      assert.ok(ms > 0);
    });
  }

  it('rejects an unknown function name with exit 2 and the usage', async () => {
    const r = await run([join(app, 'dist', 'main.mjs'), 'nope'], { PATH: process.env.PATH });
    assert.equal(r.code, 2);
    assert.match(r.stderr, /usage: .*admission/);
  });

  it('the runner bundle filters TF_/KUBE_ variables and passes the exit code through', async () => {
    const r = await run(
      [
        join(app, 'dist', 'captf-runner.mjs'),
        '--',
        process.execPath,
        '-e',
        'process.exit(process.env.TF_VAR_token || process.env.KUBE_X ? 1 : (process.env.TF_IN_AUTOMATION === "1" ? 7 : 2))',
      ],
      {
        PATH: process.env.PATH,
        TF_VAR_token: 'sentinel-do-not-print',
        KUBE_X: 'y',
        TF_IN_AUTOMATION: '1',
      },
    );
    assert.equal(r.code, 7, r.stderr);
    assert.match(r.stderr, /TF_VAR_token/);
    assert.doesNotMatch(r.stderr, /sentinel-do-not-print/);
  });
});

function run(args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number | null; stderr: string }> {
  return new Promise((res) => {
    const child = spawn(process.execPath, args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.once('exit', (code) => res({ code, stderr }));
  });
}
