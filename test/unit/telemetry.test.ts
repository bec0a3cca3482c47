/**
 * telemetryFromEnv (functions/lib/telemetry.ts): OpenTelemetry's standard variables decide
 * whether the SDK is loaded at all.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { recording, telemetryFromEnv } from '../../functions/lib/telemetry.ts';

const ENDPOINT = { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' };

describe('telemetryFromEnv', () => {
  it('is off without an endpoint, and nothing records', () => {
    assert.equal(telemetryFromEnv({}, 'admission'), undefined);
    assert.equal(
      telemetryFromEnv({ OTEL_SERVICE_NAME: 'x', OTEL_EXPORTER_OTLP_ENDPOINT: ' ' }, 'admission'),
      undefined,
    );
    assert.equal(recording(), false);
  });

  it('is on with either endpoint, named after the function unless OTEL_SERVICE_NAME says otherwise', () => {
    assert.deepEqual(telemetryFromEnv(ENDPOINT, 'mirror-sync'), { service: 'captf-mirror-sync', intervalMs: 60_000 });
    assert.deepEqual(
      telemetryFromEnv(
        { OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: 'http://p/api/v1/otlp/v1/metrics', OTEL_SERVICE_NAME: 'ours' },
        'admission',
      ),
      { service: 'ours', intervalMs: 60_000 },
    );
    assert.equal(telemetryFromEnv({ ...ENDPOINT, OTEL_METRIC_EXPORT_INTERVAL: '5000' }, 'admission')?.intervalMs, 5000);
  });

  it('stays off when OpenTelemetry is disabled or the metrics exporter is none', () => {
    assert.equal(telemetryFromEnv({ ...ENDPOINT, OTEL_SDK_DISABLED: 'true' }, 'admission'), undefined);
    assert.equal(telemetryFromEnv({ ...ENDPOINT, OTEL_METRICS_EXPORTER: 'none' }, 'admission'), undefined);
  });

  it('refuses an interval that is not a whole number of ms from 100', () => {
    for (const bad of ['0', '99', '1.5', 'soon'])
      assert.throws(
        () => telemetryFromEnv({ ...ENDPOINT, OTEL_METRIC_EXPORT_INTERVAL: bad }, 'admission'),
        /OTEL_METRIC_EXPORT_INTERVAL/,
      );
  });
});
