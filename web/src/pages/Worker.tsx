// `/jobs/{id}/workers/{rank}`: where one rank's step time goes, next to its GPU's health, on one
// time axis (the cursor moves on both charts together).
import { useMemo } from "preact/hooks";

import { hostPath, type Info, type Worker, jobPath, request } from "../api";
import { LineChart, type Series } from "../components/LineChart";
import { ErrorBanner, Link, Loading, Section, SlowdownBadge, Stat } from "../components/ui";
import { usePoll } from "../data";
import * as fmt from "../format";
import { intParam } from "../router";

const PHASE_COLORS: Record<string, string> = {
  data_wait: "#16a085",
  h2d: "#1abc9c",
  forward: "#2980b9",
  backward: "#8e44ad",
  grad_sync: "#e67e22",
  optimizer: "#27ae60",
  checkpoint: "#7f8c8d",
  host: "#c0392b",
  gc: "#d35400",
  other: "#95a5a6",
};
const EXTRA = ["#2c3e50", "#f39c12", "#9b59b6", "#34495e", "#e84393", "#00b894"];

// NVML clock-event reasons (nvmlClocksEventReason*) that mean the GPU was slowed down.
const THROTTLE_BITS: [number, string][] = [
  [0x2, "applications clocks"],
  [0x4, "SW power cap"],
  [0x8, "HW slowdown"],
  [0x20, "SW thermal"],
  [0x40, "HW thermal"],
  [0x80, "HW power brake"],
];

export function throttleText(bits: number | null): string {
  if (!bits) return "";
  return THROTTLE_BITS.filter(([bit]) => bits & bit)
    .map(([, name]) => name)
    .join(", ");
}

export function WorkerPage({ jobId, rank, search, info }: { jobId: string; rank: number; search: URLSearchParams; info: Info | null }) {
  const every = Math.max(5, Math.min(30, info?.analysis_interval ?? 10)) * 1000;
  const attempt = intParam(search, "attempt"); // an earlier run of the job (default: the newest)
  const which = attempt !== null ? { attempt } : {};
  const jobHref = `${jobPath(jobId)}${attempt !== null ? `?attempt=${attempt}` : ""}`;
  const w = usePoll(() => request<Worker>(`${jobPath(jobId)}/workers/${rank}`, which), `${jobId}|${attempt}|${rank}`, every);
  const d = w.data;
  const sync = `worker-${jobId}-${rank}`;

  const phases = useMemo(() => {
    if (!d) return null;
    const names = Array.from(new Set(d.steps.flatMap((s) => Object.keys(s.phases)))).sort();
    const x = d.steps.map((s) => s.start_time);
    const series: Series[] = [
      { label: "step", values: d.steps.map((s) => s.duration), color: "#222" },
      ...names.map((name, i) => ({
        label: name,
        values: d.steps.map((s) => s.phases[name] ?? null),
        color: PHASE_COLORS[name] ?? EXTRA[i % EXTRA.length],
      })),
    ];
    return { x, series };
  }, [d]);

  const gpu = useMemo(() => {
    if (!d || !d.gpu.length) return null;
    const x = d.gpu.map((g) => g.time);
    const clocks: Series[] = [
      { label: "SM clock", values: d.gpu.map((g) => g.sm_clock_mhz), color: "#2980b9" },
      { label: "max SM clock", values: d.gpu.map((g) => g.sm_clock_max_mhz), color: "#95a5a6", dash: [4, 3] },
      { label: "temperature °C", values: d.gpu.map((g) => g.temperature_c), color: "#c0392b", scale: "t" },
    ];
    const power: Series[] = [
      { label: "power W", values: d.gpu.map((g) => g.power_w), color: "#e67e22" },
      { label: "power limit W", values: d.gpu.map((g) => g.power_limit_w), color: "#95a5a6", dash: [4, 3] },
      { label: "utilization %", values: d.gpu.map((g) => g.gpu_util), color: "#27ae60", scale: "u" },
    ];
    const events = d.gpu.filter((g) => throttleText(g.throttle_reasons) || g.xid_events.length || g.ecc_uncorrected);
    return { x, clocks, power, events };
  }, [d]);

  // Both panels on one time axis: the span of the steps and the samples together.
  const xRange = useMemo((): [number, number] | undefined => {
    const xs = [...(phases?.x ?? []), ...(gpu?.x ?? [])];
    if (xs.length < 2) return undefined;
    return [Math.min(...xs), Math.max(...xs)];
  }, [phases, gpu]);
  const hb = d?.last_heartbeat;
  return (
    <main>
      <nav class="crumbs">
        <Link href="/">Jobs</Link> / <Link href={jobHref}>{jobId}</Link> / <span>rank {rank}</span>
      </nav>
      <div class="page-head">
        <h1>
          Rank {rank} <span class="muted">of</span> <span class="job-title">{jobId}</span>
          {d && d.attempts > 1 && (
            <span class="muted" data-testid="worker-attempt">
              {" "}
              · attempt {d.attempt} of {d.attempts}
            </span>
          )}
        </h1>
      </div>
      <ErrorBanner error={w.error} what="this worker" />
      {!d && !w.error && <Loading what="the worker" />}
      {d && (
        <>
          <div class="stats">
            <Stat label="S_w" value={<SlowdownBadge value={d.slowdown} />} note="the job's slowdown with only this worker's own durations" />
            <Stat label="Host" value={<span class="small-value">{d.host ? <Link href={hostPath(d.host)}>{d.host}</Link> : "–"}</span>} note={d.gpu_uuid ? `GPU ${d.gpu_uuid}` : "no GPU reported"} />
            <Stat label="Coordinates" value={`DP ${d.dp_rank} · PP ${d.stage} · TP ${d.tp_rank}`} />
            <Stat
              label="Heartbeat"
              value={hb ? fmt.ago(hb.time) : "–"}
              note={hb ? `step ${hb.current_step ?? hb.last_step ?? "–"}${hb.phase ? `, in ${hb.phase}` : ""}` : "none yet"}
            />
          </div>
          <Section title="Phases per step">
            {phases && phases.x.length ? (
              <LineChart testId="phase-chart" x={phases.x} series={phases.series} time format={fmt.seconds} syncKey={sync} xRange={xRange} />
            ) : (
              <p class="muted">No steps in the analysis window.</p>
            )}
          </Section>
          <Section title="GPU health">
            {gpu ? (
              <>
                <LineChart testId="clock-chart" x={gpu.x} series={gpu.clocks} time format={(v) => `${v.toFixed(0)} MHz`} format2={(v) => `${v.toFixed(0)} °C`} syncKey={sync} xRange={xRange} height={180} />
                <LineChart testId="power-chart" x={gpu.x} series={gpu.power} time format={(v) => `${v.toFixed(0)} W`} format2={(v) => `${v.toFixed(0)}%`} syncKey={sync} xRange={xRange} height={160} />
                {gpu.events.length > 0 ? (
                  <table class="table" data-testid="gpu-events">
                    <thead>
                      <tr>
                        <th>Time</th>
                        <th>Throttling</th>
                        <th class="num">ECC uncorrected</th>
                        <th>XID</th>
                      </tr>
                    </thead>
                    <tbody>
                      {gpu.events.slice(-50).map((g) => (
                        <tr key={`${g.time}-${g.gpu_index}`}>
                          <td>{fmt.dateTime(g.time)}</td>
                          <td>{throttleText(g.throttle_reasons) || "–"}</td>
                          <td class="num">{g.ecc_uncorrected ?? "–"}</td>
                          <td>{g.xid_events.join(", ") || "–"}</td>
                        </tr>
                      ))}
                    </tbody>
                  </table>
                ) : (
                  <p class="muted small">No throttling, ECC or XID events in these samples.</p>
                )}
              </>
            ) : (
              <p class="muted">No GPU samples: this rank has no GPU, or NVML is not readable on its host.</p>
            )}
          </Section>
        </>
      )}
    </main>
  );
}
