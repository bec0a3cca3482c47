/**
 * Entry point of every function, in the container and locally:
 * `node functions/main.ts <function>` (or `npm run function -- <function>`), where
 * <function> is `admission`, `mirror-sync`, `identity-status` or `dead-letters`. Configuration comes from
 * the environment (docs/configuration.md); exits 2 on an unknown function name or bad
 * configuration. SIGTERM drains: nothing new is accepted, answers in flight finish, then the
 * process exits 0 (1 if the `CAPTF_DRAIN_SECONDS` deadline passed first). With an OpenTelemetry
 * endpoint in `OTEL_*`, metrics and traces are pushed there (lib/telemetry.ts), the last ones on
 * the drain.
 */
import { apiConnectionsFromEnv, setApiConnections } from './lib/api-pool.ts';
import { drainMsFromEnv, portFromEnv, stopGracefully, type FunctionHandle, type StartOptions } from './lib/http.ts';
import { startTelemetry, telemetry, telemetryFromEnv } from './lib/telemetry.ts';

// Static imports per name so a bundler includes every function, and importing one function
// loads none of the others' code.
const FUNCTIONS: Record<string, () => Promise<{ start(opts: StartOptions): Promise<FunctionHandle> }>> = {
  'mirror-sync': () => import('./mirror-sync/index.ts'),
  admission: () => import('./admission/index.ts'),
  'identity-status': () => import('./identity-status/index.ts'),
  'dead-letters': () => import('./dead-letters/index.ts'),
};

const name = process.argv[2] ?? '';
const load = FUNCTIONS[name];
if (!load) {
  process.stderr.write(`usage: main <${Object.keys(FUNCTIONS).join('|')}> (got ${JSON.stringify(name)})\n`);
  process.exit(2);
}
try {
  // One kept-alive pool per process for every API call (lib/api-pool.ts).
  setApiConnections(apiConnectionsFromEnv(process.env));
  const drainMs = drainMsFromEnv(process.env);
  // OpenTelemetry is loaded only when an OTEL_* endpoint asks for it (lib/telemetry.ts).
  const otel = telemetryFromEnv(process.env, name);
  const exporting = otel && (await startTelemetry(otel));
  // HOST: all interfaces by default, as in a container; local mode binds loopback only.
  const fn = await (await load()).start({ port: portFromEnv(), host: process.env.HOST || undefined });
  if (otel)
    fn.logger.info('telemetry pushed over OTLP', {
      service: otel.service,
      metrics: otel.metrics ?? false,
      traces: otel.traces ?? false,
    });
  const startupMs = performance.now();
  telemetry().started(startupMs / 1000);
  fn.logger.info('listening', { function: name, port: fn.port, scheme: fn.scheme, startupMs: Math.round(startupMs) });
  stopGracefully(fn, drainMs, exporting);
} catch (err) {
  process.stderr.write(`${name}: cannot start: ${err instanceof Error ? err.message.split('\n')[0] : String(err)}\n`);
  process.exit(2);
}
