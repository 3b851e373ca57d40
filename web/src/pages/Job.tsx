// `/jobs/{id}`: is this job straggling, since when, where and why, and what to do about it.
import { useEffect, useMemo, useState } from "preact/hooks";

import {
  hostPath,
  type Alert,
  type Attempt,
  type Heatmap as HeatmapData,
  decodeHeatmap,
  type Info,
  gpuHours,
  type JobsPage,
  type RankInfo,
  type Run,
  type StepPoint,
  type Summary,
  type TrendPoint,
  type WorkerGrid,
  jobPath,
  request,
} from "../api";
import { heatColor, scaleFor } from "../colors";
import { Heatmap, type Row } from "../components/Heatmap";
import { LineChart } from "../components/LineChart";
import { ErrorBanner, Link, Loading, Section, SlowdownBadge, Stat, StateBadge } from "../components/ui";
import { usePoll } from "../data";
import * as fmt from "../format";
import { intParam, navigate, withQuery } from "../router";

const BASE_METRICS = ["slowdown", "step_time", "data_wait", "forward", "backward", "grad_sync", "optimizer", "other", "gc", "checkpoint"];

export function JobPage({ jobId, search, info }: { jobId: string; search: URLSearchParams; info: Info | null }) {
  const every = Math.max(5, Math.min(30, info?.analysis_interval ?? 10)) * 1000;
  const path = jobPath(jobId);
  const fromStep = intParam(search, "from_step");
  const toStep = intParam(search, "to_step");
  // A job restarted under the same id has attempts; the page shows the newest unless the URL
  // names another, and every request (and link to a worker) carries that choice.
  const attempt = intParam(search, "attempt");
  const which = attempt !== null ? { attempt } : {};
  const jobKey = `${jobId}|${attempt ?? "newest"}`;
  const workerHref = (rank: number) => `${path}/workers/${rank}${attempt !== null ? `?attempt=${attempt}` : ""}`;
  const analyseRange = search.get("analyse") === "1" && (fromStep !== null || toStep !== null);
  const summaryKey = `${jobKey}|${analyseRange ? `${fromStep}-${toStep}` : "stored"}`;

  const summary = usePoll(
    () => request<Summary>(`${path}/summary`, analyseRange ? { ...which, from_step: fromStep, to_step: toStep } : which),
    summaryKey,
    analyseRange ? 0 : every,
  );
  const job = usePoll(
    () => request<JobsPage>("/jobs", { job_id: jobId, limit: 1 }).then((p) => p.jobs[0] ?? null),
    jobId,
    every,
  );
  const attempts = usePoll(() => request<{ attempts: Attempt[] }>(`${path}/attempts`), jobId, every * 3);
  const steps = usePoll(() => request<{ steps: StepPoint[] }>(`${path}/steps`, which), jobKey, every);
  // The heatmap reports when it has drawn (or failed); what sits below it waits for that.
  const [heatSettled, setHeatSettled] = useState(false);
  const history = usePoll(() => request<{ points: TrendPoint[] }>(`${path}/trend`, which), jobKey, every * 3, heatSettled);
  const grid = usePoll(() => request<WorkerGrid>(`${path}/workers`, which), jobKey, every, heatSettled);
  const ranks = usePoll(() => request<{ ranks: RankInfo[] }>(`${path}/ranks`, which), jobKey, every * 6, heatSettled);
  const alerts = usePoll(() => request<{ alerts: Alert[] }>("/alerts", { job: jobId, state: "firing" }), jobId, every, heatSettled);

  if (summary.error?.status === 404) {
    return (
      <main>
        <h1 class="job-title">{jobId}</h1>
        <div class="empty" data-testid="no-such-job">
          <h2>No job with this id</h2>
          <p>
            SMon has no record of it: it never reported, or its data is older than the retention period
            (SMON_RETENTION_DAYS). <Link href="/">See all jobs</Link>.
          </p>
        </div>
      </main>
    );
  }

  const s = summary.data;
  const j = job.data;
  const runs = attempts.data?.attempts ?? [];
  // The figures of the attempt shown: the jobs-list row is the newest attempt's.
  const run: Run | null = attempt === null ? j : (runs.find((a) => a.attempt === attempt) ?? null);
  const price = info?.gpu_hour_price ?? 0;
  const grafana = info?.grafana_url ? `${info.grafana_url.replace(/\/$/, "")}/d/smon-overview?var-job=${encodeURIComponent(jobId)}` : null;

  return (
    <main>
      <nav class="crumbs">
        <Link href="/">Jobs</Link> / <span>job</span>
      </nav>
      <div class="page-head">
        <h1 class="job-title" data-testid="job-title">
          {jobId}
        </h1>
        <div class="head-meta">
          {s && <StateBadge state={s.state} />}
          {run && <span>{run.world_size} GPUs</span>}
          {run?.last_step !== null && run?.last_step !== undefined && <span>step {run.last_step}</span>}
          {runs.length > 1 && <AttemptPicker runs={runs} attempt={attempt} />}
          {s && (
            <span class="muted" title={s.computed_at ?? ""} data-testid="freshness">
              analysed {fmt.ago(s.computed_at)}
            </span>
          )}
          {grafana && (
            <a href={grafana} target="_blank" rel="noopener noreferrer">
              Grafana ↗
            </a>
          )}
        </div>
      </div>
      <ErrorBanner error={summary.error} what="the summary" />
      {s && attempt !== null && s.attempt < s.attempts && (
        <div class="attempt-note" role="status" data-testid="attempt-note">
          Attempt {s.attempt} of {s.attempts}: an earlier run of this job id, before it was restarted.{" "}
          <Link href={withAttempt(null)}>See the latest attempt</Link>
        </div>
      )}
      {(alerts.data?.alerts.length ?? 0) > 0 && (
        <div class="alert-strip" role="status">
          {alerts.data?.alerts.map((a) => (
            <Link key={a.id} href={`/alerts?job=${encodeURIComponent(jobId)}`} class="badge firing">
              {a.severity}: {a.summary}
            </Link>
          ))}
        </div>
      )}
      {!s && !summary.error && <Loading what="the analysis" />}
      {s && <Headline s={s} run={run} price={price} analysedRange={analyseRange} />}
      {s?.recent && <Recent recent={s.recent} workerHref={workerHref} overall={s.stragglers.map((x) => x.rank)} />}

      <Section
        title="Step time: measured vs ideal"
        actions={
          (fromStep !== null || toStep !== null) && (
            <span class="range-note">
              steps {fromStep ?? "…"}–{toStep ?? "…"}{" "}
              {!analyseRange && (
                <button type="button" onClick={() => navigate(withQuery({ analyse: "1" }))}>
                  Analyse this range
                </button>
              )}
              <button type="button" onClick={() => navigate(withQuery({ from_step: null, to_step: null, analyse: null }))}>
                Whole window
              </button>
            </span>
          )
        }
      >
        <ErrorBanner error={steps.error} what="per-step times" />
        <StepsChart points={steps.data?.steps ?? null} fromStep={fromStep} toStep={toStep} />
        <p class="muted small">Drag across the chart to pick a step range: the heatmap follows, and the link keeps it.</p>
        {(history.data?.points.length ?? 0) > 2 && <HistoryChart points={history.data?.points ?? []} />}
      </Section>

      {s && s.diagnoses.length > 0 && (
        <Section title="Diagnoses">
          <div class="diagnoses" data-testid="diagnoses">
            {s.diagnoses.map((d) => (
              <div class={`diagnosis cause-${d.cause}`} key={d.cause} data-cause={d.cause}>
                <div class="diagnosis-head">
                  <strong>{fmt.cause(d.cause)}</strong>
                  <span>{fmt.percent(d.share, 0)} of the slowdown</span>
                  <span class="muted">confidence {fmt.percent(d.confidence, 0)}</span>
                </div>
                <p>{d.recommendation}</p>
                <p class="muted small">{fmt.evidence(d.evidence, 6)}</p>
              </div>
            ))}
          </div>
        </Section>
      )}
      {s && s.slowdown !== null && s.diagnoses.length === 0 && (
        <Section title="Diagnoses">
          <p class="muted">No cause stands out: {info && s.slowdown < info.straggling_threshold ? "the job is not straggling." : "see the attribution below."}</p>
        </Section>
      )}

      {s && (
        <Section title={`Stragglers (${s.stragglers.length})`}>
          {s.stragglers.length === 0 ? (
            <p class="muted">No worker stands out{s.slowdown !== null ? "" : " yet (not analysed)"}.</p>
          ) : (
            <table class="table" data-testid="stragglers">
              <thead>
                <tr>
                  <th class="num">Rank</th>
                  <th>Host</th>
                  <th class="num">DP</th>
                  <th class="num">Stage</th>
                  <th class="num">S_w</th>
                  <th>Cause</th>
                  <th>Evidence</th>
                </tr>
              </thead>
              <tbody>
                {s.stragglers.map((x) => (
                  <tr key={x.rank} data-rank={x.rank}>
                    <td class="num">
                      <Link href={workerHref(x.rank)}>{x.rank}</Link>
                    </td>
                    <td>{x.host ? <Link href={hostPath(x.host)}>{x.host}</Link> : "–"}</td>
                    <td class="num">{x.dp_rank}</td>
                    <td class="num">{x.stage}</td>
                    <td class="num">
                      <SlowdownBadge value={x.slowdown} />
                    </td>
                    <td>{fmt.cause(x.cause)}</td>
                    <td class="muted small">{fmt.evidence(x.evidence)}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
        </Section>
      )}

      <HeatmapSection
        jobId={jobId}
        attempt={attempt}
        workerHref={workerHref}
        search={search}
        ranks={ranks.data?.ranks ?? []}
        phases={info?.phases ?? []}
        every={every}
        onSettled={() => setHeatSettled(true)}
      />

      <Section title="DP rank × pipeline stage (S_w)">
        <ErrorBanner error={grid.error} what="the worker grid" />
        {grid.data && <WorkerGridTable grid={grid.data} workerHref={workerHref} ranks={ranks.data?.ranks ?? []} />}
      </Section>

      {s && <Attribution s={s} />}
    </main>
  );
}

/** Which run of the job to show; the choice lives in the URL (`?attempt=`), the newest by default. */
function AttemptPicker({ runs, attempt }: { runs: Attempt[]; attempt: number | null }) {
  const newest = runs[0]?.attempt ?? 1;
  return (
    <label class="attempt-picker">
      attempt{" "}
      <select
        data-testid="attempt"
        value={String(attempt ?? newest)}
        onChange={(e) => {
          const picked = Number((e.target as HTMLSelectElement).value);
          navigate(withAttempt(picked === newest ? null : picked));
        }}
      >
        {runs.map((a) => (
          <option key={a.attempt} value={String(a.attempt)}>
            {a.attempt} of {newest}
            {a.attempt === newest ? " (latest)" : ""} · started {fmt.dateTime(a.first_seen)} · {a.state}
          </option>
        ))}
      </select>
    </label>
  );
}

/** The page's URL showing attempt `attempt` (null: the newest). Step and rank ranges belong to one
 * attempt's steps, so they are dropped. */
function withAttempt(attempt: number | null): string {
  return withQuery({ attempt, from_step: null, to_step: null, analyse: null, from_rank: null, to_rank: null });
}

function Headline({ s, run, price, analysedRange }: { s: Summary; run: Run | null; price: number; analysedRange: boolean }) {
  const wasted = analysedRange ? s.gpu_hours_wasted : (run?.gpu_hours_wasted ?? s.gpu_hours_wasted);
  return (
    <div class="stats" data-testid="headline">
      <Stat
        label="Slowdown S"
        testId="slowdown"
        value={<SlowdownBadge value={s.slowdown} />}
        note={
          <>
            steps {s.from_step ?? "–"}–{s.to_step ?? "–"} ({s.steps_seen} seen)
            {s.warmup_steps > 0 && <div class="flag">first {s.warmup_steps} steps after each start left out (warm-up)</div>}
            {s.analysis_state === "failed" && (
              <div class="flag warn" data-testid="analysis-failed">
                the latest analysis failed{s.analysis_failed_at ? ` (${fmt.dateTime(s.analysis_failed_at)})` : ""}:{" "}
                {s.analysis_error}
                {s.steps_seen > 0 ? "; these are the last good analysis's numbers" : ""}. Tried again when new steps arrive.
              </div>
            )}
            {(s.data_quality_notes ?? []).map((n) => (
              <div class="flag warn" data-testid="data-quality-note" key={n.kind}>
                {n.message}
              </div>
            ))}
            {s.discrepancy_flagged && (
              <div class="flag warn" data-testid="discrepancy-flag">
                replay misses the measured steps by {fmt.percent((s.simulation_discrepancy ?? 1) - 1)}: treat S with care
              </div>
            )}
            <div class="muted small">
              estimator {s.estimator}
              {s.noise_floor !== null && ` · noise floor ${s.noise_floor.toFixed(3)}×`}
            </div>
          </>
        }
      />
      <Stat label="Waste" value={fmt.percent(s.waste_fraction)} note="1 − 1/S of the job's GPU time" />
      <Stat
        label="GPU-hours wasted"
        value={fmt.hours(wasted)}
        note={
          price > 0
            ? `${fmt.money(wasted * price)} at ${fmt.money(price)}/GPU-h`
            : analysedRange
              ? "in this range"
              : s.attempts > 1
                ? "since this attempt started"
                : "since the job started"
        }
      />
      {run && (
        <Stat label="GPU-hours used" value={fmt.hours(gpuHours(run))} note={price > 0 ? fmt.money(gpuHours(run) * price) : `since ${fmt.dateTime(run.first_seen)}`} />
      )}
      <Stat label="Ideal step" value={fmt.seconds(s.ideal_step_time)} note={`M_W ${s.m_w?.toFixed(2) ?? "–"} · M_S ${s.m_s?.toFixed(2) ?? "–"}`} />
    </div>
  );
}

function Recent({ recent, workerHref, overall }: { recent: NonNullable<Summary["recent"]>; workerHref: (rank: number) => string; overall: number[] }) {
  const fresh = recent.stragglers.filter((x) => !overall.includes(x.rank));
  return (
    <div class={`recent ${fresh.length ? "warn" : ""}`} data-testid="recent">
      <strong>Right now</strong> (steps {recent.from_step}–{recent.to_step}): S {fmt.slowdown(recent.slowdown)}
      {recent.stragglers.length > 0 ? (
        <>
          {" "}
          · stragglers{" "}
          {recent.stragglers.map((x) => (
            <Link key={x.rank} href={workerHref(x.rank)} class="chip">
              rank {x.rank} ({fmt.slowdown(x.slowdown)})
            </Link>
          ))}
          {fresh.length > 0 && <span class="flag warn">new since the window summary</span>}
        </>
      ) : (
        " · no straggler"
      )}
    </div>
  );
}

function StepsChart({ points, fromStep, toStep }: { points: StepPoint[] | null; fromStep: number | null; toStep: number | null }) {
  const data = useMemo(() => {
    const inRange = (points ?? []).filter((p) => (fromStep === null || p.step >= fromStep) && (toStep === null || p.step <= toStep));
    return {
      x: inRange.map((p) => p.step),
      series: [
        { label: "measured step", values: inRange.map((p) => p.step_time), color: "#c0392b" },
        { label: "ideal step", values: inRange.map((p) => p.ideal_time), color: "#2e86de", dash: [4, 3] },
        { label: "slowdown", values: inRange.map((p) => p.slowdown), color: "#7f8c8d", scale: "S" },
      ],
    };
  }, [points, fromStep, toStep]);
  if (!points) return <Loading what="steps" />;
  if (!points.length) return <p class="muted">No analysed steps yet (warm-up steps are left out).</p>;
  return (
    <LineChart
      testId="steps-chart"
      x={data.x}
      series={data.series}
      xLabel="step"
      format={fmt.seconds}
      format2={(v) => `${v.toFixed(2)}×`}
      onSelect={(a, b) => navigate(withQuery({ from_step: Math.ceil(a), to_step: Math.floor(b), analyse: null }))}
    />
  );
}

function HistoryChart({ points }: { points: TrendPoint[] }) {
  const timed = points.filter((p) => p.end_time !== null);
  const x = timed.map((p) => Date.parse(p.end_time ?? "") / 1000);
  const series = [
    { label: "slowdown", values: timed.map((p) => p.slowdown), color: "#c0392b", points: true },
    { label: "stragglers", values: timed.map((p) => p.stragglers.length), color: "#8e44ad", scale: "n" },
  ];
  return (
    <>
      <h3>Since the job started</h3>
      <LineChart testId="history-chart" x={x} series={series} time format={(v) => `${v.toFixed(2)}×`} format2={(v) => v.toFixed(0)} height={160} />
    </>
  );
}

function HeatmapSection({
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

function WorkerGridTable({ grid, workerHref, ranks }: { grid: WorkerGrid; workerHref: (rank: number) => string; ranks: RankInfo[] }) {
  const scale = scaleFor("slowdown", grid.values.flat());
  if (!grid.dp_ranks.length) return <p class="muted">No attribution yet: it runs when S ≥ 1.03.</p>;
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

function Attribution({ s }: { s: Summary }) {
  const ops = Object.entries(s.attribution.by_op_type).sort((a, b) => b[1] - a[1]);
  if (!ops.length) return null;
  const max = Math.max(...ops.map(([, v]) => v), 1.0001);
  return (
    <Section title="Where the time goes (S_X by op type)">
      <table class="table bars">
        <tbody>
          {ops.map(([op, v]) => (
            <tr key={op}>
              <td>{op}</td>
              <td class="num">{v.toFixed(3)}×</td>
              <td class="bar-cell">
                <span class="bar" style={{ width: `${Math.max(1, ((v - 1) / (max - 1)) * 100)}%` }} />
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <p class="muted small">S_X: the job's slowdown with only op type X's measured durations restored (1.000× means it costs nothing).</p>
    </Section>
  );
}
