/**
 * Serving certificates from files that rotate (cert-manager's `tls.crt`/`tls.key` in a Secret
 * volume): read a PEM pair (and, where callers must present a certificate, the CA bundle they
 * are checked against), and install new ones for new connections when the files change.
 */
import { constants, createHash, randomBytes, X509Certificate } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { Server as HttpsServer } from 'node:https';
import type { Logger } from './log.ts';

/** Paths of a PEM certificate and its key. */
export interface TlsFiles {
  certFile: string;
  keyFile: string;
  /** PEM bundle of the CAs a client certificate must chain to, when callers must present one. */
  caFile?: string | undefined;
}

/** A PEM certificate and key, as text, and the client CA bundle when there is one. */
export interface TlsPair {
  cert: string;
  key: string;
  ca?: string | undefined;
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
  const pair: TlsPair = { cert: read(files.certFile, 'certificate'), key: read(files.keyFile, 'key') };
  if (files.caFile === undefined) return pair;
  const ca = read(files.caFile, 'client CA bundle');
  checkCaBundle(ca, files.caFile);
  return { ...pair, ca };
}

/**
 * Secure-context options of every HTTPS server here, at creation and on each reload
 * (`setSecureContext` resets what it is not given): no TLS 1.2 renegotiation, because Node
 * keeps a socket `authorized` after a first handshake whatever certificate a renegotiation
 * presents next.
 */
export const SECURE_CONTEXT_OPTIONS = { secureOptions: constants.SSL_OP_NO_RENEGOTIATION } as const;

/**
 * The session options of a context trusting `ca`: sessions (tickets and ids) made under another
 * CA are not resumed, so a caller verified by a CA that was replaced must verify again.
 */
function sessionOptions(ca: string | undefined): { ticketKeys?: Buffer; sessionIdContext?: string } {
  if (ca === undefined) return {};
  const sessionIdContext = createHash('sha256').update(ca).digest('hex').slice(0, 32);
  return { ticketKeys: randomBytes(48), sessionIdContext };
}

/**
 * The options of an HTTPS server for `pair`: its certificate and key, and with a client CA,
 * a certificate asked of every caller (not required: the handshake finishes, so the
 * application can answer why it refused).
 */
export function serverTlsOptions(pair: TlsPair): Record<string, unknown> {
  const clientAuth = pair.ca ? { ca: pair.ca, requestCert: true, rejectUnauthorized: false } : {};
  return { ...SECURE_CONTEXT_OPTIONS, cert: pair.cert, key: pair.key, ...clientAuth, ...sessionOptions(pair.ca) };
}

/** Every PEM certificate in a text. */
const PEM_CERTIFICATES = /-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g;

/**
 * @throws Error when `pem` holds no certificate, one that does not parse, or no CA certificate:
 *   Node would take such a bundle and then trust nothing, refusing every caller with no word on why.
 */
function checkCaBundle(pem: string, path: string): void {
  const blocks = pem.match(PEM_CERTIFICATES) ?? [];
  if (blocks.length === 0) throw new Error(`the client CA bundle ${path} holds no PEM certificate`);
  const parsed = blocks.map((b) => {
    try {
      return new X509Certificate(b);
    } catch {
      throw new Error(`the client CA bundle ${path} holds a certificate that does not parse`);
    }
  });
  if (!parsed.some((c) => c.ca)) throw new Error(`the client CA bundle ${path} holds no CA certificate`);
}

/**
 * Polls the certificate and key files (and the client CA bundle) and installs a new pair for
 * new connections when their contents change and form a valid pair (a half-written rotation is skipped and
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
    if (next.cert === current.cert && next.key === current.key && next.ca === current.ca) return;
    try {
      // Throws on a mismatched or malformed pair before anything is replaced. The whole context
      // again: the client CA (left out, no caller would verify), the options, and for a new CA
      // new session keys.
      const sessions = next.ca === current.ca ? {} : sessionOptions(next.ca);
      server.setSecureContext({
        ...SECURE_CONTEXT_OPTIONS,
        cert: next.cert,
        key: next.key,
        ...(next.ca ? { ca: next.ca } : {}),
        ...sessions,
      });
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
