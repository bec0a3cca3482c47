/**
 * The one way the test world starts a telemetry receiver (Prometheus, Jaeger): a program from
 * tool set `observability`, on this machine's loopback or inside a test node (where the node's
 * pods reach it), its output in a log file under its folder, ready once a URL answers 2xx,
 * stopped by PID.
 */
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { openSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from '../lib/ports.ts';
import { stopProcess } from '../lib/process.ts';
import { eventually, firstLine } from '../lib/wait.ts';
import type { TestNode } from '../node/node.ts';

/** Where a receiver runs, and how its senders and this machine reach it. */
export interface ReceiverPlace {
  /** Starts the program there. */
  spawn(cmd: string, args: readonly string[], opts: SpawnOptions): ChildProcess;
  /** A port to listen on there, which this machine reaches as `127.0.0.1:<port>`. */
  port(): Promise<number>;
  /** The address it binds. */
  bind: string;
  /** The host its senders push to. */
  senders: string;
}

/** On this machine's loopback: the senders are local processes. */
export const ON_THIS_MACHINE: ReceiverPlace = {
  spawn: (cmd, args, opts) => spawn(cmd, args, opts),
  port: freePort,
  bind: '127.0.0.1',
  senders: '127.0.0.1',
};

/**
 * Inside `node`'s network namespace, on every address: its pods push to the node's address, and
 * this machine reaches each port through a forward of the same number.
 */
export const inNode = (node: TestNode): ReceiverPlace => ({
  spawn: (cmd, args, opts) => node.namespace.spawn(cmd, args, opts),
  port: () => node.namespace.forwardSamePort('127.0.0.1'),
  bind: '0.0.0.0',
  senders: node.namespace.address,
});

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
  place: ReceiverPlace;
}): Promise<() => Promise<void>> {
  const logPath = join(o.dir, `${o.name}.log`);
  const log = openSync(logPath, 'a');
  const child = o.place.spawn(o.bin, o.args, { stdio: ['ignore', log, log] });
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
