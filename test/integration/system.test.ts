/**
 * The one system starter (scripts/system/system.ts) on the shared test control plane, named
 * without `install` so nothing is written into it: options that cannot work fail before
 * anything starts; a kubeconfig that does not parse or a server that does not answer is named
 * without quoting the file; `stop()` called twice at once resolves for both only when every
 * process is gone; a function started after the stop is stopped and refused.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { isRunning } from '../../scripts/lib/process.ts';
import { FUNCTION_NAMES, startSystem, type SystemOptions } from '../../scripts/system/system.ts';
import { controlPlaneDir } from '../helpers/cluster.ts';

const work = mkdtempSync(join(tmpdir(), 'captf-system-'));
after(() => rmSync(work, { recursive: true, force: true }));

const named = (kubeconfig = join(controlPlaneDir(), 'admin.kubeconfig')): SystemOptions => ({
  dir: join(work, 'state'),
  progress: () => undefined,
  cluster: { kubeconfig, install: false },
});

describe('startSystem', () => {
  it('refuses options that cannot work together before starting anything', async () => {
    await assert.rejects(startSystem({ ...named(), events: 'broker' }), /events and the webhook are delivered/);
    await assert.rejects(startSystem({ ...named(), functions: 'source', events: 'broker' }), /add --install/);
    await assert.rejects(startSystem({ ...named(), functions: 'source', webhook: true }), /it needs install/);
    await assert.rejects(startSystem({ ...named(), users: 'service-accounts' }), /not of a named cluster/);
  });

  it('names a kubeconfig that does not parse without quoting it, and a server that does not answer', async () => {
    const secret = 'planted-token-0123456789';
    const broken = join(work, 'broken.kubeconfig');
    writeFileSync(broken, `users:\n- name: u\n  user:\n    token: ${secret}\n   client-key-data: x\n`);
    await assert.rejects(startSystem(named(broken)), (err: Error) => {
      assert.match(err.message, /broken\.kubeconfig is not a kubeconfig/);
      assert.ok(!err.message.includes(secret), err.message);
      return true;
    });
    const dead = join(work, 'dead.kubeconfig');
    writeFileSync(
      dead,
      [
        'apiVersion: v1',
        'kind: Config',
        'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]',
        `users: [{name: u, user: {token: ${secret}}}]`,
        'contexts: [{name: x, context: {cluster: c, user: u}}]',
        'current-context: x',
      ].join('\n'),
    );
    await assert.rejects(startSystem(named(dead)), (err: Error) => {
      assert.match(err.message, /https:\/\/127\.0\.0\.1:1 \(from .*dead\.kubeconfig\) does not answer/);
      assert.ok(!err.message.includes(secret), err.message);
      return true;
    });
  });

  it('stops once for every caller, and refuses a function started after the stop', async () => {
    const system = await startSystem({ ...named(), functions: 'source' });
    const children = FUNCTION_NAMES.map((n) => system.functions[n].child);
    assert.ok(children.every(isRunning));
    await Promise.all([
      system.stop().then(() => assert.ok(!children.some(isRunning), 'the first stop waited for every process')),
      system.stop().then(() => assert.ok(!children.some(isRunning), 'the second stop waited too')),
    ]);
    await assert.rejects(system.startFunction('mirror-sync'), /started after the system stopped/);
  });
});
