/**
 * `npm run bench:compare -- A.json B.json [C.json …]`: one Markdown table of the figures the
 * result files share, each run's value beside its own same-run baseline ratio, so runs on
 * different days (or machines) are compared by ratio. Figures present in only some files are
 * shown where present.
 *
 * `npm run bench:compare -- --paths A.json`: the event rows of one run with one column per
 * delivery path (rows named `… [direct]`, `… [broker]`, `… [broker-async]`,
 * scripts/bench/paths.ts). Exit 2 on a missing or malformed file.
 */
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import { DELIVERY_PATHS, PATH_LABELS, splitPath } from './bench/paths.ts';
import { formatSummary, formatValue, summarize } from './bench/stats.ts';

interface ResultFigure {
  row: string;
  what: string;
  unit: string;
  samples: number[];
  ratio?: number;
}

interface ResultFile {
  commit: string;
  dirty: boolean;
  startedAt: string;
  figures: ResultFigure[];
}

const byPath = process.argv[2] === '--paths';
const files = process.argv.slice(byPath ? 3 : 2);
if (byPath ? files.length !== 1 : files.length < 2) {
  process.stderr.write(
    'usage: npm run bench:compare -- A.json B.json [C.json …]\n       npm run bench:compare -- --paths A.json\n',
  );
  process.exit(2);
}
const runs = files.map((f) => {
  try {
    return { name: basename(f, '.json'), doc: JSON.parse(readFileSync(f, 'utf8')) as ResultFile };
  } catch (err) {
    process.stderr.write(`${f}: ${(err as Error).message}\n`);
    process.exit(2);
  }
});

const cell = (f: ResultFigure | undefined) => {
  if (!f?.samples.length) return '—';
  const v = formatSummary(summarize(f.samples), f.unit);
  return f.ratio === undefined ? v : `${v} (${formatValue(f.ratio, 'x')})`;
};

/** Columns: one per run, or one per delivery path of the one run. */
function columns(): { titles: string[]; figures: Map<string, ResultFigure>[] } {
  if (!byPath) {
    const key = (f: ResultFigure) => `${f.row}\u0000${f.what}`;
    return {
      titles: runs.map((r) => r.name),
      figures: runs.map((r) => new Map(r.doc.figures.map((f) => [key(f), f]))),
    };
  }
  const figures = DELIVERY_PATHS.map(() => new Map<string, ResultFigure>());
  for (const f of runs[0]!.doc.figures) {
    const { base, path } = splitPath(f.row);
    if (path) figures[DELIVERY_PATHS.indexOf(path)]!.set(`${base}\u0000${f.what}`, f);
  }
  return { titles: DELIVERY_PATHS.map((p) => PATH_LABELS[p]), figures };
}

const { titles, figures } = columns();
// Keys in the order the files list them (a Map keeps insertion order; the first run first).
const order = [...new Set(figures.flatMap((m) => [...m.keys()]))];
if (byPath) {
  const pos = new Map<string, number>();
  for (const [i, f] of runs[0]!.doc.figures.entries()) {
    const k = `${splitPath(f.row).base}\u0000${f.what}`;
    if (!pos.has(k)) pos.set(k, i);
  }
  order.sort((a, b) => pos.get(a)! - pos.get(b)!);
}
const lines = [`| row | figure | ${titles.join(' | ')} |`, `| --- | --- | ${titles.map(() => '---').join(' | ')} |`];
for (const k of order) {
  const [row, what] = k.split('\u0000') as [string, string];
  lines.push(`| ${row} | ${what} | ${figures.map((m) => cell(m.get(k))).join(' | ')} |`);
}
process.stdout.write(lines.join('\n') + '\n');
