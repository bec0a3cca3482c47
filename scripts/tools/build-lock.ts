/**
 * A cross-process lock around a Go tool build: `npm test` runs test files in parallel
 * processes, and two of them finding the same tool missing must not build it twice at once
 * (buildGoTools replaces the whole bin folder when it finishes, which would pull a binary
 * from under the other process).
 */
import { existsSync, mkdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { REPO_ROOT, buildGoTools, cacheDir, type GoTool } from './build.ts';

/** A lock older than this is taken to be left by a killed process (ms). */
const STALE_MS = 30 * 60_000;

/**
 * Runs `fn` while holding the lock folder `.cache/<name>.lock` (mkdir is atomic), waiting
 * for another holder to finish first.
 * @returns what `fn` returns. @throws what `fn` throws (the lock is released either way).
 */
export async function withBuildLock<T>(name: string, fn: () => Promise<T>): Promise<T> {
  const lock = join(REPO_ROOT, '.cache', `${name}.lock`);
  mkdirSync(join(REPO_ROOT, '.cache'), { recursive: true });
  for (;;) {
    try {
      mkdirSync(lock);
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      try {
        if (Date.now() - statSync(lock).mtimeMs > STALE_MS) rmSync(lock, { recursive: true, force: true });
      } catch {
        // released meanwhile
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  }
  try {
    return await fn();
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}

/**
 * Path of one binary of a set of Go tools when it is built already; nothing is built.
 * @returns the absolute path, or undefined when the pinned versions are not built.
 */
export function builtGoBinary(tools: readonly GoTool[], cacheName: string, binary: string): string | undefined {
  const bin = join(cacheDir(tools, cacheName), 'bin', binary);
  return existsSync(bin) ? bin : undefined;
}

/**
 * Finds or builds one binary of a set of Go tools (scripts/tools/go/<module>):
 * returns `.cache/<cacheName>/<versions>-<digest>/bin/<binary>`, building the set under
 * {@link withBuildLock} first when it is missing.
 * @param log progress lines of the build (default stderr).
 * @returns the absolute path of the binary.
 * @throws Error with the tail of the `go` output when the download or build fails.
 */
export async function ensureGoBinary(
  tools: readonly GoTool[],
  cacheName: string,
  binary: string,
  log?: (line: string) => void,
): Promise<string> {
  const built = builtGoBinary(tools, cacheName, binary);
  if (built) return built;
  const dir = cacheDir(tools, cacheName);
  await withBuildLock(cacheName, () => buildGoTools(tools, dir, log));
  return join(dir, 'bin', binary);
}
