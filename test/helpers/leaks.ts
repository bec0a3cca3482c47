/**
 * No secret ever leaks, across every test file: every Secret a test creates
 * through the test helpers' clients (except mirrors it builds by hand) gets a planted key
 * `CAPTF_SENTINEL` whose value starts with this run's sentinel; at the end of each file,
 * everything the functions said is scanned for it, plain and base64: captured logs, spawned
 * functions' output, recorded HTTP answers, and the Events, conditions and statuses of the
 * file's objects on the API server.
 */
import { randomBytes } from 'node:crypto';
import { DEFAULT_CONSUMER_KINDS } from '../../functions/lib/api.ts';
import type { Clients } from '../../functions/lib/kube.ts';
import { consumerObjects, identities } from '../../functions/lib/objects.ts';

/** This run's sentinel (`npm test` sets one for every file; a file run alone makes its own). */
export const RUN_SENTINEL = process.env.CAPTF_TEST_SENTINEL ?? `CAPTFLEAK${randomBytes(6).toString('hex')}`;

/** Name of the planted data key (a valid environment variable name: mirrors feed `envFrom`). */
export const SENTINEL_KEY = 'CAPTF_SENTINEL';

/** The forms a planted value takes in text: as is, and base64 (a prefix of any value starting with it). */
const FORMS = [
  RUN_SENTINEL,
  Buffer.from(RUN_SENTINEL.slice(0, 3 * Math.floor(RUN_SENTINEL.length / 3))).toString('base64'),
];

const sources: { where: string; text: () => string }[] = [];

/** Registers output to be scanned at the end of the file (a logger's lines, a process's output, answers). */
export function scanLater(where: string, text: () => string): void {
  sources.push({ where, text });
}

/** Where in `text` a planted value appears (one finding per form found). */
export function findLeaks(text: string, where: string): string[] {
  return FORMS.filter((f) => text.includes(f)).map(() => `${where} contains a planted Secret value`);
}

/** Findings in every registered output. */
export function outputLeaks(): string[] {
  return sources.flatMap((s) => findLeaks(s.text(), s.where));
}

/**
 * Wraps `clients.core.createNamespacedSecret` so each Secret created carries a planted value
 * (`<RUN_SENTINEL>-<random>` under {@link SENTINEL_KEY}); Secrets labelled as mirrors are left as given.
 * @returns the same clients object.
 */
export function plantSentinels<T extends Clients>(clients: T): T {
  const create = clients.core.createNamespacedSecret.bind(clients.core);
  clients.core.createNamespacedSecret = ((
    param: Parameters<typeof create>[0],
    options?: Parameters<typeof create>[1],
  ) => {
    const body = param.body;
    if (body.metadata?.labels?.['captf.io/mirrored'] !== 'true') {
      body.data = {
        ...body.data,
        [SENTINEL_KEY]: Buffer.from(`${RUN_SENTINEL}-${randomBytes(4).toString('hex')}`).toString('base64'),
      };
    }
    return create(param, options);
  }) as typeof create;
  return clients;
}

/** The JSON of a list's items (or of only their statuses); '' when the list fails. */
const listed = (list: Promise<unknown>, statusesOnly = false): Promise<string> =>
  list.then(
    (l) => {
      const items = (l as { items: { status?: unknown }[] }).items;
      return JSON.stringify(statusesOnly ? items.map((i) => i.status) : items);
    },
    () => '',
  );

/** Findings in the Events, consumers' conditions and identities' statuses of `namespaces` on the API server. */
export async function clusterLeaks(a: Clients, namespaces: readonly string[]): Promise<string[]> {
  const found: string[] = [];
  for (const namespace of namespaces) {
    const texts = await Promise.all([
      listed(a.core.listNamespacedEvent({ namespace })),
      listed(a.events.listNamespacedEvent({ namespace })),
      ...DEFAULT_CONSUMER_KINDS.map((kind) => listed(consumerObjects(a, kind).list({ namespace }), true)),
    ]);
    found.push(...findLeaks(texts.join('\n'), `Events and conditions in ${namespace}`));
  }
  found.push(...findLeaks(await listed(identities(a).list(), true), 'identity statuses'));
  return found;
}
