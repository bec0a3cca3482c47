/**
 * `npm run bench -- --quick` runs in `npm test` so the benchmark never rots: every row must
 * produce its figures (with their baselines) and the result file must hold the machine's
 * facts. Nothing is asserted about speed (bench/README.md holds the figures).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { REPO_ROOT } from '../../scripts/controlplane/build.ts';

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
      const child = spawn(process.execPath, ['scripts/bench/cli.ts', '--quick', '--out', out], {
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
        'admission overhead',
        'memory',
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
      // Every figure named in the printed table.
      for (const f of doc.figures)
        assert.ok(stdout.includes(`| ${f.row} | ${f.what} |`), `${f.row} / ${f.what} missing from the table`);
    },
  );
});
