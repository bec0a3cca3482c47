/**
 * `npm run measure:startup [-- --runs N]`: how long each function takes from `spawn` to its
 * first `/healthz` 200, for the variants docs/deploy-knative.md compares — TypeScript sources, one
 * self-contained bundle, the split bundle (shipped), and both bundles with a V8 compile
 * cache warmed beforehand (`NODE_COMPILE_CACHE`). Variants are interleaved run by run so
 * load from other processes spreads evenly; prints median and minimum in ms. No API server
 * is contacted (placeholder kubeconfig).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { buildBundles } from './lib/bundles.ts';
import { REPO_ROOT } from './tools/build.ts';
import { FUNCTION_NAMES, SENDER_CHECK_PLACEHOLDERS, startUntilHealthy } from './lib/warm-compile-cache.ts';

const { values } = parseArgs({ options: { runs: { type: 'string', default: '11' } } });
const runs = Number(values.runs);
const root = mkdtempSync(join(tmpdir(), 'captf-startup-'));
try {
  const split = await buildBundles({ outdir: join(root, 'split') });
  const single = await buildBundles({ outdir: join(root, 'single'), splitting: false });
  const kubeconfig = join(root, 'kubeconfig');
  writeFileSync(
    kubeconfig,
    'apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n',
  );
  const env = {
    PATH: process.env.PATH,
    KUBECONFIG: kubeconfig,
    CAPTF_ADMISSION_PLAIN_HTTP: 'true',
    ...SENDER_CHECK_PLACEHOLDERS,
    LOG_LEVEL: 'error',
  };
  const variants: [string, string, NodeJS.ProcessEnv][] = [
    ['TypeScript sources', join(REPO_ROOT, 'functions', 'main.ts'), env],
    ['one bundle', single.main, env],
    ['split bundle', split.main, env],
    ['one bundle + compile cache', single.main, { ...env, NODE_COMPILE_CACHE: join(root, 'cache-single') }],
    ['split bundle + compile cache', split.main, { ...env, NODE_COMPILE_CACHE: join(root, 'cache-split') }],
  ];
  const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)]!;
  for (const fn of FUNCTION_NAMES) {
    // Warm the caches (and the OS file cache) once.
    for (const [, main, e] of variants) await startUntilHealthy(main, fn, e);
    const times = new Map<string, number[]>();
    for (let i = 0; i < runs; i++) {
      for (const [label, main, e] of variants)
        times.set(label, [...(times.get(label) ?? []), await startUntilHealthy(main, fn, e)]);
    }
    for (const [label, xs] of times)
      console.log(
        `${fn.padEnd(16)} ${label.padEnd(30)} median ${Math.round(median(xs))} ms  min ${Math.round(Math.min(...xs))} ms`,
      );
  }
} finally {
  rmSync(root, { recursive: true, force: true });
}
