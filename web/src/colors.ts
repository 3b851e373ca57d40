// Colour scales. Sequential yellow → red (ColorBrewer YlOrRd): hot means slow, and the green
// channel falls monotonically with the value, which keeps the scale readable in greyscale too.

const YL_OR_RD: [number, number, number][] = [
  [255, 255, 204],
  [255, 237, 160],
  [254, 217, 118],
  [254, 178, 76],
  [253, 141, 60],
  [252, 78, 42],
  [227, 26, 28],
  [189, 0, 38],
  [128, 0, 38],
];

export const NULL_COLOR: [number, number, number] = [228, 230, 235];

/** Colour of a value already mapped to 0..1. */
export function heatColor(t: number): [number, number, number] {
  const x = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (YL_OR_RD.length - 1);
  const i = Math.min(YL_OR_RD.length - 2, Math.floor(x));
  const f = x - i;
  const a = YL_OR_RD[i];
  const b = YL_OR_RD[i + 1];
  return [
    Math.round(a[0] + (b[0] - a[0]) * f),
    Math.round(a[1] + (b[1] - a[1]) * f),
    Math.round(a[2] + (b[2] - a[2]) * f),
  ];
}

export interface Scale {
  lo: number;
  hi: number;
  unit: (v: number) => number;
}

function quantile(sorted: ArrayLike<number>, q: number): number {
  if (!sorted.length) return 0;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.round(q * (sorted.length - 1))));
  return sorted[i];
}

/**
 * The value range a metric is coloured over. Slowdown starts at 1 (no slowdown is the coolest
 * colour, whatever the job) and reaches at least 1.2, so a healthy job looks calm instead of
 * stretching its noise over the whole palette. Times span their 1st–99th percentile, so one
 * outlier does not wash the rest out.
 */
export function scaleFor(metric: string, values: Iterable<number | null>): Scale {
  const finite: number[] = [];
  for (const v of values) if (v !== null && Number.isFinite(v)) finite.push(v);
  const all = Float64Array.from(finite).sort();
  let lo: number;
  let hi: number;
  if (metric === "slowdown") {
    lo = 1;
    hi = Math.max(1.2, quantile(all, 0.995));
  } else {
    lo = quantile(all, 0.01);
    hi = quantile(all, 0.99);
    if (hi <= lo) hi = lo + (Math.abs(lo) || 1) * 0.1;
  }
  return { lo, hi, unit: (v: number) => (v - lo) / (hi - lo) };
}
