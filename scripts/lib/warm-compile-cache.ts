/**
 * Fills a V8 compile cache (`NODE_COMPILE_CACHE`) for the bundles in `dist/` by starting each
 * function once until it answers `/healthz`, then stopping it with SIGTERM (Node writes the
 * cache on exit), and running the runner once. Used by the Dockerfile at build time: a
 * function started later with the same `NODE_COMPILE_CACHE`, Node binary and bundle skips
 * compiling most of its code (measured: docs/deploy-knative.md).
 *
 * `node scripts/lib/warm-compile-cache.ts <cache dir> [dist dir]` — Node built-ins only, so it
 * runs in the image's build stage. No API server is contacted: a placeholder kubeconfig
 * is enough for the functions to start.
 * @throws (exit 1) when a function does not answer `/healthz` within 30 s.
 */
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { freePort } from './ports.ts';

/** The functions `dist/main.mjs` serves (functions/main.ts), in the order a system starts them. */
export const FUNCTION_NAMES = ['admission', 'mirror-sync', 'identity-status', 'dead-letters'] as const;

/** A kubeconfig naming a server that is never asked: a function starts with it and answers /healthz. */
export const PLACEHOLDER_KUBECONFIG = `apiVersion: v1
kind: Config
clusters: [{name: warm, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: warm, user: {token: warm}}]
contexts: [{name: warm, context: {cluster: warm, user: warm}}]
current-context: warm
`;

/**
 * Starts `node <main> <fn>` with `env` until `/healthz` answers 200, then SIGTERMs it.
 * @returns milliseconds from spawn to the first 200.
 * @throws Error with the process's stderr when it exits first or 30 s pass.
 */
export async function startUntilHealthy(main: string, fn: string, env: NodeJS.ProcessEnv): Promise<number> {
  const port = await freePort();
  const t0 = performance.now();
  const child = spawn(process.execPath, [main, fn], {
    env: { ...env, PORT: String(port) },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  try {
    for (;;) {
      if (child.exitCode !== null)
        throw new Error(`${fn} exited ${child.exitCode} before /healthz answered: ${stderr.slice(-500)}`);
      if (performance.now() - t0 > 30_000)
        throw new Error(`${fn}: /healthz did not answer in 30 s: ${stderr.slice(-500)}`);
      try {
        const r = await fetch(`http://127.0.0.1:${port}/healthz`);
        if (r.status === 200) return performance.now() - t0;
      } catch {
        // not listening yet
      }
      await new Promise((r) => setTimeout(r, 10));
    }
  } finally {
    child.kill('SIGTERM');
    await exited;
  }
}

/**
 * The sender check of the event functions as shipped (SPEC §12), with placeholder values: a
 * function started only to be timed or warmed checks its senders as in a pod, and gets no event.
 */
export const SENDER_CHECK_PLACEHOLDERS: Readonly<Record<string, string>> = {
  CAPTF_EVENT_AUTH: 'oidc',
  CAPTF_EVENT_AUDIENCE: 'captf-startup',
  CAPTF_EVENT_SENDERS: 'system:serviceaccount:captf-system:captf-startup',
};

/**
 * Warms `cacheDir` for every function and the runner of `distDir`.
 * @returns start-up milliseconds per function of the warming run (cold cache).
 */
export async function warmCompileCache(cacheDir: string, distDir: string): Promise<Record<string, number>> {
  mkdirSync(cacheDir, { recursive: true });
  const tmp = mkdtempSync(join(tmpdir(), 'captf-warm-'));
  const kubeconfig = join(tmp, 'kubeconfig');
  writeFileSync(kubeconfig, PLACEHOLDER_KUBECONFIG);
  // Only what the functions need to start: no inherited KUBECONFIG or cluster variables.
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    NODE_COMPILE_CACHE: cacheDir,
    KUBECONFIG: kubeconfig,
    CAPTF_ADMISSION_PLAIN_HTTP: 'true',
    ...SENDER_CHECK_PLACEHOLDERS,
    LOG_LEVEL: 'error',
  };
  const times: Record<string, number> = {};
  try {
    for (const fn of FUNCTION_NAMES)
      times[fn] = Math.round(await startUntilHealthy(join(distDir, 'main.mjs'), fn, env));
    await new Promise<void>((res, rej) => {
      const child = spawn(process.execPath, [join(distDir, 'captf-runner.mjs'), '--', process.execPath, '-e', '0'], {
        env,
        stdio: 'ignore',
      });
      child.once('exit', (code) => (code === 0 ? res() : rej(new Error(`captf-runner exited ${code}`))));
    });
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  return times;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const [cacheDir, distDir = 'dist'] = process.argv.slice(2);
  if (!cacheDir) {
    process.stderr.write('usage: node scripts/lib/warm-compile-cache.ts <cache dir> [dist dir]\n');
    process.exit(2);
  }
  try {
    const times = await warmCompileCache(resolve(cacheDir), resolve(distDir));
    console.log(`compile cache warmed in ${resolve(cacheDir)}: ${JSON.stringify(times)} ms to /healthz`);
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n`);
    process.exit(1);
  }
}
