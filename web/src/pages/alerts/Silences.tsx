// The alerts page's silences: those in force or lately expired, and a form for a new one.
import { useState } from "preact/hooks";

import type { Silence } from "../../api";
import { ErrorBanner, Section } from "../../components/ui";
import type { Loaded } from "../../data";
import * as fmt from "../../format";

export type NewSilence = { matchers: Record<string, string>; duration_seconds: number; comment: string };

export function Silences({
  job,
  silences,
  onCreate,
  onExpire,
}: {
  job: string;
  silences: Loaded<{ silences: Silence[] }>;
  onCreate: (body: NewSilence) => void;
  onExpire: (s: Silence) => void;
}) {
  return (
    <Section title="Silences">
      <ErrorBanner error={silences.error} what="silences" />
      <SilenceForm job={job} onCreate={onCreate} />
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
                    <button type="button" onClick={() => onExpire(s)}>
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
  );
}

function SilenceForm({ job, onCreate }: { job: string; onCreate: (body: NewSilence) => void }) {
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
