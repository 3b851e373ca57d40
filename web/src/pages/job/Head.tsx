// The job page's head: which job, its state and size, which attempt, how fresh the analysis is.
import type { Alert, Attempt, Run, Summary } from "../../api";
import { Link, StateBadge } from "../../components/ui";
import * as fmt from "../../format";
import { navigate, withQuery } from "../../router";

export function JobHead({ jobId, s, run, runs, attempt, grafanaUrl }: { jobId: string; s: Summary | null; run: Run | null; runs: Attempt[]; attempt: number | null; grafanaUrl: string | null }) {
  const grafana = grafanaUrl ? `${grafanaUrl.replace(/\/$/, "")}/d/smon-overview?var-job=${encodeURIComponent(jobId)}` : null;
  return (
    <>
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
    </>
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

/** Shown on an earlier attempt: the job id has run again since. */
export function AttemptNote({ s }: { s: Summary }) {
  return (
    <div class="attempt-note" role="status" data-testid="attempt-note">
      Attempt {s.attempt} of {s.attempts}: an earlier run of this job id, before it was restarted.{" "}
      <Link href={withAttempt(null)}>See the latest attempt</Link>
    </div>
  );
}

export function AlertStrip({ jobId, alerts }: { jobId: string; alerts: Alert[] }) {
  return (
    <div class="alert-strip" role="status">
      {alerts.map((a) => (
        <Link key={a.id} href={`/alerts?job=${encodeURIComponent(jobId)}`} class="badge firing">
          {a.severity}: {a.summary}
        </Link>
      ))}
    </div>
  );
}

export function NoSuchJob({ jobId }: { jobId: string }) {
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
