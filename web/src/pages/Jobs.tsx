// `/`: every job, worst first by default; sortable and filterable, refreshing in place.
import { useMemo, useState } from "preact/hooks";

import { type Alert, gpuHours, type Info, type Job, type JobsPage, request } from "../api";
import { ErrorBanner, Link, Loading } from "../components/ui";
import { usePoll } from "../data";
import { navigate, withQuery } from "../router";
import { JobRow } from "./jobs/JobRow";

type SortKey = "job_id" | "state" | "world_size" | "slowdown" | "waste_fraction" | "gpu_hours_wasted" | "gpu_hours" | "last_seen" | "alerts";

const COLUMNS: { key: SortKey; label: string; numeric?: boolean }[] = [
  { key: "job_id", label: "Job" },
  { key: "state", label: "State" },
  { key: "world_size", label: "GPUs", numeric: true },
  { key: "slowdown", label: "Slowdown S", numeric: true },
  { key: "waste_fraction", label: "Waste", numeric: true },
  { key: "gpu_hours_wasted", label: "GPU-h wasted", numeric: true },
  { key: "gpu_hours", label: "GPU-h", numeric: true },
  { key: "alerts", label: "Alerts", numeric: true },
  { key: "last_seen", label: "Last seen" },
];

const STATES = ["", "running", "stalled", "finished"];

export function JobsPage({ search, info }: { search: URLSearchParams; info: Info | null }) {
  const state = search.get("state") ?? "";
  const q = search.get("q") ?? "";
  const straggling = search.get("straggling") === "1";
  const sort = (search.get("sort") as SortKey | null) ?? "slowdown";
  const desc = search.get("dir") !== "asc";
  const [draft, setDraft] = useState(q);
  const every = Math.max(5, Math.min(30, info?.analysis_interval ?? 10)) * 1000;

  const jobs = usePoll(
    () => request<JobsPage>("/jobs", { state: state || null, q: q || null, straggling: straggling ? true : null, limit: 1000 }),
    `${state}|${q}|${straggling}`,
    every,
  );
  const alerts = usePoll(() => request<{ alerts: Alert[] }>("/alerts", { state: "firing" }), "firing", every);

  const firing = useMemo(() => {
    const byJob = new Map<string, Alert[]>();
    for (const a of alerts.data?.alerts ?? []) byJob.set(a.job_id, [...(byJob.get(a.job_id) ?? []), a]);
    return byJob;
  }, [alerts.data]);

  const rows = useMemo(() => {
    const list = [...(jobs.data?.jobs ?? [])];
    const value = (j: Job): number | string => {
      if (sort === "alerts") return firing.get(j.job_id)?.length ?? 0;
      if (sort === "last_seen") return Date.parse(j.last_seen);
      if (sort === "gpu_hours") return gpuHours(j);
      const v = j[sort];
      return v === null ? -Infinity : v;
    };
    list.sort((a, b) => {
      const va = value(a);
      const vb = value(b);
      const c = va < vb ? -1 : va > vb ? 1 : a.job_id < b.job_id ? -1 : 1;
      return desc ? -c : c;
    });
    return list;
  }, [jobs.data, sort, desc, firing]);

  const price = info?.gpu_hour_price ?? 0;
  const setSort = (key: SortKey) =>
    navigate(withQuery({ sort: key, dir: key === sort ? (desc ? "asc" : null) : key === "job_id" ? "asc" : null }), true);

  return (
    <main>
      <div class="page-head">
        <h1>Jobs</h1>
        <form
          class="filters"
          onSubmit={(e) => {
            e.preventDefault();
            navigate(withQuery({ q: draft.trim() || null }), true);
          }}
        >
          <input
            type="search"
            placeholder="job id contains…"
            value={draft}
            onInput={(e) => setDraft((e.target as HTMLInputElement).value)}
            aria-label="filter by job id"
          />
          <select
            value={state}
            aria-label="state"
            onChange={(e) => navigate(withQuery({ state: (e.target as HTMLSelectElement).value || null }), true)}
          >
            {STATES.map((s) => (
              <option value={s} key={s}>
                {s || "any state"}
              </option>
            ))}
          </select>
          <label class="check">
            <input
              type="checkbox"
              checked={straggling}
              onChange={(e) => navigate(withQuery({ straggling: (e.target as HTMLInputElement).checked ? "1" : null }), true)}
            />
            straggling only{info && ` (S ≥ ${info.straggling_threshold})`}
          </label>
        </form>
      </div>
      <ErrorBanner error={jobs.error} what="jobs" />
      {!jobs.data && !jobs.error && <Loading what="jobs" />}
      {jobs.data && jobs.data.total === 0 && !q && !state && !straggling && <NoJobs info={info} />}
      {jobs.data && jobs.data.total === 0 && (q || state || straggling) && (
        <p class="empty">No job matches these filters. <Link href="/">Clear them</Link>.</p>
      )}
      {rows.length > 0 && (
        <>
          <table class="table jobs" data-testid="jobs-table">
            <thead>
              <tr>
                {COLUMNS.map((c) => (
                  <th key={c.key} class={c.numeric ? "num" : ""} aria-sort={sort === c.key ? (desc ? "descending" : "ascending") : "none"}>
                    <button type="button" class="sort" onClick={() => setSort(c.key)}>
                      {c.label}
                      {sort === c.key ? (desc ? " ▾" : " ▴") : ""}
                    </button>
                  </th>
                ))}
                <th>Worst rank</th>
                <th>Leading cause</th>
              </tr>
            </thead>
            <tbody>
              {rows.map((j) => (
                <JobRow key={j.job_id} j={j} firing={firing.get(j.job_id) ?? []} price={price} />
              ))}
            </tbody>
          </table>
          <p class="muted small">
            {jobs.data && jobs.data.total > rows.length
              ? `Showing ${rows.length} of ${jobs.data.total} jobs (newest first); filter to narrow.`
              : `${rows.length} job${rows.length === 1 ? "" : "s"}.`}{" "}
            Refreshes every {every / 1000} s.
          </p>
        </>
      )}
    </main>
  );
}

function NoJobs({ info }: { info: Info | null }) {
  const address = info?.ingest_address ?? "<this host>:50051";
  return (
    <div class="empty" data-testid="no-jobs">
      <h2>No jobs yet</h2>
      <p>Attach SMon to a training script. One line, in every rank:</p>
      <pre>
        {`import smon\nmon = smon.attach(model=model, optimizer=optimizer, dataloader=loader)`}
      </pre>
      <p>and point the ranks at this server:</p>
      <pre>{`SMON_SERVER=${address} torchrun --nproc-per-node 8 train.py`}</pre>
      <p class="muted">Jobs appear here within a few seconds of their first steps.</p>
    </div>
  );
}
