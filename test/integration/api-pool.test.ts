/**
 * SPEC §0: all API calls of a process go through one kept-alive connection pool. A real
 * mirror-sync process, limited to 3 connections, runs a resync over 40 consumers with 16
 * reconciles in flight; its TCP connections to the API server, sampled from /proc the whole
 * time, never exceed the pool size (client-node alone would open one per request).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { controlPlaneDir } from '../helpers/cluster.ts';
import { pingEvent } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';
import { deliver } from '../helpers/mirror-sync.ts';
import { spawnFunction, type FunctionProcess } from '../helpers/process.ts';
import { connectionsTo } from '../helpers/sockets.ts';

const w = fx.world('pool');
let fn: FunctionProcess;
const apiPort = Number(new URL(w.clients.kc.getCurrentCluster()!.server).port);

before(async () => {
  fn = await spawnFunction('mirror-sync', {
    KUBECONFIG: `${controlPlaneDir()}/admin.kubeconfig`,
    CAPTF_API_CONNECTIONS: '3',
    CAPTF_CONCURRENCY: '16',
    HOST: '127.0.0.1',
  });
});
after(() => fn?.kill());

describe('the API connection pool (SPEC §0)', () => {
  it('keeps a resync with 16 reconciles in flight within CAPTF_API_CONNECTIONS sockets', async () => {
    const n1 = await w.namespace();
    const n2 = await w.namespace();
    await w.create(fx.sourceSecret('creds', fx.inNamespace(n1)));
    const id = w.name('id');
    await w.create(fx.identity(id, fx.secretRef(n1, 'creds'), fx.allowList(n1, n2)));
    await Promise.all(
      Array.from({ length: 40 }, (_, i) =>
        w.create(fx.consumer(`c-${i}`, fx.inNamespace(i % 2 ? n1 : n2), fx.identityRef(id))),
      ),
    );

    let peak = 0;
    const timer = setInterval(() => (peak = Math.max(peak, connectionsTo(fn.child.pid!, apiPort))), 5);
    try {
      const r = await deliver(`http://127.0.0.1:${fn.port}/`, pingEvent('captf-resync'), { retries: 3 });
      assert.equal(r.status, 200, r.text);
    } finally {
      clearInterval(timer);
    }
    assert.ok(peak >= 1, 'the sampler saw the connections to the API server');
    assert.ok(peak <= 3, `mirror-sync held ${peak} connections to the API server; the pool allows 3`);
  });
});
