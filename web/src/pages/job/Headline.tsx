// The job's headline figures (S and what qualifies it, waste, GPU-hours) and who straggles right now.
import { gpuHours, type Run, type Summary } from "../../api";
import { Link, SlowdownBadge, Stat } from "../../components/ui";
import * as fmt from "../../format";

export function Headline({ s, run, price, analysedRange }: { s: Summary; run: Run | null; price: number; analysedRange: boolean }) {
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
            {s.data_quality_notes.map((n) => (
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

export function Recent({ recent, workerHref, overall }: { recent: NonNullable<Summary["recent"]>; workerHref: (rank: number) => string; overall: number[] }) {
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
