import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Clients } from '../../functions/lib/kube.ts';
import { LABEL_MIRRORED } from '../../functions/lib/mirror.ts';
import * as fx from '../helpers/fixtures.ts';
import { RUN_SENTINEL, SENTINEL_KEY, findLeaks, plantSentinels } from '../helpers/leaks.ts';

describe('planted Secret values are found in any form', () => {
  it('plants a value in every created Secret but hand-made mirrors, and finds it plain or base64', async () => {
    const created: { data?: Record<string, string>; metadata?: { labels?: Record<string, string> } }[] = [];
    const fake = {
      core: { createNamespacedSecret: async (p: { body: (typeof created)[number] }) => created.push(p.body) },
    } as unknown as Clients;
    const c = plantSentinels(fake);
    await c.core.createNamespacedSecret({ namespace: 'n', body: fx.sourceSecret('s', fx.data({ k: 'v' })) });
    await c.core.createNamespacedSecret({
      namespace: 'n',
      body: fx.sourceSecret('m', fx.labels({ [LABEL_MIRRORED]: 'true' }), fx.data({ k: 'v' })),
    });
    const planted = Buffer.from(created[0]!.data![SENTINEL_KEY]!, 'base64').toString();
    assert.ok(planted.startsWith(RUN_SENTINEL));
    assert.equal(created[1]!.data![SENTINEL_KEY], undefined, 'a mirror built by hand is left as given');
    assert.equal(findLeaks(`x ${planted} y`, 'log').length, 1);
    assert.equal(findLeaks(`x ${created[0]!.data![SENTINEL_KEY]} y`, 'log').length, 1, 'the base64 form');
    assert.deepEqual(findLeaks('nothing here', 'log'), []);
  });
});
