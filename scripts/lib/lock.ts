/**
 * Lock files holding the PID of their holder, for tooling that several processes of one
 * machine share (a test node's folder, a test run's one Serving node). A lock whose holder is
 * gone is taken over.
 */
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';

/**
 * One try at the lock `file` (exclusive create, holding this process's PID).
 * @returns `release` (idempotent) when taken; else `holder`, the PID of the live process that
 *   holds it, or undefined when it is free to try again at once (a stale lock was removed, the
 *   holder released it meanwhile, or it was taken a moment ago and its PID is not written yet).
 */
export function tryLock(file: string): { release: () => void } | { holder: number | undefined } {
  try {
    writeFileSync(file, `${process.pid}\n`, { flag: 'wx' });
    return { release: () => rmSync(file, { force: true }) };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  let text: string;
  try {
    text = readFileSync(file, 'utf8').trim();
  } catch {
    return { holder: undefined };
  }
  if (text === '') return { holder: undefined };
  const pid = Number(text);
  if (Number.isInteger(pid) && pid > 0 && existsSync(`/proc/${pid}`)) return { holder: pid };
  rmSync(file, { force: true });
  return { holder: undefined };
}
