/**
 * The `admission` function (SPEC §10): a validating webhook for TerraformClusterIdentity.
 * `POST /validate` takes an AdmissionReview `admission.k8s.io/v1` and answers one;
 * `GET /healthz`. Served over HTTPS with the certificate and key from
 * `$CAPTF_TLS_CERT_FILE`/`$CAPTF_TLS_KEY_FILE` (cert-manager's `tls.crt`/`tls.key`), reloaded
 * without a restart when the files change; or plain HTTP behind Knative's TLS-terminating
 * ingress with `CAPTF_ADMISSION_PLAIN_HTTP=true`. With `CAPTF_ADMISSION_CLIENT_CA_FILE`, only
 * a caller presenting a client certificate from that CA gets a review (./callers.ts). Nothing is
 * done at import time.
 */
import { createServer as createHttpServer, type Server } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import {
  closeServer,
  createApp,
  JSON_TYPES,
  readBody,
  errorHandler,
  limitIdleConnections,
  listen,
  serverOptions,
  SERVER_TIMEOUTS,
  startSettings,
  type FunctionHandle,
  type StartOptions,
} from '../lib/http.ts';
import { consumerKindsFromEnv } from '../lib/consumers.ts';
import { makeClients } from '../lib/kube.ts';
import { createLogger } from '../lib/log.ts';
import { readTlsPair, serverTlsOptions, watchTlsPair } from '../lib/tls.ts';
import { callerCheck } from './callers.ts';
import { validateHandler } from './handler.ts';

/** Where cert-manager's Secret volume puts the serving pair by default. */
export const DEFAULT_TLS_DIR = '/var/run/captf/tls';

/**
 * Largest AdmissionReview accepted, in bytes: an UPDATE carries the object twice (new and
 * old, each at most ~1.5 MiB in etcd) plus the envelope; anything bigger is not a real review
 * and gets 413.
 */
export const ADMISSION_BODY_LIMIT = 4 * 1024 * 1024;

/** Configuration read from the environment (docs/configuration.md). */
export interface AdmissionConfig {
  plainHttp: boolean;
  certFile: string;
  keyFile: string;
  /** How often the certificate files are checked for a new pair, in milliseconds. */
  reloadMs: number;
  /** The CA bundle a caller's client certificate must chain to; absent: callers are not checked. */
  caFile?: string | undefined;
  /** Subject CNs a caller's certificate may carry; empty: any the CA signed. */
  clientNames: string[];
}

/**
 * Reads the admission configuration.
 * @param env `CAPTF_ADMISSION_PLAIN_HTTP` (`true`/`false`, default false),
 *   `CAPTF_TLS_CERT_FILE` (default `/var/run/captf/tls/tls.crt`), `CAPTF_TLS_KEY_FILE`
 *   (default `/var/run/captf/tls/tls.key`), `CAPTF_TLS_RELOAD_MS` (default 10000),
 *   `CAPTF_ADMISSION_CLIENT_CA_FILE` (unset: callers unchecked), `CAPTF_ADMISSION_CLIENT_NAMES`
 *   (comma-separated subject CNs; unset: any certificate of that CA).
 * @throws Error naming the variable with a bad value, or a client CA with plain HTTP (behind
 *   Knative's ingress the function never sees the caller's certificate).
 */
export function admissionConfigFromEnv(env: NodeJS.ProcessEnv): AdmissionConfig {
  const plain = (env.CAPTF_ADMISSION_PLAIN_HTTP ?? '').trim().toLowerCase();
  if (!['', 'true', 'false'].includes(plain))
    throw new Error(`CAPTF_ADMISSION_PLAIN_HTTP=${plain} must be true or false`);
  const { caFile, clientNames } = callerCheckFromEnv(env, plain === 'true');
  return {
    plainHttp: plain === 'true',
    certFile: setting(env.CAPTF_TLS_CERT_FILE, `${DEFAULT_TLS_DIR}/tls.crt`),
    keyFile: setting(env.CAPTF_TLS_KEY_FILE, `${DEFAULT_TLS_DIR}/tls.key`),
    reloadMs: reloadMsFromEnv(env),
    caFile,
    clientNames,
  };
}

/**
 * The caller check's settings (`CAPTF_ADMISSION_CLIENT_CA_FILE`, `CAPTF_ADMISSION_CLIENT_NAMES`).
 * @throws Error for a variable set but blank (the check would be off, or any name admitted,
 *   without a word), names without a CA, or a CA with plain HTTP.
 */
function callerCheckFromEnv(
  env: NodeJS.ProcessEnv,
  plainHttp: boolean,
): Pick<AdmissionConfig, 'caFile' | 'clientNames'> {
  const caFile = env.CAPTF_ADMISSION_CLIENT_CA_FILE?.trim();
  if (caFile === '')
    throw new Error('CAPTF_ADMISSION_CLIENT_CA_FILE is set but blank: name the CA bundle, or unset it');
  const clientNames = (env.CAPTF_ADMISSION_CLIENT_NAMES ?? '')
    .split(',')
    .map((n) => n.trim())
    .filter((n) => n !== '');
  if (env.CAPTF_ADMISSION_CLIENT_NAMES !== undefined && clientNames.length === 0)
    throw new Error('CAPTF_ADMISSION_CLIENT_NAMES is set but names no subject: name one, or unset it');
  if (clientNames.length > 0 && !caFile)
    throw new Error('CAPTF_ADMISSION_CLIENT_NAMES needs CAPTF_ADMISSION_CLIENT_CA_FILE: names of which CA?');
  if (caFile && plainHttp)
    throw new Error(
      'CAPTF_ADMISSION_CLIENT_CA_FILE needs HTTPS: with CAPTF_ADMISSION_PLAIN_HTTP=true the TLS ends before the function and no client certificate reaches it',
    );
  return { caFile, clientNames };
}

/** A trimmed variable, or the default when unset or blank. */
const setting = (value: string | undefined, fallback: string): string => value?.trim() || fallback;

/** `CAPTF_TLS_RELOAD_MS` in milliseconds (default 10000, at least 50); throws naming the variable. */
function reloadMsFromEnv(env: NodeJS.ProcessEnv): number {
  const reloadRaw = setting(env.CAPTF_TLS_RELOAD_MS, '10000');
  const reloadMs = Number(reloadRaw);
  if (!Number.isFinite(reloadMs) || reloadMs < 50)
    throw new Error(`CAPTF_TLS_RELOAD_MS=${reloadRaw} must be a number of milliseconds ≥ 50`);
  return reloadMs;
}

/**
 * Starts the admission webhook.
 * @param opts port/host, kubeconfig (default `$KUBECONFIG` or in-cluster), logger, env.
 * @returns the running function; `scheme` tells whether it serves HTTPS or plain HTTP.
 * @throws Error on bad configuration or an unreadable/invalid TLS pair (main.ts exits 2).
 */
export async function start(opts: StartOptions = {}): Promise<FunctionHandle> {
  const { port: wanted, kubeconfig, env } = startSettings(opts);
  const logger = opts.logger ?? createLogger('admission');
  const cfg = admissionConfigFromEnv(env);
  const clients = makeClients(kubeconfig, undefined, logger);
  const consumerKinds = consumerKindsFromEnv(env);

  const app = createApp();
  // Before the body is read: a refused caller costs no parsing and no API request.
  if (cfg.caFile) app.use('/validate', callerCheck(cfg.clientNames, logger));
  logger.info(cfg.caFile ? 'callers checked by client certificate' : 'callers not checked', {
    ...(cfg.caFile ? { clientCaFile: cfg.caFile, clientNames: cfg.clientNames.length } : {}),
  });
  app.post(
    '/validate',
    readBody({ types: JSON_TYPES, limit: ADMISSION_BODY_LIMIT }),
    validateHandler({ clients, consumerKinds, logger }),
  );
  app.use(errorHandler(logger));

  let server: Server;
  let stopWatching = () => {};
  if (cfg.plainHttp) {
    server = createHttpServer(serverOptions(), app);
  } else {
    const pair = readTlsPair(cfg);
    // The TLS handshake gets the headers' bound too (Node's default is 120 s).
    const tlsOptions = { ...serverOptions(), handshakeTimeout: SERVER_TIMEOUTS.headersMs };
    const https = createHttpsServer({ ...tlsOptions, ...serverTlsOptions(pair) }, app);
    stopWatching = watchTlsPair(https, cfg, pair, logger);
    server = https;
  }
  limitIdleConnections(server);
  let port: number;
  try {
    port = await listen(server, wanted, opts.host);
  } catch (err) {
    stopWatching();
    throw err;
  }
  return {
    server,
    port,
    scheme: cfg.plainHttp ? 'http' : 'https',
    logger,
    close(deadlineMs?: number) {
      stopWatching();
      return closeServer(server, deadlineMs);
    },
  };
}
