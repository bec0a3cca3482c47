/**
 * Hostile input, property-based: fast-check generates AdmissionReviews and
 * CloudEvents (binary, structured and batch; missing and wrong attributes, wrong types, huge
 * strings, deep nesting, invalid UTF-8, wrong content types, empty bodies) and posts them to
 * the real functions, started as processes against the test control plane by the one system
 * starter (scripts/system/system.ts, with scripts/soak/'s fuzz environment). Each
 * case is followed by a known-good request. Properties: no 5xx, no dropped connection, no
 * crash (every process still runs, no error log line); well-formed events about objects that do
 * not exist get a 2xx; the known-good request always succeeds. `npm run soak` runs the same
 * with ≥ 10 000 cases. A failure prints fast-check's seed and path (replay with
 * `CAPTF_FUZZ_SEED`/`CAPTF_FUZZ_PATH`); once fixed, its counterexample joins `REGRESSIONS`.
 */
import assert from 'node:assert/strict';
import { request as httpRequest } from 'node:http';
import { after, before, describe, it } from 'node:test';
import { checkAnswer, describeFigures, fuzz, send } from '../../scripts/soak/fuzz.ts';
import { Raw, knownGoodReview, type FuzzCase } from '../../scripts/soak/hostile.ts';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isRunning } from '../../scripts/lib/process.ts';
import { prepareCaller, type PrepareCaller } from '../../scripts/lib/serviceaccount.ts';
import { FUZZ_ENV, fuzzTargets, newTallies, tallyLine } from '../../scripts/soak/targets.ts';
import type { FuzzTarget } from '../../scripts/soak/fuzz.ts';
import { FUNCTION_NAMES, startSystem, type FunctionName, type RunningSystem } from '../../scripts/system/system.ts';
import { admissionReview } from '../helpers/admission.ts';
import { admin, controlPlaneDir, suffix } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';

/** Cases per function in `npm test` (override with CAPTF_FUZZ_RUNS). */
const RUNS = Number(process.env.CAPTF_FUZZ_RUNS || 300);

/** Replays a run: `CAPTF_FUZZ_SEED=<seed> CAPTF_FUZZ_PATH=<path>` as printed by a failure. */
const REPLAY = {
  seed: process.env.CAPTF_FUZZ_SEED ? Number(process.env.CAPTF_FUZZ_SEED) : undefined,
  path: process.env.CAPTF_FUZZ_PATH || undefined,
};

const deepObject = (d: number) => new Raw('{"a":'.repeat(d) + '1' + '}'.repeat(d), `{a:}×${d}`);
const deepArray = (d: number) => new Raw('['.repeat(d) + ']'.repeat(d), `[]×${d}`);
const FUZZ_UID = '00000000-0000-1000-8000-000000000000';
/** An AdmissionReview about identity `name` by the fuzz's user, `fields` (the objects) as posted. */
const fuzzReview = (operation: string, name: string, fields: Record<string, unknown>) =>
  admissionReview({
    uid: FUZZ_UID,
    operation,
    name,
    userInfo: { username: 'fuzz-user-00000000', groups: ['fuzzers'] },
    ...fields,
  });
/** A counterexample kept as the request it was: a POST that must get no 5xx. */
const posted = (path: string, headers: Record<string, string>, body: unknown): FuzzCase => ({
  kind: 'regression',
  expect: 'no-5xx',
  request: { method: 'POST', path, headers, body },
});
const cluster = fx.consumer('fz-00000a', fx.inNamespace('fz-a0a0a0'));

/**
 * The counterexamples the fuzz found (shrunk), kept as they were posted. A seed replays only
 * with the arbitraries of its day, so each is kept as a request; the seed says where it came from.
 */
const REGRESSIONS: { target: string; what: string; found: string; request: FuzzCase }[] = [
  ...(['mirror-sync', 'identity-status'] as const).map((target) => ({
    target,
    what: 'a structured-mode body that is a 1 MB JSON string of quotes, with ce- headers (the SDK made each character an attribute and ran out of heap)',
    found: 'seed 514148110, path 237',
    request: posted(
      '/',
      {
        'content-type': 'application/cloudevents+json; charset=utf-8',
        'ce-specversion': '1.0',
        'ce-id': FUZZ_UID,
        'ce-source': 'https://127.0.0.1:6443',
        'ce-type': 'dev.knative.apiserver.resource.delete',
      },
      new Raw(`"${'\\"'.repeat(500_000)}"`, '"\\"×500000"'),
    ),
  })),
  {
    target: 'admission',
    what: 'an UPDATE whose object and oldObject hold the same 10 000-deep spec (no stack overflow in the deep equality)',
    found: 'seed 1472984686, path 168:0:0:…:0:1',
    request: posted(
      '/validate',
      { 'content-type': 'application/json' },
      fuzzReview('UPDATE', 'fz-aaa000', {
        object: fx.identity('fz-aaa000', fx.identitySpec(deepObject(10_000))),
        oldObject: fx.identity('fz-aaa000', fx.identitySpec(deepObject(10_000))),
      }),
    ),
  },
  {
    target: 'admission',
    what: 'a 200 000-deep array as apiVersion (no stack overflow in String())',
    found: 'seed -521222806, path 1270:0:0:…:1:1:4:4:4',
    request: posted(
      '/validate',
      {},
      {
        ...fuzzReview('CREATE', 'fz-0a0000', {
          object: fx.identity('fz-aaa000', fx.secretRef('captf-fuzz-secrets', 'fz-00a0aa')),
        }),
        apiVersion: deepArray(200_000),
      },
    ),
  },
  {
    target: 'mirror-sync',
    what: 'a structured event whose specversion is a 200 000-deep array (no stack overflow quoting it)',
    found: 'soak seed -1529217932, path 2471:2:1:…:5:5',
    request: posted(
      '/',
      { 'content-type': 'application/cloudevents+json' },
      {
        specversion: deepArray(200_000),
        id: FUZZ_UID,
        source: 'https://127.0.0.1:6443',
        type: 'dev.knative.apiserver.resource.add',
        datacontenttype: 'application/json',
        kind: cluster.kind,
        name: cluster.metadata.name,
        namespace: cluster.metadata.namespace,
        apiversion: cluster.apiVersion,
        data: {
          apiVersion: cluster.apiVersion,
          kind: cluster.kind,
          metadata: { ...cluster.metadata, uid: FUZZ_UID },
        },
        UPPER: null,
      },
    ),
  },
];

const logs = newTallies();
const dir = mkdtempSync(join(tmpdir(), 'captf-hostile-'));
let system: RunningSystem | undefined;
let caller: PrepareCaller | undefined;
let targets: FuzzTarget[] = [];

before(async () => {
  system = await startSystem({
    dir,
    progress: () => undefined,
    cluster: { kubeconfig: join(controlPlaneDir(), 'admin.kubeconfig'), install: false },
    functions: 'source',
    env: FUZZ_ENV,
    onRawLine: (c, l) => logs[c as FunctionName] && tallyLine(logs[c as FunctionName], l),
  });
  const id = suffix();
  caller = await prepareCaller(admin().kc, { namespace: 'default', name: `captf-fuzz-manager-${id}`, suffix: id });
  const urls = Object.fromEntries(FUNCTION_NAMES.map((n) => [n, system!.functions[n].url]));
  targets = fuzzTargets(urls as Record<FunctionName, string>, caller.authorization);
});
after(async () => {
  await caller?.cleanup();
  await system?.stop();
  rmSync(dir, { recursive: true, force: true });
});

const target = (name: string) => targets.find((t) => t.name === name)!;

describe('hostile input (property-based)', { concurrency: true }, () => {
  for (const name of ['admission', 'mirror-sync', 'identity-status']) {
    it(`${name}: ${RUNS} generated cases, each followed by a known-good request`, async (t) => {
      const f = await fuzz(target(name), { numRuns: RUNS, ...REPLAY });
      t.diagnostic(describeFigures(f));
      assert.equal(f.failure, undefined, f.failure);
      assert.equal(f.cases, RUNS);
      assert.deepEqual(logs[name as FunctionName].errors, [], 'no error log line (a 500 logs "request failed")');
    });
  }
});

describe('regressions the fuzz found', () => {
  for (const r of REGRESSIONS) {
    it(`${r.target}: ${r.what} (${r.found})`, async () => {
      const t = target(r.target);
      const a = await send(t, r.request.request);
      assert.equal(checkAnswer(r.request, a, t.bodyLimit) ?? t.checkAnswer?.(r.request, a), undefined);
      assert.ok(a.status < 500, `HTTP ${a.status}`);
      assert.equal(t.checkKnownGood(await send(t, t.knownGood(-1)), -1), undefined);
    });
  }
});

/** JSON text of `unit` repeated in an array to just under `bytes`. */
const filled = (unit: string, bytes: number) =>
  new Raw(
    `[${Array(Math.floor((bytes - 2) / (unit.length + 1)))
      .fill(unit)
      .join(',')}]`,
    `[${unit},…] of ${bytes} bytes`,
  );

describe('bodies that would fill the heap, at the shipped heap caps (functions/lib/body-memory.ts)', () => {
  // A million empty arrays parse into about 32 MiB: more than identity-status's pod has to spare.
  for (const [name, path, type] of [
    ['admission', '/validate', 'application/json'],
    ['mirror-sync', '/', 'application/cloudevents-batch+json'],
    ['identity-status', '/', 'application/cloudevents-batch+json'],
  ] as const) {
    it(`${name}: a body of a million empty arrays is a 413 that says why, and the function goes on`, async () => {
      const t = target(name);
      const a = await send(t, {
        method: 'POST',
        path,
        headers: { 'content-type': type },
        body: filled('[]', t.bodyLimit - 1024),
      });
      assert.equal(a.status, 413, a.text);
      assert.match(a.text, /more than 100000 JSON objects and arrays/);
      assert.equal(t.checkKnownGood(await send(t, t.knownGood(-2)), -2), undefined);
    });
  }

  it('identity-status: eight bodies of the size limit at once: what does not fit the budget is a 503 to retry, the rest is judged, nothing crashes', async () => {
    const t = target('identity-status');
    const body = filled('0', t.bodyLimit - 1024).bytes;
    // All eight are in flight together whatever the machine's speed: each waits for its last
    // byte until one was refused (the budget is reserved from Content-Length, before reading).
    const held = Array.from({ length: 8 }, () => holdBody(t.url, body));
    await Promise.race([
      Promise.any(held.map((h) => h.answer.then((a) => (a.status === 503 ? a : Promise.reject(new Error()))))),
      new Promise((_, reject) => setTimeout(() => reject(new Error('no body refused within 60 s')), 60_000).unref()),
    ]);
    for (const h of held) h.finish();
    const answers = await Promise.all(held.map((h) => h.answer));
    const statuses = answers.map((a) => a.status);
    assert.ok(
      statuses.every((s) => s === 400 || s === 503),
      `statuses ${statuses.join(' ')}`,
    );
    assert.ok(statuses.includes(400) && statuses.includes(503), `some judged, some refused: ${statuses.join(' ')}`);
    for (const a of answers.filter((a) => a.status === 503)) assert.match(a.text, /send it again shortly/);
    assert.equal(t.checkKnownGood(await send(t, t.knownGood(-3)), -3), undefined);
  });
});

/**
 * A batch delivery of `body` to `url` with all but its last byte written; `finish` writes it.
 * `answer` settles with the status and text (a refused body is answered before it is complete),
 * or status 0 on a connection error.
 */
function holdBody(url: string, body: Buffer): { answer: Promise<{ status: number; text: string }>; finish(): void } {
  const req = httpRequest(new URL('/', url), {
    method: 'POST',
    agent: false,
    headers: { 'content-type': 'application/cloudevents-batch+json', 'content-length': String(body.length) },
  });
  const answer = new Promise<{ status: number; text: string }>((resolve) => {
    req.on('response', (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
      res.on('error', () => resolve({ status: res.statusCode ?? 0, text }));
    });
    req.on('error', () => resolve({ status: 0, text: '' }));
  });
  req.write(body.subarray(0, body.length - 1));
  return { answer, finish: () => req.end(body.subarray(body.length - 1)) };
}

describe('no crash', () => {
  it('every function process still runs', () => {
    assert.deepEqual(
      FUNCTION_NAMES.filter((n) => !isRunning(system!.functions[n].child)),
      [],
    );
  });

  it('admission still answers a known-good review', async () => {
    const a = await send(target('admission'), knownGoodReview('last'));
    assert.equal(a.status, 200, a.text);
  });
});
