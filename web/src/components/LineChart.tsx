// Time series with uPlot: small, fast, canvas-drawn; drag across it to pick a range.
import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";

export interface Series {
  label: string;
  values: (number | null)[];
  color: string;
  scale?: string; // "y" (left axis) unless named; a second name gets the right axis
  dash?: number[];
  points?: boolean;
}

interface Props {
  x: number[];
  series: Series[];
  time?: boolean; // x in unix seconds
  xLabel?: string;
  yLabel?: string;
  y2Label?: string;
  format?: (v: number) => string;
  format2?: (v: number) => string;
  height?: number;
  syncKey?: string;
  xRange?: [number, number]; // fixed x extent (charts that share one axis)
  onSelect?: (from: number, to: number) => void;
  testId?: string;
}

export function LineChart(props: Props) {
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const latest = useRef(props);
  latest.current = props;
  const { x, series, time = false, height = 220 } = props;
  const shape = `${time}|${props.xRange?.join("-") ?? ""}|${series.map((s) => `${s.label}:${s.scale ?? "y"}`).join(",")}`;

  useEffect(() => {
    const element = host.current;
    if (!element) return undefined;
    const p = latest.current;
    const scales = Array.from(new Set(series.map((s) => s.scale ?? "y")));
    const axes: uPlot.Axis[] = [
      { label: p.xLabel, stroke: "#555", grid: { stroke: "#eee" } },
      ...scales.map(
        (scale, i): uPlot.Axis => ({
          scale,
          label: i === 0 ? p.yLabel : p.y2Label,
          side: i === 0 ? 3 : 1,
          stroke: "#555",
          grid: { show: i === 0, stroke: "#eee" },
          size: 78,
          values: (_u, splits) => splits.map((v) => ((i === 0 ? p.format : p.format2) ?? String)(v)),
        }),
      ),
    ];
    const options: uPlot.Options = {
      width: Math.max(300, element.clientWidth),
      height,
      scales: { x: p.xRange ? { time, range: () => p.xRange as [number, number] } : { time } },
      axes,
      legend: { live: true },
      cursor: {
        drag: { x: true, y: false, setScale: false },
        sync: p.syncKey ? { key: p.syncKey } : undefined,
      },
      series: [
        { label: time ? "time" : (p.xLabel ?? "x") },
        ...series.map(
          (s): uPlot.Series => ({
            label: s.label,
            scale: s.scale ?? "y",
            stroke: s.color,
            width: 1.5,
            dash: s.dash,
            points: { show: s.points ?? false, size: 4 },
            spanGaps: false,
            value: (_u, v) => (v === null || v === undefined ? "–" : ((s.scale && s.scale !== scales[0] ? p.format2 : p.format) ?? String)(v)),
          }),
        ),
      ],
      hooks: {
        setSelect: [
          (u) => {
            const handler = latest.current.onSelect;
            if (!handler || u.select.width < 4) return;
            const from = u.posToVal(u.select.left, "x");
            const to = u.posToVal(u.select.left + u.select.width, "x");
            u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
            handler(from, to);
          },
        ],
      },
    };
    const data = [x, ...series.map((s) => s.values)] as uPlot.AlignedData;
    const chart = new uPlot(options, data, element);
    plot.current = chart;
    const observer = new ResizeObserver(() => chart.setSize({ width: Math.max(300, element.clientWidth), height }));
    observer.observe(element);
    return () => {
      observer.disconnect();
      chart.destroy();
      plot.current = null;
    };
    // Rebuilt only when the series' shape changes; new data goes through setData below.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [shape, height]);

  useEffect(() => {
    plot.current?.setData([x, ...series.map((s) => s.values)] as uPlot.AlignedData);
  }, [x, series]);

  return <div class="chart" ref={host} data-testid={props.testId} data-points={x.length} />;
}
