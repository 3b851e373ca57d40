// One row of the jobs list: a job's newest attempt, its cost and its firing alerts.
import { type Alert, gpuHours, type Job, jobPath } from "../../api";
import { Link, SlowdownBadge, StateBadge } from "../../components/ui";
import * as fmt from "../../format";

export function JobRow({ j, firing, price }: { j: Job; firing: Alert[]; price: number }) {
  return (
    <tr data-job={j.job_id}>
      <td class="job-id">
        <Link href={jobPath(j.job_id)}>{j.job_id}</Link>
        {j.attempts > 1 && (
          <span class="muted small" title="restarted under the same id: the row shows the newest attempt">
            {" "}
            attempt {j.attempt}
          </span>
        )}
      </td>
      <td>
        <StateBadge state={j.state} />
      </td>
      <td class="num">{j.world_size}</td>
      <td class="num">
        <SlowdownBadge value={j.slowdown} />
      </td>
      <td class="num">{fmt.percent(j.waste_fraction)}</td>
      <td class="num">
        {fmt.hours(j.gpu_hours_wasted)}
        {price > 0 && <div class="muted small">{fmt.money(j.gpu_hours_wasted * price)}</div>}
      </td>
      <td class="num">
        {fmt.hours(gpuHours(j))}
        {price > 0 && <div class="muted small">{fmt.money(gpuHours(j) * price)}</div>}
      </td>
      <td class="num">
        {firing.length > 0 ? (
          <Link href={`/alerts?job=${encodeURIComponent(j.job_id)}`} class="badge firing" title={firing.map((a) => a.summary).join("\n")}>
            {firing.length} firing
          </Link>
        ) : (
          <span class="muted">–</span>
        )}
      </td>
      <td title={j.last_seen}>{fmt.ago(j.last_seen)}</td>
      <td class="num">
        {j.worst_rank !== null ? <Link href={`${jobPath(j.job_id)}/workers/${j.worst_rank}`}>{j.worst_rank}</Link> : "–"}
      </td>
      <td>{fmt.cause(j.leading_cause)}</td>
    </tr>
  );
}
