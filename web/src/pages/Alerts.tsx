// `/alerts`: what is firing, what fired lately; acknowledge, silence.
import { useState } from "preact/hooks";

import { type Alert, type ApiError, type Info, type Silence, jobPath, request } from "../api";
import { ErrorBanner, Link, Loading, Section } from "../components/ui";
import { usePoll } from "../data";
import * as fmt from "../format";
import { navigate, withQuery } from "../router";
import { Silences } from "./alerts/Silences";

const NAME_KEY = "smon.operator";

export function AlertsPage({ search, info }: { search: URLSearchParams; info: Info | null }) {
  const job = search.get("job") ?? "";
  const every = Math.max(5, Math.min(30, info?.analysis_interval ?? 10)) * 1000;
  const alerts = usePoll(() => request<{ alerts: Alert[] }>("/alerts", { job: job || null }), job, every);
  const silences = usePoll(() => request<{ silences: Silence[] }>("/silences"), "silences", every);
  const [actionError, setActionError] = useState<ApiError | null>(null);
  const [operator, setOperator] = useState(() => localStorage.getItem(NAME_KEY) ?? "");

  const all = alerts.data?.alerts ?? [];
  const open = all.filter((a) => a.state !== "resolved");
  const resolved = all.filter((a) => a.state === "resolved").slice(0, 50);

  async function act(run: () => Promise<unknown>) {
    try {
      await run();
      setActionError(null);
      alerts.refresh();
      silences.refresh();
    } catch (err) {
      setActionError(err as ApiError);
    }
  }

  const ack = (a: Alert) => act(() => request(`/alerts/${a.id}/ack`, {}, { method: "POST", body: JSON.stringify({ by: operator }) }));

  return (
    <main>
      <div class="page-head">
        <h1>Alerts</h1>
        <div class="filters">
          {job && (
            <span class="chip">
              job {job}{" "}
              <button type="button" aria-label="show every job" onClick={() => navigate(withQuery({ job: null }), true)}>
                ×
              </button>
            </span>
          )}
          <label>
            you are{" "}
            <input
              value={operator}
              placeholder="name (shown on acks)"
              onInput={(e) => {
                const v = (e.target as HTMLInputElement).value;
                setOperator(v);
                localStorage.setItem(NAME_KEY, v);
              }}
            />
          </label>
        </div>
      </div>
      <ErrorBanner error={alerts.error} what="alerts" />
      <ErrorBanner error={actionError} what="your change" />
      {!alerts.data && !alerts.error && <Loading what="alerts" />}
      {alerts.data && (
        <Section title={`Open (${open.length})`}>
          {open.length === 0 ? <p class="muted" data-testid="no-open-alerts">Nothing is firing.</p> : <AlertTable alerts={open} onAck={ack} onSilence={(a) => act(() => silence(a, operator))} />}
        </Section>
      )}
      {resolved.length > 0 && (
        <Section title="Recently resolved">
          <AlertTable alerts={resolved} />
        </Section>
      )}
      <Silences
        job={job}
        silences={silences}
        onCreate={(body) => act(() => request("/silences", {}, { method: "POST", body: JSON.stringify({ ...body, created_by: operator }) }))}
        onExpire={(s) => act(() => request(`/silences/${s.id}`, {}, { method: "DELETE" }))}
      />
    </main>
  );
}

function silence(a: Alert, operator: string): Promise<unknown> {
  const matchers: Record<string, string> = { job: a.job_id, rule: a.rule };
  if (a.host) matchers.host = a.host;
  return request("/silences", {}, { method: "POST", body: JSON.stringify({ matchers, duration_seconds: 3600, created_by: operator, comment: `from alert ${a.id}` }) });
}

function AlertTable({ alerts, onAck, onSilence }: { alerts: Alert[]; onAck?: (a: Alert) => void; onSilence?: (a: Alert) => void }) {
  return (
    <table class="table alerts" data-testid="alerts-table">
      <thead>
        <tr>
          <th>Severity</th>
          <th>State</th>
          <th>Job</th>
          <th>Rule</th>
          <th>Summary</th>
          <th>Since</th>
          <th>Ack</th>
          {onAck && <th />}
        </tr>
      </thead>
      <tbody>
        {alerts.map((a) => (
          <tr key={a.id} data-alert={a.id}>
            <td>
              <span class={`badge sev-${a.severity}`}>{a.severity}</span>
            </td>
            <td>
              <span class={`badge ${a.state}`}>{a.state}</span>
              {a.silenced && <span class="chip">silenced</span>}
            </td>
            <td class="job-id">
              <Link href={jobPath(a.job_id)}>{a.job_id}</Link>
              {a.host && <div class="muted small">{a.host}</div>}
            </td>
            <td>{a.rule}</td>
            <td>{a.summary}</td>
            <td title={a.fired_at ?? a.started_at ?? ""}>{fmt.ago(a.state === "resolved" ? a.resolved_at : (a.fired_at ?? a.started_at))}</td>
            <td>{a.acked_at ? `${a.acked_by || "someone"}, ${fmt.ago(a.acked_at)}` : "–"}</td>
            {onAck && (
              <td class="actions">
                {!a.acked_at && (
                  <button type="button" onClick={() => onAck(a)}>
                    Acknowledge
                  </button>
                )}
                {onSilence && !a.silenced && (
                  <button type="button" onClick={() => onSilence(a)} title="silence this job's alerts of this rule for an hour">
                    Silence 1 h
                  </button>
                )}
              </td>
            )}
          </tr>
        ))}
      </tbody>
    </table>
  );
}
