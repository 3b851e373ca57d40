// `/jobs/{id}`: is this job straggling, since when, where and why, and what to do about it. The
// sections live in job/; this page fetches what they show and lays them out.
import { useState } from "preact/hooks";

import {
  type Alert,
  type Attempt,
  type Info,
  type JobsPage,
  jobPath,
  type RankInfo,
  request,
  type Run,
  type StepPoint,
  type Summary,
  type TrendPoint,
  type WorkerGrid,
} from "../api";
import { ErrorBanner, Loading } from "../components/ui";
import { usePoll } from "../data";
import { intParam } from "../router";
import { Attribution } from "./job/Attribution";
import { Diagnoses, Stragglers } from "./job/Diagnoses";
import { AlertStrip, AttemptNote, JobHead, NoSuchJob } from "./job/Head";
import { Headline, Recent } from "./job/Headline";
import { HeatmapSection } from "./job/HeatmapSection";
import { StepsSection } from "./job/Steps";
import { WorkerGridSection } from "./job/WorkerGrid";

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

  if (summary.error?.status === 404) return <NoSuchJob jobId={jobId} />;

  const s = summary.data;
  const j = job.data;
  const runs = attempts.data?.attempts ?? [];
  // The figures of the attempt shown: the jobs-list row is the newest attempt's.
  const run: Run | null = attempt === null ? j : (runs.find((a) => a.attempt === attempt) ?? null);
  const firing = alerts.data?.alerts ?? [];

  return (
    <main>
      <JobHead jobId={jobId} s={s} run={run} runs={runs} attempt={attempt} grafanaUrl={info?.grafana_url ?? null} />
      <ErrorBanner error={summary.error} what="the summary" />
      {s && attempt !== null && s.attempt < s.attempts && <AttemptNote s={s} />}
      {firing.length > 0 && <AlertStrip jobId={jobId} alerts={firing} />}
      {!s && !summary.error && <Loading what="the analysis" />}
      {s && <Headline s={s} run={run} price={info?.gpu_hour_price ?? 0} analysedRange={analyseRange} />}
      {s?.recent && <Recent recent={s.recent} workerHref={workerHref} overall={s.stragglers.map((x) => x.rank)} />}

      <StepsSection steps={steps} history={history} fromStep={fromStep} toStep={toStep} analyseRange={analyseRange} />

      {s && <Diagnoses s={s} straggling={info?.straggling_threshold ?? null} />}
      {s && <Stragglers s={s} workerHref={workerHref} />}

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

      <WorkerGridSection grid={grid} workerHref={workerHref} ranks={ranks.data?.ranks ?? []} />

      {s && <Attribution s={s} />}
    </main>
  );
}
