// A tiny bar chart of counts (incidents per day), drawn as SVG: no axes, a title per bar.
export function Sparkline({ values, label, testId }: { values: number[]; label: string; testId?: string }) {
  const width = 84;
  const height = 20;
  const most = Math.max(1, ...values);
  const step = values.length ? width / values.length : width;
  return (
    <svg class="sparkline" width={width} height={height} viewBox={`0 0 ${width} ${height}`} role="img" aria-label={label} data-testid={testId}>
      <line x1={0} y1={height - 0.5} x2={width} y2={height - 0.5} stroke="#ccc" />
      {values.map((v, i) => {
        const h = v > 0 ? Math.max(2, ((height - 2) * v) / most) : 0;
        return (
          <rect key={i} x={i * step + 1} y={height - 1 - h} width={Math.max(1, step - 2)} height={h} fill={v > 0 ? "#c0392b" : "none"} data-count={v}>
            <title>{`${v} incident${v === 1 ? "" : "s"}`}</title>
          </rect>
        );
      })}
    </svg>
  );
}
