// `/alerts`: what is firing, what fired lately; acknowledge, silence.
import { useState } from "preact/hooks";

import { type Alert, type ApiError, type Info, type Silence, jobPath, request } from "../api";
import { ErrorBanner, Link, Loading, Section } from "../components/ui";
import { usePoll } from "../data";
import * as fmt from "../format";
import { navigate, withQuery } from "../router";

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
      <Section title="Silences">
        <ErrorBanner error={silences.error} what="silences" />
        <SilenceForm job={job} onCreate={(body) => act(() => request("/silences", {}, { method: "POST", body: JSON.stringify({ ...body, created_by: operator }) }))} />
        {(silences.data?.silences ?? []).length > 0 && (
          <table class="table">
            <thead>
              <tr>
                <th>Matchers</th>
                <th>Until</th>
                <th>By</th>
                <th>Comment</th>
                <th />
              </tr>
            </thead>
            <tbody>
              {silences.data?.silences.map((s) => (
                <tr key={s.id} class={s.active ? "" : "muted"}>
                  <td>
                    {Object.entries(s.matchers).map(([k, v]) => (
                      <span class="chip" key={k}>
                        {k}={v}
                      </span>
                    ))}
                  </td>
                  <td>{fmt.dateTime(s.ends_at)}</td>
                  <td>{s.created_by || "–"}</td>
                  <td>{s.comment}</td>
                  <td>
                    {s.active && (
                      <button type="button" onClick={() => act(() => request(`/silences/${s.id}`, {}, { method: "DELETE" }))}>
                        Expire
                      </button>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </Section>
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

function SilenceForm({ job, onCreate }: { job: string; onCreate: (body: { matchers: Record<string, string>; duration_seconds: number; comment: string }) => void }) {
  const [jobPattern, setJob] = useState(job);
  const [rule, setRule] = useState("");
  const [host, setHost] = useState("");
  const [hours, setHours] = useState("2");
  const [comment, setComment] = useState("");
  return (
    <form
      class="silence-form"
      onSubmit={(e) => {
        e.preventDefault();
        const matchers: Record<string, string> = {};
        if (jobPattern) matchers.job = jobPattern;
        if (rule) matchers.rule = rule;
        if (host) matchers.host = host;
        if (!Object.keys(matchers).length) return;
        onCreate({ matchers, duration_seconds: Math.max(0.25, Number(hours) || 1) * 3600, comment });
      }}
    >
      <input placeholder="job (fnmatch, e.g. llama-*)" value={jobPattern} onInput={(e) => setJob((e.target as HTMLInputElement).value)} />
      <input placeholder="rule" value={rule} onInput={(e) => setRule((e.target as HTMLInputElement).value)} />
      <input placeholder="host" value={host} onInput={(e) => setHost((e.target as HTMLInputElement).value)} />
      <input type="number" min="0.25" step="0.25" value={hours} onInput={(e) => setHours((e.target as HTMLInputElement).value)} aria-label="hours" /> h
      <input placeholder="why" value={comment} onInput={(e) => setComment((e.target as HTMLInputElement).value)} />
      <button type="submit">Silence</button>
    </form>
  );
}
