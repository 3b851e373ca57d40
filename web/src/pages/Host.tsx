// `/hosts/{host}`: one machine's story. Why it is (not) suspect and what to do, the jobs it
// slowed (newest first) beside its GPUs' health events on one time line.
import { type HostDetail, type HostGpuEvent, hostPath, type Info, jobPath, request } from "../api";
import { ErrorBanner, Link, Loading, Section, SlowdownBadge, Stat } from "../components/ui";
import { usePoll } from "../data";
import * as fmt from "../format";

export function HostPage({ host, info }: { host: string; info: Info | null }) {
  const every = Math.max(5, Math.min(30, info?.analysis_interval ?? 10)) * 1000;
  const h = usePoll(() => request<HostDetail>(hostPath(host)), host, every);
  const d = h.data;
  return (
    <main>
      <nav class="crumbs">
        <Link href="/hosts">Hosts</Link> / <span>{host}</span>
      </nav>
      <div class="page-head">
        <h1>
          <span class="job-title">{host}</span>{" "}
          {d?.suspect && (
            <span class="badge firing" data-testid="suspect-badge">
              suspect
            </span>
          )}
        </h1>
      </div>
      <ErrorBanner error={h.error} what="this host" />
      {!d && !h.error && <Loading what="the host" />}
      {d && (
        <>
          <div class="stats">
            <Stat label="Straggler jobs" value={d.straggler_jobs} note={`of ${d.jobs} jobs run since ${fmt.dateTime(d.since)}`} testId="stat-straggler-jobs" />
            <Stat label="GPU-hours lost" value={fmt.hours(d.gpu_hours_lost)} note="by those jobs, to this host's ranks" />
            <Stat label="GPU faults" value={d.gpu_faults} note={`${d.gpu_events.xid_count} XID · ${d.gpu_events.ecc_uncorrected} new uncorrectable ECC`} />
            <Stat
              label="Throttled"
              value={d.throttle_seconds > 0 ? `${d.throttle_seconds.toFixed(0)} s` : "–"}
              note={Object.entries(d.gpu_events.throttle_seconds)
                .map(([r, s]) => `${r.replace(/_/g, " ")} ${s.toFixed(0)} s`)
                .join(" · ")}
            />
          </div>
          <Section title={d.suspect ? "Why it is suspect" : "Verdict"}>
            <p data-testid="verdict">{d.verdict}</p>
            {d.recommendation && (
              <p data-testid="recommendation">
                <strong>What to do:</strong> {d.recommendation}
              </p>
            )}
            {d.causes.length > 0 && <p class="muted small">Causes: {d.causes.map((c) => `${fmt.cause(c.cause)} in ${c.jobs} job${c.jobs === 1 ? "" : "s"}`).join(" · ")}</p>}
          </Section>
          <Section title="Incidents and GPU health">
            <Timeline d={d} />
          </Section>
          <Section title="Incidents (newest first)">
            {d.incidents.length ? (
              <table class="table" data-testid="incidents-table">
                <thead>
                  <tr>
                    <th>Job</th>
                    <th class="num">Rank</th>
                    <th>GPU</th>
                    <th>Cause</th>
                    <th class="num">S_w</th>
                    <th class="num">GPU-h lost</th>
                    <th>Evidence</th>
                    <th>When</th>
                  </tr>
                </thead>
                <tbody>
                  {d.incidents.map((i) => (
                    <tr key={`${i.job_id}|${i.attempt}|${i.rank}`} data-job={i.job_id} class={i.counts_toward_suspect ? "" : "muted"}>
                      <td class="job-id">
                        <Link href={i.link}>{i.job_id}</Link>
                        {i.attempt > 1 && <span class="muted small"> attempt {i.attempt}</span>}
                      </td>
                      <td class="num">
                        <Link href={`${jobPath(i.job_id)}/workers/${i.rank}${i.attempt > 1 ? `?attempt=${i.attempt}` : ""}`}>{i.rank}</Link>
                      </td>
                      <td class="small">{i.gpu_uuid || "–"}</td>
                      <td>{fmt.cause(i.cause)}</td>
                      <td class="num">
                        <SlowdownBadge value={i.slowdown} />
                      </td>
                      <td class="num">{fmt.hours(i.gpu_hours_lost)}</td>
                      <td class="small">{fmt.evidence(i.evidence)}</td>
                      <td title={i.last_seen}>{fmt.ago(i.last_seen)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            ) : (
              <p class="muted">None of this host's ranks straggled in the period.</p>
            )}
          </Section>
        </>
      )}
    </main>
  );
}

const EVENT_COLORS: Record<HostGpuEvent["kind"], string> = { xid: "#c0392b", ecc_uncorrected: "#8e44ad", throttle: "#e67e22" };

function eventText(e: HostGpuEvent): string {
  const when = fmt.dateTime(e.time);
  if (e.kind === "xid") return `XID ${e.code} at ${when} (job ${e.job_id}, rank ${e.rank})`;
  if (e.kind === "ecc_uncorrected") return `${e.value} new uncorrectable ECC error(s) at ${when} (job ${e.job_id})`;
  return `throttled (${(e.reason ?? "").replace(/_/g, " ")}) for ${e.value.toFixed(0)} s from ${when} (job ${e.job_id})`;
}

/** Incidents (a bar from the first to the last analysed time that named it) and each GPU's
 *  events on one time axis: a throttling stretch is a bar, an XID or an ECC error a mark. */
function Timeline({ d }: { d: HostDetail }) {
  const width = 900;
  const row = 22;
  const left = 150;
  const start = Date.parse(d.since) / 1000;
  const end = Date.now() / 1000;
  const x = (t: number) => left + ((width - left - 10) * Math.min(Math.max(t - start, 0), end - start)) / Math.max(1, end - start);
  const gpus = d.gpus.filter((g) => g.events.length > 0 || d.gpus.length <= 8);
  const height = row * (gpus.length + 1) + 24;
  const ticks = Array.from({ length: 8 }, (_, i) => start + ((end - start) * i) / 7);
  return (
    <div class="timeline-wrap">
      <svg class="timeline" data-testid="host-timeline" viewBox={`0 0 ${width} ${height}`} width="100%" role="img" aria-label={`incidents and GPU events of ${d.host}`}>
        <text x={4} y={row - 6} class="tl-label">
          incidents
        </text>
        {d.incidents.map((i) => {
          const a = x(Date.parse(i.first_seen) / 1000);
          const b = x(Date.parse(i.last_seen) / 1000);
          return (
            <rect key={`${i.job_id}|${i.rank}`} data-testid="tl-incident" x={a} y={4} width={Math.max(3, b - a)} height={row - 8} fill="#c0392b" opacity={0.75}>
              <title>{`job ${i.job_id}, rank ${i.rank}: ${fmt.cause(i.cause)}, S_w ${i.slowdown.toFixed(2)}`}</title>
            </rect>
          );
        })}
        {gpus.map((g, k) => {
          const y = row * (k + 1);
          return (
            <g key={g.gpu_uuid}>
              <text x={4} y={y + row - 6} class="tl-label">
                {g.gpu_uuid.length > 22 ? `${g.gpu_uuid.slice(0, 21)}…` : g.gpu_uuid || "GPU ?"}
                <title>{g.gpu_uuid}</title>
              </text>
              <line x1={left} x2={width - 10} y1={y + row / 2} y2={y + row / 2} stroke="#eee" />
              {g.events.map((e, n) => {
                const t = Date.parse(e.time) / 1000;
                const cx = x(t);
                if (e.kind === "throttle")
                  return (
                    <rect key={n} data-testid="tl-throttle" x={cx} y={y + 6} width={Math.max(2, x(t + e.value) - cx)} height={row - 12} fill={EVENT_COLORS.throttle}>
                      <title>{eventText(e)}</title>
                    </rect>
                  );
                return (
                  <circle key={n} data-testid={`tl-${e.kind}`} cx={cx} cy={y + row / 2} r={5} fill={EVENT_COLORS[e.kind]}>
                    <title>{eventText(e)}</title>
                  </circle>
                );
              })}
            </g>
          );
        })}
        {ticks.map((t) => (
          <text key={t} x={x(t)} y={height - 4} class="tl-tick" text-anchor="middle">
            {new Date(t * 1000).toLocaleDateString(undefined, { month: "short", day: "numeric" })}
          </text>
        ))}
      </svg>
      <p class="muted small">
        <span style={{ color: EVENT_COLORS.xid }}>●</span> XID <span style={{ color: EVENT_COLORS.ecc_uncorrected }}>●</span> new uncorrectable ECC{" "}
        <span style={{ color: EVENT_COLORS.throttle }}>■</span> throttling <span style={{ color: "#c0392b" }}>■</span> straggler incident
      </p>
    </div>
  );
}
