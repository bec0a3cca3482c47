/**
 * What the metrics and the traces SDK sides (./telemetry-sdk.ts, ./tracing-sdk.ts) share, loaded
 * only with telemetry on: the resource every signal of a process carries (`service.name`, and a
 * `service.instance.id` of its own so that pods of one function never write one series;
 * `OTEL_RESOURCE_ATTRIBUTES` adds to it and wins, as in every OpenTelemetry SDK), and a shutdown
 * bounded in time.
 */
import { detectResources, envDetector, resourceFromAttributes, type Resource } from '@opentelemetry/resources';

/** Who pushes: the function's service name and this process's instance id. */
export interface Pusher {
  service: string;
  /** A random UUID per process (./telemetry.ts). */
  instance: string;
}

/** The resource of `who`, with `OTEL_RESOURCE_ATTRIBUTES` merged over it. */
export const resourceOf = (who: Pusher): Resource =>
  resourceFromAttributes({ 'service.name': who.service, 'service.instance.id': who.instance }).merge(
    detectResources({ detectors: [envDetector] }),
  );

/**
 * Waits for `shutdown` (a provider's: it exports what is left) at most `timeoutMs`.
 * @returns never rejects: the SIGTERM drain goes on whatever the exporter does.
 */
export async function shutdownWithin(shutdown: () => Promise<void>, timeoutMs: number): Promise<void> {
  await Promise.race([
    shutdown().catch(() => undefined),
    new Promise((resolve) => setTimeout(resolve, timeoutMs).unref()),
  ]);
}
