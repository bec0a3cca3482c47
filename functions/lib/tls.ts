/**
 * Serving certificates from files that rotate (cert-manager's `tls.crt`/`tls.key` in a Secret
 * volume): read a PEM pair, and install a new one for new connections when the files change.
 */
import { readFileSync } from 'node:fs';
import type { Server as HttpsServer } from 'node:https';
import type { Logger } from './log.ts';

/** Paths of a PEM certificate and its key. */
export interface TlsFiles {
  certFile: string;
  keyFile: string;
}

/** A PEM certificate and key, as text. */
export interface TlsPair {
  cert: string;
  key: string;
}

/**
 * Reads a PEM certificate and key.
 * @throws Error naming the file that could not be read.
 */
export function readTlsPair(files: TlsFiles): TlsPair {
  const read = (path: string, what: string) => {
    try {
      return readFileSync(path, 'utf8');
    } catch (err) {
      throw new Error(`cannot read the TLS ${what} ${path}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`, {
        cause: err,
      });
    }
  };
  return { cert: read(files.certFile, 'certificate'), key: read(files.keyFile, 'key') };
}

/**
 * Polls the certificate and key files and installs a new pair for new connections when
 * their contents change and form a valid pair (a half-written rotation is skipped and
 * retried on the next tick). Polling, not fs.watch, because Kubernetes Secret volumes
 * replace files through a symlink swap that watchers miss on some platforms.
 * @returns a function that stops polling.
 */
export function watchTlsPair(
  server: HttpsServer,
  files: TlsFiles & { reloadMs: number },
  loaded: TlsPair,
  logger: Logger,
): () => void {
  let current = loaded;
  let lastFailure = '';
  const timer = setInterval(() => {
    let next: TlsPair;
    try {
      next = readTlsPair(files);
    } catch (err) {
      const msg = (err as Error).message;
      if (msg !== lastFailure) logger.warn('TLS pair not reloaded; keeping the current one', { error: msg });
      lastFailure = msg;
      return;
    }
    if (next.cert === current.cert && next.key === current.key) return;
    try {
      // Throws on a mismatched or malformed pair before anything is replaced.
      server.setSecureContext({ cert: next.cert, key: next.key });
      current = next;
      lastFailure = '';
      logger.info('TLS certificate reloaded', { certFile: files.certFile });
    } catch (err) {
      const msg = (err as Error).message.split('\n')[0]!;
      if (msg !== lastFailure) logger.warn('new TLS pair is not usable yet; keeping the current one', { error: msg });
      lastFailure = msg;
    }
  }, files.reloadMs);
  timer.unref();
  return () => clearInterval(timer);
}
