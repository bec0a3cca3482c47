/**
 * `npm run bench:compare -- A.json B.json [C.json …]`: one Markdown table of the figures the
 * result files share, each run's value beside its own same-run baseline ratio, so runs on
 * different days (or machines) are compared by ratio. Figures present in only some files are
 * shown where present. Exit 2 on a missing or malformed file.
 */
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import { formatSummary, formatValue, summarize } from './stats.ts';

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

const files = process.argv.slice(2);
if (files.length < 2) {
  process.stderr.write('usage: npm run bench:compare -- A.json B.json [C.json …]\n');
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
const key = (f: ResultFigure) => `${f.row}\u0000${f.what}`;
const order: string[] = [];
const byRun = runs.map((r) => new Map(r.doc.figures.map((f) => [key(f), f])));
for (const m of byRun) for (const k of m.keys()) if (!order.includes(k)) order.push(k);

const cell = (f: ResultFigure | undefined) => {
  if (!f?.samples.length) return '—';
  const v = formatSummary(summarize(f.samples), f.unit);
  return f.ratio === undefined ? v : `${v} (${formatValue(f.ratio, 'x')})`;
};
const lines = [
  `| row | figure | ${runs.map((r) => `${r.name}`).join(' | ')} |`,
  `| --- | --- | ${runs.map(() => '---').join(' | ')} |`,
];
for (const k of order) {
  const [row, what] = k.split('\u0000') as [string, string];
  lines.push(`| ${row} | ${what} | ${byRun.map((m) => cell(m.get(k))).join(' | ')} |`);
}
process.stdout.write(lines.join('\n') + '\n');
