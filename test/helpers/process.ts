/**
 * Runs a function as the container does — `node functions/main.ts <name>` — through the
 * scripts' one spawn-and-wait helper (scripts/lib/process.ts), and exposes its combined output,
 * the port it reported in its `listening` log line, and its exit; or all three functions in
 * the test's own process.
 */
import type { KubeConfig } from '@kubernetes/client-node';
import { start as startAdmission } from '../../functions/admission/index.ts';
import { start as startIdentityStatus } from '../../functions/identity-status/index.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { start as startMirrorSync } from '../../functions/mirror-sync/index.ts';
import { spawnFunction as spawnListening, type FunctionProcess as Spawned } from '../../scripts/lib/process.ts';
import { scanLater } from './leaks.ts';
import { captureLogger } from './logs.ts';
import { UNSIGNED_EVENTS } from './events.ts';

/** A function running as a child process. */
export interface FunctionProcess extends Spawned {
  /** Everything printed so far (stdout + stderr). */
  output(): string;
  /** Its JSON log lines so far, parsed (other output left out). */
  entries(): Record<string, unknown>[];
}

/**
 * Spawns `node functions/main.ts <name>` with `env` added to this process's environment
 * (PORT defaults to 0, events unsigned: {@link UNSIGNED_EVENTS}) and waits for its `listening` line.
 * @throws Error with its last output lines when it exits or does not listen within 30 s.
 */
export async function spawnFunction(name: string, env: NodeJS.ProcessEnv): Promise<FunctionProcess> {
  let out = '';
  const fn = await spawnListening({
    name,
    env: { ...process.env, PORT: '0', ...UNSIGNED_EVENTS, ...env },
    onData: (d) => (out += d.toString()),
  });
  scanLater(`${name} output`, () => out);
  const entries = () =>
    out.split('\n').flatMap((l) => {
      try {
        return [JSON.parse(l) as Record<string, unknown>];
      } catch {
        return [];
      }
    });
  return { ...fn, output: () => out, entries };
}

/** The three functions started in this process for a test (admission over plain HTTP). */
export interface InProcessFunctions {
  admission: FunctionHandle;
  mirrorSync: FunctionHandle;
  identityStatus: FunctionHandle;
}

/**
 * Starts admission (plain HTTP), mirror-sync and identity-status in this process on free
 * loopback ports with `kc`, events unsigned, each logging into a captured logger; the caller closes them.
 */
export async function startInProcess(kc: KubeConfig): Promise<InProcessFunctions> {
  const base = { port: 0, host: '127.0.0.1', kubeconfig: kc };
  const [admission, mirrorSync, identityStatus] = await Promise.all([
    startAdmission({
      ...base,
      logger: captureLogger('admission').logger,
      env: { CAPTF_ADMISSION_PLAIN_HTTP: 'true' },
    }),
    startMirrorSync({ ...base, logger: captureLogger('mirror-sync').logger, env: UNSIGNED_EVENTS }),
    startIdentityStatus({ ...base, logger: captureLogger('identity-status').logger, env: UNSIGNED_EVENTS }),
  ]);
  return { admission, mirrorSync, identityStatus };
}
