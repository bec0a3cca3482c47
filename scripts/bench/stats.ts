/**
 * Summaries of raw samples for the bench table: median and p99 when there are enough samples
 * (≥ 20), else min / median / max; ratios of a figure to its baseline.
 */

/** A summary of samples (same unit as the samples). */
export interface Summary {
  n: number;
  min: number;
  median: number;
  max: number;
  /** Nearest-rank 99th percentile; only meaningful for n ≥ 20. */
  p99: number;
}

/** Nearest-rank percentile `p` (0–100) of sorted values. */
function percentile(sorted: readonly number[], p: number): number {
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[rank - 1]!;
}

/**
 * Summarises samples.
 * @throws Error when there are none (a row that produced no figure is a bench failure).
 */
export function summarize(samples: readonly number[]): Summary {
  if (samples.length === 0) throw new Error('no samples');
  const s = [...samples].sort((a, b) => a - b);
  return { n: s.length, min: s[0]!, median: percentile(s, 50), max: s[s.length - 1]!, p99: percentile(s, 99) };
}

/** Samples at which a summary shows p99 instead of min/max. */
export const P99_FROM = 20;

/** Formats a value in a unit for the table. */
export function formatValue(v: number, unit: string): string {
  if (unit === 'ms')
    return v >= 10_000
      ? `${(v / 1000).toFixed(1)} s`
      : v >= 1000
        ? `${(v / 1000).toFixed(2)} s`
        : `${v.toFixed(v < 10 ? 1 : 0)} ms`;
  if (unit === 'bytes')
    return v >= 1 << 20
      ? `${(v / (1 << 20)).toFixed(1)} MiB`
      : v >= 1024
        ? `${(v / 1024).toFixed(1)} KiB`
        : `${Math.round(v)} B`;
  if (unit === 'x') return `${v.toFixed(2)}×`;
  return Number.isInteger(v) ? String(v) : v.toFixed(2);
}

/** "median (p99 x)" or "min / median / max" or a single value. */
export function formatSummary(s: Summary, unit: string): string {
  if (s.n === 1) return formatValue(s.median, unit);
  if (s.n >= P99_FROM) return `${formatValue(s.median, unit)} (p99 ${formatValue(s.p99, unit)})`;
  return `${formatValue(s.min, unit)} / ${formatValue(s.median, unit)} / ${formatValue(s.max, unit)}`;
}
