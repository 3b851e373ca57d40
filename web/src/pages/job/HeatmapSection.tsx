// The rank × step heatmap of any metric: the URL holds the view (metric, steps, ranks, grouping).
import { useEffect, useMemo, useState } from "preact/hooks";

import { decodeHeatmap, type Heatmap as HeatmapData, jobPath, type RankInfo, request } from "../../api";
import { Heatmap, type Row } from "../../components/Heatmap";
import { ErrorBanner, Loading, Section } from "../../components/ui";
import { usePoll } from "../../data";
import * as fmt from "../../format";
import { intParam, navigate, withQuery } from "../../router";

const BASE_METRICS = ["slowdown", "step_time", "data_wait", "forward", "backward", "grad_sync", "optimizer", "other", "gc", "checkpoint"];

export function HeatmapSection({
  jobId,
  attempt,
  workerHref,
  search,
  ranks,
  phases,
  every,
  onSettled,
}: {
  jobId: string;
  attempt: number | null;
  workerHref: (rank: number) => string;
  search: URLSearchParams;
  ranks: RankInfo[];
  phases: string[];
  every: number;
  onSettled: () => void;
}) {
  const metric = search.get("metric") ?? "slowdown";
  const fromStep = intParam(search, "from_step");
  const toStep = intParam(search, "to_step");
  const fromRank = intParam(search, "from_rank");
  const toRank = intParam(search, "to_rank");
  const byHost = search.get("group") === "host";
  const [height] = useState(() => Math.min(560, Math.max(260, Math.round(window.innerHeight * 0.5))));
  const rankMap = useMemo(() => new Map(ranks.map((r) => [r.rank, r])), [ranks]);
  const metrics = useMemo(() => Array.from(new Set([...BASE_METRICS, ...phases, metric])), [phases, metric]);
  const key = `${jobId}|${attempt}|${metric}|${fromStep}|${toStep}|${fromRank}|${toRank}`;
  const heat = usePoll(
    () =>
      request<HeatmapData>(`${jobPath(jobId)}/heatmap`, {
        attempt,
        metric,
        from_step: fromStep,
        to_step: toStep,
        from_rank: fromRank,
        to_rank: toRank,
        max_ranks: Math.min(512, height - 26),
        max_steps: Math.min(1000, Math.max(100, window.innerWidth - 200)),
        encoding: "f32",
      }).then(decodeHeatmap),
    key,
    every,
  );
  useEffect(() => {
    if (heat.data || heat.error) onSettled();
  }, [heat.data, heat.error]);
  const format = metric === "slowdown" ? (v: number) => `${v.toFixed(3)}×` : fmt.seconds;
  const zoomed = fromRank !== null || toRank !== null;
  const onRow = (row: Row) => {
    if (row.first === row.last) navigate(workerHref(row.first));
    else navigate(withQuery({ from_rank: row.first, to_rank: row.last }));
  };
  const empty = heat.data && heat.data.cells.every((v) => Number.isNaN(v));
  return (
    <Section
      title="Rank × step heatmap"
      id="heatmap"
      actions={
        <div class="heatmap-controls">
          <label>
            metric{" "}
            <select data-testid="metric" value={metric} onChange={(e) => navigate(withQuery({ metric: (e.target as HTMLSelectElement).value === "slowdown" ? null : (e.target as HTMLSelectElement).value }))}>
              {metrics.map((m) => (
                <option key={m} value={m}>
                  {m === "slowdown" ? "slowdown S_w" : m === "step_time" ? "step time" : m === "other" ? "host work (untimed)" : m === "gc" ? "GC pauses" : m.replace(/_/g, " ")}
                </option>
              ))}
            </select>
          </label>
          <label class="check">
            <input type="checkbox" data-testid="group-host" checked={byHost} onChange={(e) => navigate(withQuery({ group: (e.target as HTMLInputElement).checked ? "host" : null }), true)} />
            group by host
          </label>
          {zoomed && (
            <button type="button" onClick={() => navigate(withQuery({ from_rank: null, to_rank: null }))}>
              All ranks
            </button>
          )}
        </div>
      }
    >
      <ErrorBanner error={heat.error} what="the heatmap" />
      {!heat.data && !heat.error && <Loading what="the heatmap" />}
      {heat.data && empty && <p class="muted">No {metric.replace(/_/g, " ")} values in these steps: the agents did not report this phase.</p>}
      {heat.data && !empty && (
        <>
          <Heatmap data={heat.data} ranks={rankMap} groupByHost={byHost} format={format} height={height} onRow={onRow} onSteps={(a, b) => navigate(withQuery({ from_step: a, to_step: b, analyse: null }))} />
          <p class="muted small">
            {heat.data.ranks.length} rows × {heat.data.steps.length} steps
            {heat.data.downsampled && " (binned: each cell is the worst of its bin; click a row to zoom into its ranks)"}. Click a rank's row for its
            worker page; drag across steps to zoom.
          </p>
        </>
      )}
    </Section>
  );
}
