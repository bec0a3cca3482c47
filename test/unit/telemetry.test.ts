/**
 * telemetryFromEnv (functions/lib/telemetry.ts): OpenTelemetry's standard variables decide
 * whether the SDK is loaded at all, and for which signals.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { NO_TRACES, recording, telemetry, telemetryFromEnv } from '../../functions/lib/telemetry.ts';

const ENDPOINT = { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' };
const BOTH = {
  metrics: { intervalMs: 60_000 },
  traces: { sampler: 'parentbased_always_on', ratio: 1 },
};

describe('telemetryFromEnv', () => {
  it('is off without an endpoint, and nothing records', async () => {
    assert.equal(telemetryFromEnv({}, 'admission'), undefined);
    assert.equal(
      telemetryFromEnv({ OTEL_SERVICE_NAME: 'x', OTEL_EXPORTER_OTLP_ENDPOINT: ' ' }, 'admission'),
      undefined,
    );
    assert.equal(recording(), false);
    // With traces off a span is the callback itself, and a log line gets no ids.
    assert.equal(await telemetry().span('x', {}, async () => 42), 42);
    assert.equal(telemetry().logIds(), undefined);
    assert.equal(telemetry().span, NO_TRACES.span);
  });

  it('turns on both signals with the common endpoint, named after the function unless OTEL_SERVICE_NAME says otherwise', () => {
    assert.deepEqual(telemetryFromEnv(ENDPOINT, 'mirror-sync'), { service: 'captf-mirror-sync', ...BOTH });
    assert.deepEqual(telemetryFromEnv({ ...ENDPOINT, OTEL_SERVICE_NAME: 'ours' }, 'admission'), {
      service: 'ours',
      ...BOTH,
    });
    assert.equal(
      telemetryFromEnv({ ...ENDPOINT, OTEL_METRIC_EXPORT_INTERVAL: '5000' }, 'admission')?.metrics?.intervalMs,
      5000,
    );
  });

  it("turns on one signal with that signal's endpoint, or with the other's exporter set to none", () => {
    const metricsOnly = telemetryFromEnv({ OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: 'http://p/v1/metrics' }, 'admission');
    assert.deepEqual(metricsOnly, { service: 'captf-admission', metrics: BOTH.metrics });
    const tracesOnly = telemetryFromEnv({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://j/v1/traces' }, 'admission');
    assert.deepEqual(tracesOnly, { service: 'captf-admission', traces: BOTH.traces });
    assert.equal(telemetryFromEnv({ ...ENDPOINT, OTEL_TRACES_EXPORTER: 'none' }, 'admission')?.traces, undefined);
    assert.equal(telemetryFromEnv({ ...ENDPOINT, OTEL_METRICS_EXPORTER: 'none' }, 'admission')?.metrics, undefined);
  });

  it('stays off when OpenTelemetry is disabled (in any case) or both exporters are none', () => {
    assert.equal(telemetryFromEnv({ ...ENDPOINT, OTEL_SDK_DISABLED: 'true' }, 'admission'), undefined);
    assert.equal(telemetryFromEnv({ ...ENDPOINT, OTEL_SDK_DISABLED: 'TRUE' }, 'admission'), undefined);
    assert.equal(
      telemetryFromEnv({ ...ENDPOINT, OTEL_METRICS_EXPORTER: 'none', OTEL_TRACES_EXPORTER: 'none' }, 'admission'),
      undefined,
    );
  });

  it("reads OpenTelemetry's sampler names and a ratio's argument", () => {
    const traces = (env: Record<string, string>) => telemetryFromEnv({ ...ENDPOINT, ...env }, 'admission')?.traces;
    assert.deepEqual(traces({ OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.25' }), {
      sampler: 'parentbased_traceidratio',
      ratio: 0.25,
    });
    assert.deepEqual(traces({ OTEL_TRACES_SAMPLER: 'always_off' }), { sampler: 'always_off', ratio: 1 });
  });

  it('refuses what it cannot do instead of exporting nothing: a bad endpoint, another exporter or protocol', () => {
    const refused = (env: Record<string, string>, pattern: RegExp) =>
      assert.throws(() => telemetryFromEnv(env, 'admission'), pattern, JSON.stringify(env));
    refused({ OTEL_EXPORTER_OTLP_ENDPOINT: 'not a url' }, /OTEL_EXPORTER_OTLP_ENDPOINT must be an http or https URL/);
    refused({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'ftp://collector/v1/traces' }, /OTEL_EXPORTER_OTLP_TRACES_ENDPOINT/);
    refused({ ...ENDPOINT, OTEL_METRICS_EXPORTER: 'prometheus' }, /only otlp/);
    refused({ ...ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' }, /only http\/json/);
    refused({ ...ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: 'http/protobuf' }, /OTEL_EXPORTER_OTLP_TRACES_PROTOCOL/);
    // A signal switched off is not checked further.
    assert.equal(
      telemetryFromEnv(
        { OTEL_EXPORTER_OTLP_ENDPOINT: 'bad', OTEL_METRICS_EXPORTER: 'none', OTEL_TRACES_EXPORTER: 'none' },
        'x',
      ),
      undefined,
    );
  });

  it('refuses an interval that is not a whole number of ms from 100 to a day, an unknown sampler, or a ratio outside 0–1', () => {
    for (const bad of ['0', '99', '1.5', 'soon', '86400001', '3000000000'])
      assert.throws(
        () => telemetryFromEnv({ ...ENDPOINT, OTEL_METRIC_EXPORT_INTERVAL: bad }, 'admission'),
        /OTEL_METRIC_EXPORT_INTERVAL/,
      );
    assert.throws(() => telemetryFromEnv({ ...ENDPOINT, OTEL_TRACES_SAMPLER: 'sometimes' }, 'admission'), /one of/);
    for (const bad of ['2', '-0.1', 'half'])
      assert.throws(
        () =>
          telemetryFromEnv(
            { ...ENDPOINT, OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: bad },
            'admission',
          ),
        /OTEL_TRACES_SAMPLER_ARG/,
      );
  });
});
