/**
 * The pure parts of the local mode (scripts/local/): the ping it sends to the Broker,
 * durations and the PingSource schedules made of them, the readable lines made
 * from the functions' JSON logs and Knative's, and mirror change lines.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { TERRAFORM_CLUSTER } from '../../functions/lib/api.ts';
import { classifyEvent, parseCloudEvents } from '../../functions/lib/cloudevents.ts';
import { consumerKindsFromEnv } from '../../functions/lib/consumers.ts';
import { cronSchedule, parseDuration, pingMessage, watchPaths } from '../../scripts/local/events.ts';
import {
  LogPrinter,
  adapterLine,
  dataPlaneLine,
  describeMirrorChange,
  formatLine,
  type MirrorView,
} from '../../scripts/local/print.ts';

const kinds = consumerKindsFromEnv({});

describe('pingMessage: what system.ping() POSTs to the Broker', () => {
  it('a ping is a PingSource tick with data {}', () => {
    const m = pingMessage('captf-resync');
    assert.equal(m.headers['ce-type'], 'dev.knative.sources.ping');
    assert.equal(m.headers['ce-source'], '/apis/v1/namespaces/captf-system/pingsources/captf-resync');
    assert.equal(m.headers['content-type'], 'application/json');
    assert.equal(m.headers['kn-namespace'], 'captf-system');
    assert.ok(!Number.isNaN(Date.parse(m.headers['ce-time']!)));
    assert.equal(m.body, '{}');
    assert.equal(classifyEvent(parseCloudEvents(m.headers, m.body)[0]!, kinds).type, 'ping');
  });
});

describe('watchPaths: what the adapter will list and watch', () => {
  it('core resources under /api, others under /apis', () => {
    const gvr = (Group: string, Version: string, Resource: string) => ({ gvr: { Group, Version, Resource } });
    assert.deepEqual(
      watchPaths({
        namespaces: [],
        allNamespaces: true,
        mode: 'Reference',
        resources: [
          gvr(TERRAFORM_CLUSTER.group, TERRAFORM_CLUSTER.version, TERRAFORM_CLUSTER.plural),
          gvr('', 'v1', 'namespaces'),
        ],
      }),
      [
        `/apis/${TERRAFORM_CLUSTER.group}/${TERRAFORM_CLUSTER.version}/${TERRAFORM_CLUSTER.plural}`,
        '/api/v1/namespaces',
      ],
    );
  });
});

describe('parseDuration', () => {
  for (const [text, ms] of [
    ['500ms', 500],
    ['30s', 30_000],
    ['5m', 300_000],
    ['1h', 3_600_000],
    ['1m30s', 90_000],
    ['1.5s', 1500],
  ] as const) {
    it(`${text} = ${ms} ms`, () => assert.equal(parseDuration(text), ms));
  }
  for (const bad of ['', '30', 's', '5 m', '-1s', '0s', '5d', '1m x']) {
    it(`rejects ${JSON.stringify(bad)}`, () => assert.throws(() => parseDuration(bad), /not a duration/));
  }
});

describe('cronSchedule: --status/--resync as the PingSource schedules mtping runs', () => {
  for (const [ms, cron] of [
    [1000, '*/1 * * * * *'],
    [2000, '*/2 * * * * *'],
    [30_000, '*/30 * * * * *'],
    [60_000, '*/1 * * * *'],
    [5 * 60_000, '*/5 * * * *'],
    [10 * 60_000, '*/10 * * * *'],
    [3_600_000, '0 */1 * * *'],
    [6 * 3_600_000, '0 */6 * * *'],
    [24 * 3_600_000, '0 0 * * *'],
  ] as const) {
    it(`${ms} ms → ${cron}`, () => assert.equal(cronSchedule(ms), cron));
  }
  it("5m and 10m are the manifests' own schedules", () => {
    assert.equal(cronSchedule(parseDuration('5m')), '*/5 * * * *');
    assert.equal(cronSchedule(parseDuration('10m')), '*/10 * * * *');
  });
  for (const bad of [500, 1500, 7000, 45_000, 90_000, 7 * 60_000, 5 * 3_600_000, 48 * 3_600_000]) {
    it(`rejects ${bad} ms: cron cannot fire at that interval`, () =>
      assert.throws(() => cronSchedule(bad), /cannot be a PingSource schedule/));
  }
});

const reconcile = (over: Record<string, unknown>) =>
  JSON.stringify({
    level: 'info',
    message: 'reconcile',
    component: 'mirror-sync',
    object: 'team-a/prod',
    kind: 'TerraformCluster',
    identity: 'aws-prod',
    outcome: 'mirrored',
    reason: 'Mirrored',
    retry: false,
    mirror: 'captf-creds-aws-prod',
    detail: 'mirror team-a/captf-creds-aws-prod is current and owned by this object',
    ...over,
  });

describe('LogPrinter: one readable line per change', () => {
  it('prints an outcome once, then repeats of it only as debug, and again when it changes', () => {
    const p = new LogPrinter();
    const first = p.line('mirror-sync', reconcile({}))!;
    assert.equal(first.debug, false);
    assert.equal(first.subject, 'TerraformCluster team-a/prod');
    assert.equal(first.text, 'mirrored (captf-creds-aws-prod of identity aws-prod)');
    assert.equal(p.line('mirror-sync', reconcile({}))!.debug, true);
    const revoked = p.line(
      'mirror-sync',
      reconcile({
        outcome: 'not-allowed',
        reason: 'NamespaceNotAllowed',
        mirror: undefined,
        detail: 'namespace team-a is not allowed',
      }),
    )!;
    assert.deepEqual([revoked.debug, revoked.text], [false, 'NamespaceNotAllowed: namespace team-a is not allowed']);
    const gone = p.line(
      'mirror-sync',
      reconcile({ outcome: 'gone', reason: 'ObjectGone', detail: 'object is gone; released 1 mirror(s)' }),
    )!;
    assert.deepEqual([gone.debug, gone.text], [false, 'deleted; released 1 mirror(s)']);
    // After "gone" the object starts afresh: the same name created again is news.
    assert.equal(p.line('mirror-sync', reconcile({}))!.debug, false);
  });

  it('a retried failure says so; an error is never hidden even when repeated', () => {
    const p = new LogPrinter();
    const line = reconcile({ level: 'warn', outcome: 'error', reason: 'APIError', retry: true, detail: 'HTTP 500' });
    assert.equal(p.line('mirror-sync', line)!.text, 'APIError: HTTP 500 (will retry)');
    assert.equal(p.line('mirror-sync', line)!.debug, false);
  });

  it('identity-status: a written status is printed, an unchanged one is debug', () => {
    const p = new LogPrinter();
    const base = {
      level: 'info',
      message: 'identity refreshed',
      identity: 'aws-prod',
      outcome: 'refreshed',
      ready: 'True',
      reason: 'SecretFound',
      namespaces: ['team-a', 'team-b'],
    };
    const w = p.line('identity-status', JSON.stringify({ ...base, changed: ['namespaces'] }))!;
    assert.deepEqual(
      [w.debug, w.subject, w.text],
      [false, 'identity aws-prod', 'Ready=True (SecretFound), in use in [team-a,team-b]; wrote namespaces'],
    );
    assert.equal(p.line('identity-status', JSON.stringify({ ...base, changed: [] }))!.debug, true);
  });

  it('admission: denials are printed with who and why; allowed requests are debug', () => {
    const p = new LogPrinter();
    const d = p.line(
      'admission',
      JSON.stringify({
        level: 'info',
        message: 'reviewed',
        operation: 'CREATE',
        name: 'x',
        user: 'alice',
        allowed: false,
        code: 403,
        denial: 'user "alice" may not get Secret s/n',
      }),
    )!;
    assert.deepEqual([d.debug, d.text], [false, 'DENIED create by alice: user "alice" may not get Secret s/n']);
    assert.equal(
      p.line(
        'admission',
        JSON.stringify({
          level: 'info',
          message: 'reviewed',
          operation: 'UPDATE',
          name: 'x',
          user: 'admin',
          allowed: true,
          why: 'narrowing',
        }),
      )!.debug,
      true,
    );
  });

  it('warnings are printed; plain text lines are printed as they are; blank lines are skipped', () => {
    const p = new LogPrinter();
    const w = p.line('mirror-sync', JSON.stringify({ level: 'warn', message: 'bad event', error: 'unknown type' }))!;
    assert.deepEqual([w.debug, w.text], [false, 'warn: bad event (error=unknown type)']);
    assert.deepEqual(p.line('admission', 'admission: cannot start: cannot read the TLS key'), {
      debug: false,
      component: 'admission',
      subject: '',
      text: 'admission: cannot start: cannot read the TLS key',
    });
    assert.equal(p.line('admission', '   '), undefined);
    assert.equal(p.line('admission', JSON.stringify({ level: 'info', message: 'listening', port: 1 }))!.debug, true);
  });

  it('only named fields are printed: a field the printer does not know never appears', () => {
    const p = new LogPrinter();
    const lines = [
      reconcile({ extra: 'PLANTED-1' }),
      JSON.stringify({ level: 'warn', message: 'x', stringData: 'PLANTED-2' }),
      JSON.stringify({
        level: 'info',
        message: 'identity refreshed',
        identity: 'i',
        changed: ['Ready'],
        namespaces: [],
        token: 'PLANTED-3',
      }),
    ];
    for (const l of lines) assert.doesNotMatch(formatLine(p.line('c', l)!), /PLANTED/);
  });
});

describe('describeMirrorChange', () => {
  const v = (over: Partial<MirrorView> = {}): MirrorView => ({
    namespace: 'team-a',
    name: 'captf-creds-aws-prod',
    identity: 'aws-prod',
    owners: ['TerraformCluster/prod'],
    hash: 'h1',
    ...over,
  });
  it('created, deleted, owners changed, data rotated (the hash is compared, never shown), nothing changed', () => {
    assert.equal(
      describeMirrorChange('add', v())!.text,
      'created for identity aws-prod; 1 owner: TerraformCluster/prod',
    );
    assert.equal(describeMirrorChange('delete', v())!.text, 'deleted (identity aws-prod)');
    assert.equal(
      describeMirrorChange('update', v({ owners: ['TerraformCluster/prod', 'TerraformMachine/m'] }), v())!.text,
      'updated; owners +TerraformMachine/m (now 2 owners)',
    );
    assert.equal(
      describeMirrorChange('update', v({ owners: ['TerraformMachine/m'] }), v())!.text,
      'updated; owners +TerraformMachine/m −TerraformCluster/prod (now 1 owner)',
    );
    const rotated = describeMirrorChange('update', v({ hash: 'h2' }), v())!;
    assert.equal(rotated.text, 'updated; data replaced from the rotated source');
    assert.doesNotMatch(formatLine(rotated), /h2|h1/);
    assert.equal(describeMirrorChange('update', v(), v()), undefined);
  });
  it('stays one short line on a mirror with hundreds of owners', () => {
    const many = Array.from({ length: 200 }, (_, i) => `TerraformMachine/m-${i}`);
    const created = describeMirrorChange('add', v({ owners: many }))!.text;
    assert.equal(
      created,
      'created for identity aws-prod; 200 owners: TerraformMachine/m-0, TerraformMachine/m-1, TerraformMachine/m-2 and 197 more',
    );
    const grown = describeMirrorChange('update', v({ owners: [...many, 'TerraformCluster/x'] }), v({ owners: many }))!;
    assert.equal(grown.text, 'updated; owners +TerraformCluster/x (now 201 owners)');
    const shrunk = describeMirrorChange('update', v({ owners: many.slice(50) }), v({ owners: many }))!;
    assert.equal(
      shrunk.text,
      'updated; owners −TerraformMachine/m-0, TerraformMachine/m-1, TerraformMachine/m-2 and 47 more (now 150 owners)',
    );
  });
});

describe('adapterLine: the event source speaks up when it fails', () => {
  it("shows the adapter's warnings and errors (severity/message), keeps the rest as debug", () => {
    const error = adapterLine(
      'captf-objects',
      JSON.stringify({ severity: 'ERROR', message: 'failed to send cloudevent', error: 'connection refused' }),
    )!;
    assert.deepEqual(error, {
      debug: false,
      component: 'events',
      subject: 'adapter captf-objects',
      text: 'error: failed to send cloudevent (connection refused)',
    });
    assert.equal(adapterLine('x', JSON.stringify({ severity: 'WARNING', message: 'slow' }))!.text, 'warn: slow');
    assert.equal(adapterLine('x', JSON.stringify({ level: 'error', msg: 'old style' }))!.debug, false);
    assert.equal(adapterLine('x', JSON.stringify({ severity: 'INFO', message: 'Registering 3 clients' }))!.debug, true);
    assert.equal(adapterLine('x', 'E1130 16:45:36.434644 5007 reflector.go:578] watch failed')!.debug, false);
    assert.equal(adapterLine('x', 'I1130 16:45:36.434644 5007 reflector.go:578] "Warning: watch ended"')!.debug, true);
    const benign = JSON.stringify({
      severity: 'WARNING',
      message: 'Sink timeout configuration is invalid, default to -1',
    });
    assert.equal(adapterLine('x', benign)!.debug, true);
    assert.equal(adapterLine('x', '  '), undefined);
  });
});

describe('dataPlaneLine: the Broker data plane speaks up, its start-up noise aside', () => {
  it("prints Knative's warnings and errors (both JSON styles), keeps info as debug", () => {
    const error = dataPlaneLine(
      'broker-filter',
      JSON.stringify({
        severity: 'ERROR',
        message: 'failed to send event',
        error: 'unable to complete request to http://127.0.0.1:1/: connection refused',
        stacktrace: 'knative.dev/eventing/pkg/broker/filter.(*Handler).send PLANTED',
      }),
    )!;
    assert.deepEqual(error, {
      debug: false,
      component: 'events',
      subject: 'broker-filter',
      text: 'error: failed to send event (unable to complete request to http://127.0.0.1:1/: connection refused)',
    });
    assert.equal(dataPlaneLine('broker-ingress', JSON.stringify({ level: 'warn', msg: 'x' }))!.text, 'warn: x');
    assert.equal(dataPlaneLine('mtping', '2026/11/30 18:51:17 Registering 3 clients')!.debug, true);
    assert.equal(dataPlaneLine('mtping', 'I1130 18:51:17.593569 14450 leaderelection.go:258] lease')!.debug, true);
  });

  it('hides only the OIDC and TLS-Secret lines every local start prints, and the last export cut short by a stop', () => {
    const oidc =
      'could not initialize provider. You can ignore this message, when the authentication-oidc feature is disabled{error 26 0  could not load Kubernetes OIDC discovery information}';
    const lines = [
      JSON.stringify({ severity: 'ERROR', message: oidc }),
      JSON.stringify({ level: 'error', msg: oidc.replace('provider.', 'provider after config update.') }),
      JSON.stringify({ severity: 'WARNING', message: 'secrets "imc-dispatcher-server-tls" not found' }),
      JSON.stringify({ level: 'warn', msg: 'secrets "mt-broker-filter-server-tls" not found' }),
      JSON.stringify({ severity: 'ERROR', message: 'Error flushing traces', error: 'context canceled' }),
    ];
    for (const l of lines) assert.equal(dataPlaneLine('imc-dispatcher', l)!.debug, true, l);
    // The same words about something else are not noise.
    const other = JSON.stringify({ severity: 'WARNING', message: 'secrets "captf-dead-letters" not found' });
    assert.equal(dataPlaneLine('imc-dispatcher', other)!.debug, false);
    assert.equal(dataPlaneLine('imc-dispatcher', JSON.stringify({ severity: 'ERROR', message: 'oidc' }))!.debug, false);
    const refused = JSON.stringify({
      severity: 'ERROR',
      message: 'Error flushing traces',
      error: 'connection refused',
    });
    assert.equal(dataPlaneLine('broker-ingress', refused)!.debug, false);
  });
});
