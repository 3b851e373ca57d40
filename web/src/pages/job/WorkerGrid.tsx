// S_w on the DP rank × pipeline stage grid: which replicas and stages the slow workers sit in.
import type { RankInfo, WorkerGrid } from "../../api";
import { heatColor, scaleFor } from "../../colors";
import { ErrorBanner, Link, Section } from "../../components/ui";
import type { Loaded } from "../../data";
import { useServerInfo } from "../../serverInfo";

export function WorkerGridSection({ grid, workerHref, ranks }: { grid: Loaded<WorkerGrid>; workerHref: (rank: number) => string; ranks: RankInfo[] }) {
  return (
    <Section title="DP rank × pipeline stage (S_w)">
      <ErrorBanner error={grid.error} what="the worker grid" />
      {grid.data && <WorkerGridTable grid={grid.data} workerHref={workerHref} ranks={ranks} />}
    </Section>
  );
}

function WorkerGridTable({ grid, workerHref, ranks }: { grid: WorkerGrid; workerHref: (rank: number) => string; ranks: RankInfo[] }) {
  const attributionThreshold = useServerInfo()?.attribution_threshold;
  const scale = scaleFor("slowdown", grid.values.flat());
  if (!grid.dp_ranks.length) return <p class="muted">No attribution yet: it runs when S ≥ {attributionThreshold ?? "…"}.</p>;
  const rankOf = (dp: number, stage: number) => ranks.find((r) => r.dp_rank === dp && r.stage === stage)?.rank;
  const big = grid.dp_ranks.length * grid.stages.length > 4096;
  return (
    <div class="grid-wrap">
      <table class={`table workers-grid ${big ? "dense" : ""}`} data-testid="worker-grid">
        <thead>
          <tr>
            <th>DP \ stage</th>
            {grid.stages.map((st) => (
              <th key={st} class="num">
                {st}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {grid.dp_ranks.map((dp, i) => (
            <tr key={dp}>
              <th class="num">{dp}</th>
              {grid.stages.map((st, k) => {
                const v = grid.values[i][k];
                const [r, g, b] = v === null ? [240, 240, 240] : heatColor(scale.unit(v));
                const rank = rankOf(dp, st);
                const text = v === null ? "–" : v.toFixed(2);
                return (
                  <td key={st} class="num cell" style={{ background: `rgb(${r},${g},${b})`, color: g < 90 ? "#fff" : "#222" }} title={`DP ${dp}, stage ${st}: S_w ${text}`}>
                    {rank !== undefined ? <Link href={workerHref(rank)}>{text}</Link> : text}
                  </td>
                );
              })}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
