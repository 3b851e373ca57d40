// Measured vs ideal step time per step (drag to pick a range), and S since the job started.
import { useMemo } from "preact/hooks";

import type { StepPoint, TrendPoint } from "../../api";
import { LineChart } from "../../components/LineChart";
import { ErrorBanner, Loading, Section } from "../../components/ui";
import type { Loaded } from "../../data";
import * as fmt from "../../format";
import { navigate, withQuery } from "../../router";

export function StepsSection({
  steps,
  history,
  fromStep,
  toStep,
  analyseRange,
}: {
  steps: Loaded<{ steps: StepPoint[] }>;
  history: Loaded<{ points: TrendPoint[] }>;
  fromStep: number | null;
  toStep: number | null;
  analyseRange: boolean;
}) {
  return (
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
