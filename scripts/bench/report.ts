/**
 * The bench's results: figures with their raw samples and baselines, the printed table, and
 * the JSON file `bench/results/<date>-<short sha>.json` that later runs are compared with.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { DELIVERY_PATHS, splitPath } from './paths.ts';
import { formatSummary, formatValue, summarize } from './stats.ts';

/** Every row of `npm run bench`, in the order they run (`--rows` takes these names). */
export const ROWS = [
  'cold-start',
  'resync',
  'event-to-mirror',
  'fan-in',
  'revocation',
  'identity-grant',
  'admission',
  'prepare',
  'telemetry',
  'pods',
  'serving',
] as const;
/**
 * The rows that run once per delivery path (fan-in also makes the spread and concurrent fan-in
 * rows; identity-grant the identity grant and identity revoke rows).
 */
export const EVENT_ROWS = ['event-to-mirror', 'fan-in', 'revocation', 'identity-grant'] as const;
/** The rows the event rows make, by name prefix, in the order the table shows them. */
const EVENT_ROW_KINDS = [
  'event → mirror',
  'fan-in',
  'spread',
  'concurrent fan-in',
  'revocation',
  'identity grant',
  'identity revoke',
];
/** One of {@link EVENT_ROWS}. */
export type EventRow = (typeof EVENT_ROWS)[number];

/** One measured figure of a row, with its raw samples and (when it has one) its baseline. */
export interface Figure {
  /** Row and size, e.g. `fan-in N=200`. */
  row: string;
  /** What was measured, e.g. `time until all mirrored`. */
  what: string;
  unit: 'ms' | 'count' | 'bytes';
  samples: number[];
  /** The floor measured in the same run, in the same unit. */
  baseline?: { what: string; samples: number[] };
}

/** Everything one run produced: the figures, and the rows that could not produce theirs (the bench went on). */
export interface BenchResults {
  figures: Figure[];
  failures: { row: string; error: string }[];
}

/** Median of samples / median of baseline, or undefined without a usable baseline. */
export function ratio(f: Figure): number | undefined {
  if (!f.baseline?.samples.length || !f.samples.length) return undefined;
  const b = summarize(f.baseline.samples).median;
  return b > 0 ? summarize(f.samples).median / b : undefined;
}

/**
 * Figures measured path after path, reordered so that each row's paths stand together
 * (`fan-in N=200 [direct]`, `… [broker]`, `… [broker-async]`): event → mirror, fan-in,
 * spread, concurrent fan-in, revocation, each kind's rows in the order they first appeared,
 * each row's figures in their own order.
 */
export function groupByRow(figures: readonly Figure[]): Figure[] {
  const firstSeen = new Map<string, number>();
  for (const [i, f] of figures.entries()) {
    const { base } = splitPath(f.row);
    if (!firstSeen.has(base)) firstSeen.set(base, i);
  }
  const kind = (base: string) => {
    const k = EVENT_ROW_KINDS.findIndex((p) => base.startsWith(p));
    return k < 0 ? EVENT_ROW_KINDS.length : k;
  };
  const key = (f: Figure, i: number) => {
    const { base, path } = splitPath(f.row);
    return [kind(base), firstSeen.get(base)!, path ? DELIVERY_PATHS.indexOf(path) : 0, i];
  };
  const compare = (a: number[], b: number[]) => a.reduce((d, x, j) => d || x - b[j]!, 0);
  return figures
    .map((f, i) => ({ f, k: key(f, i) }))
    .sort((a, b) => compare(a.k, b.k))
    .map(({ f }) => f);
}

/** The table as Markdown (it is printed, and pasted into bench/README.md). */
export function formatTable(results: BenchResults): string {
  const lines = ['| row | figure | value | baseline (same run) | ratio |', '| --- | --- | --- | --- | --- |'];
  for (const f of results.figures) {
    const value = f.samples.length ? formatSummary(summarize(f.samples), f.unit) : '—';
    const base = f.baseline?.samples.length
      ? `${f.baseline.what}: ${formatSummary(summarize(f.baseline.samples), f.unit)}`
      : '';
    const r = ratio(f);
    lines.push(`| ${f.row} | ${f.what} | ${value} | ${base} | ${r === undefined ? '' : formatValue(r, 'x')} |`);
  }
  for (const x of results.failures)
    lines.push(`| ${x.row} | FAILED | ${x.error.replace(/\|/g, '/').split('\n')[0]} | | |`);
  return lines.join('\n');
}

function git(args: string[]): string {
  try {
    return execFileSync('git', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return 'unknown';
  }
}

/** The commit being measured, read when the run starts (before the bundles are built). */
export interface Revision {
  commit: string;
  short: string;
  /** Tracked files differed from the commit: the figures are of uncommitted code. */
  dirty: boolean;
}

/** The working tree's commit and whether tracked files differ from it. */
export function currentRevision(): Revision {
  return {
    commit: git(['rev-parse', 'HEAD']),
    short: git(['rev-parse', '--short', 'HEAD']),
    dirty: git(['status', '--porcelain', '--untracked-files=no']) !== '',
  };
}

/**
 * Writes the results with the machine's facts to `<dir>/<YYYY-MM-DD>-<short sha>[-dirty][-quick].json`.
 * @returns the path written.
 */
export function writeResults(
  dir: string,
  results: BenchResults,
  run: {
    quick: boolean;
    startedAt: Date;
    durationMs: number;
    options: unknown;
    baselineVersion: number;
    revision: Revision;
  },
): string {
  mkdirSync(dir, { recursive: true });
  const { commit, short, dirty } = run.revision;
  const path = join(
    dir,
    `${run.startedAt.toISOString().slice(0, 10)}-${short}${dirty ? '-dirty' : ''}${run.quick ? '-quick' : ''}.json`,
  );
  const doc = {
    startedAt: run.startedAt.toISOString(),
    durationMs: Math.round(run.durationMs),
    commit,
    dirty,
    quick: run.quick,
    options: run.options,
    baselineVersion: run.baselineVersion,
    machine: {
      cores: cpus().length,
      cpu: cpus()[0]?.model ?? '',
      memoryBytes: totalmem(),
      node: process.version,
      platform: `${process.platform} ${process.arch}`,
    },
    figures: results.figures.map((f) => ({
      ...f,
      summary: f.samples.length ? summarize(f.samples) : undefined,
      ratio: ratio(f),
    })),
    failures: results.failures,
  };
  writeFileSync(path, JSON.stringify(doc, null, 2) + '\n');
  return path;
}
