/**
 * Who may ask admission for a review (SPEC §10, §12): with `CAPTF_ADMISSION_CLIENT_CA_FILE` set,
 * only a caller that presents a client certificate chained to that CA (and, with
 * `CAPTF_ADMISSION_CLIENT_NAMES`, whose subject CN is one of those names): the API server, as
 * its AdmissionConfiguration's kubeconfig presents one to webhooks. Without it, a pod that reaches
 * the webhook could post a forged AdmissionReview and learn from the answer whether any user may
 * read any Secret. The TLS layer verifies the chain (the server asks for a certificate but lets
 * the handshake finish, so the refusal is an answer that says why); {@link decideCaller} is the
 * decision, {@link callerCheck} the middleware around it.
 */
import type { RequestHandler } from 'express';
import type { TLSSocket } from 'node:tls';
import type { Logger } from '../lib/log.ts';

/** What the TLS layer knows of a caller. */
export interface Peer {
  /** Whether the presented chain verified against the configured CA. */
  authorized: boolean;
  /** OpenSSL's reason when it did not (e.g. `UNABLE_TO_VERIFY_LEAF_SIGNATURE`); untrusted text. */
  authorizationError?: string | undefined;
  /** Whether any certificate was presented. */
  presented: boolean;
  /** The presented certificate's subject CN (several when the subject repeats it). */
  commonNames: readonly string[];
}

/** Why a caller was refused (the log's `reason`; never sent to the caller). */
export type CallerRefusal = 'no client certificate' | 'not signed by the client CA' | 'subject not allowed';

/**
 * Whether `peer` may ask for a review.
 * @param names allowed subject CNs (the certificate must carry exactly one CN, one of them);
 *   empty: any certificate the CA signed.
 * @returns `undefined` when it may, else why not.
 */
export function decideCaller(peer: Peer, names: readonly string[]): CallerRefusal | undefined {
  if (!peer.presented) return 'no client certificate';
  if (!peer.authorized) return 'not signed by the client CA';
  // Exactly one CN: with several, which one a name check reads would be a choice an attacker makes.
  if (names.length > 0 && !(peer.commonNames.length === 1 && names.includes(peer.commonNames[0]!)))
    return 'subject not allowed';
  return undefined;
}

/**
 * The one answer a refused caller gets (403): the same whatever failed, so a prober learns
 * only that it is not the API server.
 */
export const CALLER_REFUSED =
  'this webhook answers only the API server: present the client certificate its AdmissionConfiguration names';

/** The TLS facts of a request's connection ({@link Peer}). */
export function peerOf(socket: TLSSocket): Peer {
  const cert = socket.getPeerCertificate();
  const presented = cert !== null && typeof cert === 'object' && Object.keys(cert).length > 0;
  const cn = presented ? cert.subject?.CN : undefined;
  const raw = socket.authorizationError as unknown;
  const authorizationError = raw === null || raw === undefined ? undefined : String(raw);
  return {
    // An error recorded after a success (a later handshake) counts: Node never resets `authorized`.
    authorized: socket.authorized && authorizationError === undefined,
    authorizationError,
    presented,
    commonNames: cn === undefined ? [] : Array.isArray(cn) ? cn : [cn],
  };
}

/**
 * Middleware that lets through only callers {@link decideCaller} admits: the rest get 403
 * {@link CALLER_REFUSED} before their body is read, and one log line (`admission caller
 * refused`, with the reason and OpenSSL's code; no certificate content).
 * @param names allowed subject CNs (`CAPTF_ADMISSION_CLIENT_NAMES`); empty: any the CA signed.
 */
export function callerCheck(names: readonly string[], logger: Logger): RequestHandler {
  return (req, res, next) => {
    const peer = peerOf(req.socket as TLSSocket);
    const refusal = decideCaller(peer, names);
    if (!refusal) return next();
    logger.warn('admission caller refused', {
      reason: refusal,
      // OpenSSL's codes are upper-case words; anything else is not repeated.
      ...(peer.authorizationError && /^[A-Z_]{1,64}$/.test(peer.authorizationError)
        ? { tlsError: peer.authorizationError }
        : {}),
      remote: req.socket.remoteAddress,
    });
    res.set('connection', 'close').status(403).json({ error: CALLER_REFUSED });
  };
}
