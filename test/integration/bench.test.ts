/**
 * `npm run bench -- --quick` runs in `npm test` so the benchmark never rots: every row must
 * produce its figures (with their baselines), the event rows on each delivery path (the
 * adapter straight to the function, and Knative's real Broker with the default and the
 * async-handler channel), and the result file must hold the machine's facts. Nothing is
 * asserted about speed (bench/README.md holds the figures).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { REPO_ROOT } from '../../scripts/tools/build.ts';

interface ResultFile {
  commit: string;
  quick: boolean;
  baselineVersion: number;
  machine: { cores: number; memoryBytes: number; node: string };
  figures: { row: string; what: string; samples: number[]; baseline?: { samples: number[] }; ratio?: number }[];
  failures: { row: string; error: string }[];
}

const out = mkdtempSync(join(tmpdir(), 'captf-bench-'));
after(() => rmSync(out, { recursive: true, force: true }));

describe('npm run bench -- --quick', () => {
  it(
    'runs every row on its own control plane and writes every figure beside its baseline',
    { timeout: 600_000 },
    async () => {
      const child = spawn(process.execPath, ['scripts/bench.ts', '--quick', '--out', out], {
        cwd: REPO_ROOT,
        stdio: ['ignore', 'pipe', 'pipe'],
        detached: true,
      });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
      child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      const timer = setTimeout(() => process.kill(-child.pid!, 'SIGKILL'), 540_000);
      const code = await new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
      clearTimeout(timer);
      assert.equal(code, 0, `bench exited ${code}:\n${stderr.slice(-4000)}`);

      const files = readdirSync(out).filter((f) => /^\d{4}-\d\d-\d\d-[0-9a-f]+(-dirty)?-quick\.json$/.test(f));
      assert.equal(files.length, 1, files.join(' '));
      const doc = JSON.parse(readFileSync(join(out, files[0]!), 'utf8')) as ResultFile;
      assert.match(doc.commit, /^[0-9a-f]{40}$|^unknown$/);
      assert.ok(
        doc.quick &&
          doc.baselineVersion >= 1 &&
          doc.machine.cores >= 1 &&
          doc.machine.memoryBytes > 0 &&
          doc.machine.node.startsWith('v'),
      );
      assert.deepEqual(doc.failures, []);

      for (const prefix of [
        'cold start',
        'resync, ',
        'event → mirror',
        'fan-in N=',
        'spread N=',
        'concurrent fan-in',
        'revocation',
        'identity grant N=',
        'identity revoke N=',
        'admission overhead',
        'prepare, ',
        'memory',
        'node footprint',
      ]) {
        const rows = doc.figures.filter((f) => f.row.startsWith(prefix));
        assert.ok(rows.length > 0, `no figure for row ${prefix}`);
        for (const f of rows) {
          assert.ok(
            f.samples.length > 0 && f.samples.every(Number.isFinite),
            `${f.row} / ${f.what}: ${JSON.stringify(f.samples)}`,
          );
          if (f.baseline)
            assert.ok(
              f.baseline.samples.length > 0 && f.baseline.samples.every(Number.isFinite),
              `${f.row} / ${f.what} baseline`,
            );
        }
        assert.ok(
          rows.some((f) => typeof f.ratio === 'number' && f.ratio > 0),
          `row ${prefix} has no figure with a ratio to its baseline`,
        );
      }
      // prepare (SPEC §5): without the cache every call makes a TokenReview and a SAR; with it, fewer.
      const reviews = (label: string) =>
        doc.figures.find((f) => f.row.startsWith('prepare, ') && f.what === `of them TokenReviews + SARs, ${label}`)!;
      const uncached = reviews('not cached');
      assert.deepEqual(uncached.samples, [2 * uncached.baseline!.samples[0]!], 'two reviews per uncached call');
      assert.ok(reviews('cached').samples[0]! < uncached.samples[0]!, 'the cache saves reviews');
      // The event rows ran on every delivery path (scripts/bench/paths.ts), the concurrent
      // fan-in row on the async-handler Broker; no event was retried or dead-lettered.
      const paths = ['direct', 'broker', 'broker-async'];
      for (const prefix of ['event → mirror', 'fan-in N=', 'spread N=', 'revocation', 'identity grant N='])
        for (const path of paths)
          assert.ok(
            doc.figures.some((f) => f.row.startsWith(prefix) && f.row.endsWith(` [${path}]`)),
            `no figure for row ${prefix} on path ${path}`,
          );
      assert.ok(doc.figures.some((f) => f.row.startsWith('concurrent fan-in') && f.row.endsWith(' [broker-async]')));
      for (const f of doc.figures.filter((x) => x.what === 'dead letters'))
        assert.deepEqual(f.samples, [0], `${f.row}: dead letters`);
      // SPEC §12: the echo of our own status write is recognised with one read, on every path.
      const echoes = doc.figures.filter((x) => x.what === 'API requests per echo of our status write');
      assert.equal(echoes.length, paths.length);
      for (const f of echoes) assert.deepEqual(f.samples, [1], `${f.row}: requests per echo`);
      // Each function also cold-started as a pod from the image, its container's memory beside its limit.
      for (const fn of ['admission', 'mirror-sync', 'identity-status']) {
        assert.ok(
          doc.figures.some((f) => f.what === `${fn}: pod from the image, create → Ready → first answer`),
          fn,
        );
        assert.ok(
          doc.figures.some((f) => f.what === `${fn} container peak (cgroup) after its first answer`),
          fn,
        );
      }
      // Every figure named in the printed table.
      for (const f of doc.figures)
        assert.ok(stdout.includes(`| ${f.row} | ${f.what} |`), `${f.row} / ${f.what} missing from the table`);
    },
  );
});
