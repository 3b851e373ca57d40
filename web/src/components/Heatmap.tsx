// The rank × step heatmap, drawn on a canvas: 4,096 ranks × 500 steps arrive binned to the
// canvas's pixels by the API (each cell the max of its bin), and one ImageData write draws them.
import { useEffect, useMemo, useRef, useState } from "preact/hooks";

import type { HeatGrid as HeatmapData, RankInfo } from "../api";
import { heatColor, NULL_COLOR, scaleFor, type Scale } from "../colors";

export interface Row {
  index: number; // row of the response
  first: number; // first rank of the row's bin
  last: number;
  host: string;
}

interface Props {
  data: HeatmapData;
  ranks: Map<number, RankInfo>;
  groupByHost: boolean;
  format: (v: number) => string;
  onRow: (row: Row) => void;
  onSteps: (from: number, to: number) => void;
  height: number;
}

const LEFT = 120;
const BOTTOM = 22;
const TOP = 4;

function rowsOf(data: HeatmapData, ranks: Map<number, RankInfo>, groupByHost: boolean): Row[] {
  const rows = data.ranks.map((rank, index) => {
    const range = data.rank_ranges?.[index] ?? [rank, rank];
    const firstHost = ranks.get(range[0])?.host ?? "";
    const lastHost = ranks.get(range[1])?.host ?? firstHost;
    const host = firstHost === lastHost ? firstHost : `${firstHost}…${lastHost}`;
    return { index, first: range[0], last: range[1], host };
  });
  if (groupByHost) {
    rows.sort((a, b) => (a.host < b.host ? -1 : a.host > b.host ? 1 : a.first - b.first));
  }
  return rows;
}

export function Heatmap({ data, ranks, groupByHost, format, onRow, onSteps, height }: Props) {
  const canvas = useRef<HTMLCanvasElement>(null);
  const [width, setWidth] = useState(900);
  const [hover, setHover] = useState<{ x: number; y: number; text: string[] } | null>(null);
  const drag = useRef<{ x: number } | null>(null);
  const [band, setBand] = useState<{ a: number; b: number } | null>(null);
  const rows = useMemo(() => rowsOf(data, ranks, groupByHost), [data, ranks, groupByHost]);
  const scale: Scale = useMemo(() => scaleFor(data.metric, data.cells), [data]);

  useEffect(() => {
    const element = canvas.current?.parentElement;
    if (!element) return undefined;
    const observer = new ResizeObserver(() => setWidth(Math.max(300, element.clientWidth)));
    observer.observe(element);
    setWidth(Math.max(300, element.clientWidth));
    return () => observer.disconnect();
  }, []);

  const plot = { x: LEFT, y: TOP, w: width - LEFT - 8, h: height - TOP - BOTTOM };

  useEffect(() => {
    const c = canvas.current;
    if (!c) return;
    const ratio = window.devicePixelRatio || 1;
    c.width = Math.round(width * ratio);
    c.height = Math.round(height * ratio);
    c.style.width = `${width}px`;
    c.style.height = `${height}px`;
    const ctx = c.getContext("2d");
    if (!ctx) return;
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const nRows = rows.length;
    const nCols = data.steps.length;
    if (nRows && nCols) {
      // One pixel per cell, then scaled up without smoothing: crisp cells at any size.
      const cells = new ImageData(nCols, nRows);
      const px = cells.data;
      for (let r = 0; r < nRows; r++) {
        const base = rows[r].index * nCols;
        for (let s = 0; s < nCols; s++) {
          const v = data.cells[base + s];
          const [red, green, blue] = Number.isNaN(v) ? NULL_COLOR : heatColor(scale.unit(v));
          const o = (r * nCols + s) * 4;
          px[o] = red;
          px[o + 1] = green;
          px[o + 2] = blue;
          px[o + 3] = 255;
        }
      }
      const off = document.createElement("canvas");
      off.width = nCols;
      off.height = nRows;
      off.getContext("2d")?.putImageData(cells, 0, 0);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(off, plot.x, plot.y, plot.w, plot.h);
    }
    // Labels: hosts (grouped) or ranks down the side, steps along the bottom. Canvas text is
    // never parsed as markup, so agent-sent host names are safe here.
    ctx.fillStyle = "#444";
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    const rowH = plot.h / Math.max(1, nRows);
    const every = Math.max(1, Math.ceil(14 / rowH));
    let lastHost: string | null = null;
    for (let r = 0; r < nRows; r++) {
      const y = plot.y + (r + 0.5) * rowH;
      if (groupByHost && rows[r].host !== lastHost) {
        lastHost = rows[r].host;
        ctx.strokeStyle = "#fff";
        ctx.lineWidth = 1;
        ctx.beginPath();
        ctx.moveTo(plot.x, plot.y + r * rowH);
        ctx.lineTo(plot.x + plot.w, plot.y + r * rowH);
        ctx.stroke();
        ctx.textAlign = "left";
        ctx.fillText(truncate(rows[r].host, 12), 4, Math.min(y, plot.y + plot.h - 6));
      }
      if (r % every === 0) {
        const label = rows[r].first === rows[r].last ? `${rows[r].first}` : `${rows[r].first}–${rows[r].last}`;
        ctx.textAlign = "right";
        ctx.fillText(label, plot.x - 6, y);
      }
    }
    ctx.textAlign = "left";
    ctx.textBaseline = "alphabetic";
    const colW = plot.w / Math.max(1, nCols);
    const tickEvery = Math.max(1, Math.ceil(70 / colW));
    for (let s = 0; s < nCols; s += tickEvery) {
      ctx.fillText(String(data.steps[s]), plot.x + s * colW, height - 6);
    }
    c.dataset.rows = JSON.stringify(rows.map((r) => r.first));
    c.dataset.plot = JSON.stringify(plot);
    c.dataset.metric = data.metric;
    c.dataset.steps = nCols ? `${data.step_ranges?.[0]?.[0] ?? data.steps[0]},${data.step_ranges?.[nCols - 1]?.[1] ?? data.steps[nCols - 1]}` : "";
    performance.clearMarks("smon:heatmap-drawn"); // one per draw would pile up over a day of refreshes
    performance.mark("smon:heatmap-drawn", { detail: { rows: nRows, cols: nCols } });
  }, [data, rows, scale, width, height, groupByHost]);

  function cellAt(event: MouseEvent): { row: Row; col: number; x: number; y: number } | null {
    const rect = (event.currentTarget as HTMLCanvasElement).getBoundingClientRect();
    const x = event.clientX - rect.left;
    const y = event.clientY - rect.top;
    if (x < plot.x || x >= plot.x + plot.w || y < plot.y || y >= plot.y + plot.h) return null;
    const r = Math.floor(((y - plot.y) / plot.h) * rows.length);
    const col = Math.floor(((x - plot.x) / plot.w) * data.steps.length);
    const row = rows[r];
    return row ? { row, col, x, y } : null;
  }

  function stepRange(col: number): [number, number] {
    const range = data.step_ranges?.[col];
    return range ? [range[0], range[1]] : [data.steps[col], data.steps[col]];
  }

  function onMove(event: MouseEvent) {
    const cell = cellAt(event);
    if (drag.current && cell) setBand({ a: drag.current.x, b: cell.x });
    if (!cell) {
      setHover(null);
      return;
    }
    const v = data.cells[cell.row.index * data.steps.length + cell.col];
    const [s0, s1] = stepRange(cell.col);
    const rankText = cell.row.first === cell.row.last ? `rank ${cell.row.first}` : `ranks ${cell.row.first}–${cell.row.last}`;
    setHover({
      x: cell.x,
      y: cell.y,
      text: [
        `${rankText}${cell.row.host ? ` · ${cell.row.host}` : ""}`,
        s0 === s1 ? `step ${s0}` : `steps ${s0}–${s1}`,
        Number.isNaN(v) ? "no data" : `${data.downsampled ? "max " : ""}${format(v)}`,
      ],
    });
  }

  function onDown(event: MouseEvent) {
    const cell = cellAt(event);
    drag.current = cell ? { x: cell.x } : null;
  }

  function onUp(event: MouseEvent) {
    const start = drag.current;
    drag.current = null;
    setBand(null);
    const cell = cellAt(event);
    if (!start || !cell) return;
    if (Math.abs(cell.x - start.x) > 6) {
      const colOf = (x: number) =>
        Math.min(data.steps.length - 1, Math.max(0, Math.floor(((x - plot.x) / plot.w) * data.steps.length)));
      const a = colOf(Math.min(start.x, cell.x));
      const b = colOf(Math.max(start.x, cell.x));
      onSteps(stepRange(a)[0], stepRange(b)[1]);
    } else {
      onRow(cell.row);
    }
  }

  return (
    <div class="heatmap">
      <canvas
        ref={canvas}
        data-testid="heatmap-canvas"
        onMouseMove={onMove}
        onMouseLeave={() => {
          setHover(null);
          drag.current = null;
          setBand(null);
        }}
        onMouseDown={onDown}
        onMouseUp={onUp}
      />
      {band && (
        <div
          class="heatmap-band"
          style={{ left: `${Math.min(band.a, band.b)}px`, width: `${Math.abs(band.b - band.a)}px`, top: `${plot.y}px`, height: `${plot.h}px` }}
        />
      )}
      {hover && (
        <div class="tooltip" style={{ left: `${Math.min(hover.x + 14, width - 220)}px`, top: `${hover.y + 14}px` }}>
          {hover.text.map((line) => (
            <div key={line}>{line}</div>
          ))}
        </div>
      )}
      <Legend scale={scale} format={format} />
    </div>
  );
}

function truncate(text: string, n: number): string {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

export function Legend({ scale, format }: { scale: Scale; format: (v: number) => string }) {
  const stops = Array.from({ length: 11 }, (_, i) => {
    const [r, g, b] = heatColor(i / 10);
    return `rgb(${r},${g},${b}) ${i * 10}%`;
  });
  return (
    <div class="legend">
      <span>{format(scale.lo)}</span>
      <span class="legend-bar" style={{ background: `linear-gradient(to right, ${stops.join(", ")})` }} />
      <span>{format(scale.hi)}</span>
      <span class="legend-null">
        <span class="swatch" style={{ background: `rgb(${NULL_COLOR.join(",")})` }} /> no data
      </span>
    </div>
  );
}
