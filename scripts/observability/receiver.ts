/**
 * The one way the test world starts a telemetry receiver (Prometheus, Jaeger): a program from
 * tool set `observability` on loopback, its output in a log file under its folder, ready once a
 * URL answers 2xx, stopped by PID.
 */
import { spawn } from 'node:child_process';
import { openSync } from 'node:fs';
import { join } from 'node:path';
import { stopProcess } from '../lib/process.ts';
import { eventually, firstLine } from '../lib/wait.ts';

/** How long a receiver may take to answer its readiness URL, in ms. */
const READY_TIMEOUT_MS = 60_000;

/**
 * Spawns `bin args` logging to `<dir>/<name>.log` and waits until `ready` answers 2xx.
 * @returns its stop (idempotent).
 * @throws Error naming its log when it exits or is not ready in time (it is stopped first).
 */
export async function startReceiver(o: {
  name: string;
  bin: string;
  args: readonly string[];
  dir: string;
  ready: string;
}): Promise<() => Promise<void>> {
  const logPath = join(o.dir, `${o.name}.log`);
  const log = openSync(logPath, 'a');
  const child = spawn(o.bin, o.args, { stdio: ['ignore', log, log] });
  const stop = () => stopProcess(child);
  await eventually(
    `${o.name} to be ready (its log: ${logPath})`,
    async () => {
      if (child.exitCode !== null) throw new Error(`${o.name} exited (${child.exitCode}); its log: ${logPath}`);
      const r = await fetch(o.ready).catch((e: unknown) => {
        throw new Error(firstLine(e));
      });
      return r.ok;
    },
    READY_TIMEOUT_MS,
    250,
  ).catch(async (err: unknown) => {
    await stop();
    throw err;
  });
  return stop;
}
