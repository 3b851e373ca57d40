// `/hosts`: the fleet view. Which machines keep slowing jobs: suspect hosts first, sortable and
// paged on the server (a fleet has thousands of hosts), the page state in the URL.
import { useState } from "preact/hooks";

import { type Host, type HostsPage as HostsList, hostPath, type Info, request } from "../api";
import { ErrorBanner, Link, Loading } from "../components/ui";
import { Sparkline } from "../components/Sparkline";
import { usePoll } from "../data";
import * as fmt from "../format";
import { intParam, navigate, withQuery } from "../router";

type SortKey = "suspect" | "host" | "jobs" | "straggler_jobs" | "gpu_hours_lost" | "gpu_faults" | "throttle_seconds" | "last_incident";

const COLUMNS: { key: SortKey; label: string; numeric?: boolean; title?: string }[] = [
  { key: "host", label: "Host" },
  { key: "suspect", label: "Suspect", title: "straggled in enough distinct jobs within the rule's days" },
  { key: "straggler_jobs", label: "Straggler jobs", numeric: true, title: "distinct jobs in which its own ranks straggled" },
  { key: "jobs", label: "Jobs run", numeric: true },
  { key: "gpu_hours_lost", label: "GPU-h lost", numeric: true, title: "GPU-hours those jobs lost to its ranks" },
  { key: "gpu_faults", label: "GPU faults", numeric: true, title: "XID errors + new uncorrectable ECC errors" },
  { key: "throttle_seconds", label: "Throttled", numeric: true },
  { key: "last_incident", label: "Last incident" },
];
const PAGE = 100;

export function HostsPage({ search, info }: { search: URLSearchParams; info: Info | null }) {
  const q = search.get("q") ?? "";
  const suspectOnly = search.get("suspect") === "1";
  const sort = (search.get("sort") as SortKey | null) ?? "suspect";
  const desc = search.get("dir") !== "asc";
  const offset = intParam(search, "offset") ?? 0;
  const [draft, setDraft] = useState(q);
  const every = Math.max(5, Math.min(30, info?.analysis_interval ?? 10)) * 1000;
  const hosts = usePoll(
    () =>
      request<HostsList>("/hosts", {
        q: q || null,
        suspect: suspectOnly ? true : null,
        sort,
        order: desc ? "desc" : "asc",
        limit: PAGE,
        offset,
      }),
    `${q}|${suspectOnly}|${sort}|${desc}|${offset}`,
    every,
  );
  const setSort = (key: SortKey) =>
    navigate(withQuery({ sort: key, dir: key === sort ? (desc ? "asc" : null) : key === "host" ? "asc" : null, offset: null }), true);
  const d = hosts.data;
  return (
    <main>
      <div class="page-head">
        <h1>Hosts</h1>
        <form
          class="filters"
          onSubmit={(e) => {
            e.preventDefault();
            navigate(withQuery({ q: draft.trim() || null, offset: null }), true);
          }}
        >
          <input type="search" placeholder="host contains…" value={draft} onInput={(e) => setDraft((e.target as HTMLInputElement).value)} aria-label="filter by host" />
          <label class="check">
            <input type="checkbox" checked={suspectOnly} onChange={(e) => navigate(withQuery({ suspect: (e.target as HTMLInputElement).checked ? "1" : null, offset: null }), true)} />
            suspect only
          </label>
        </form>
      </div>
      <p class="muted small">
        Hosts seen in the last 7 days. A host is charged only where its own rank was the straggler, never where it waited for another, and a
        job-wide slowdown counts against no host.
      </p>
      <ErrorBanner error={hosts.error} what="hosts" />
      {!d && !hosts.error && <Loading what="hosts" />}
      {d && d.total === 0 && <p class="empty">{q || suspectOnly ? "No host matches these filters." : "No hosts yet: they appear once their jobs are analysed."}</p>}
      {d && d.hosts.length > 0 && (
        <>
          <table class="table hosts" data-testid="hosts-table">
            <thead>
              <tr>
                {COLUMNS.map((c) => (
                  <th key={c.key} class={c.numeric ? "num" : ""} title={c.title} aria-sort={sort === c.key ? (desc ? "descending" : "ascending") : "none"}>
                    <button type="button" class="sort" onClick={() => setSort(c.key)}>
                      {c.label}
                      {sort === c.key ? (desc ? " ▾" : " ▴") : ""}
                    </button>
                  </th>
                ))}
                <th>Leading cause</th>
                <th>Incidents / day</th>
              </tr>
            </thead>
            <tbody>
              {d.hosts.map((h) => (
                <HostRow h={h} key={h.host} />
              ))}
            </tbody>
          </table>
          <p class="muted small">
            {offset + 1}–{offset + d.hosts.length} of {d.total} hosts.{" "}
            {offset > 0 && <Link href={withQuery({ offset: Math.max(0, offset - PAGE) || null })}>previous</Link>}{" "}
            {offset + d.hosts.length < d.total && <Link href={withQuery({ offset: offset + PAGE })}>next</Link>}
          </p>
        </>
      )}
    </main>
  );
}

function HostRow({ h }: { h: Host }) {
  const lead = h.causes[0];
  return (
    <tr data-host={h.host} class={h.suspect ? "suspect" : ""}>
      <td class="host-name">
        <Link href={hostPath(h.host)}>{h.host}</Link>
      </td>
      <td>{h.suspect ? <span class="badge firing">suspect</span> : <span class="muted">–</span>}</td>
      <td class="num">{h.straggler_jobs}</td>
      <td class="num">{h.jobs}</td>
      <td class="num">{fmt.hours(h.gpu_hours_lost)}</td>
      <td class="num" title={h.gpu_events.xid.map((x) => `XID ${x.code} on ${x.gpu_uuid}`).join("\n")}>
        {h.gpu_faults || <span class="muted">0</span>}
      </td>
      <td class="num" title={Object.entries(h.gpu_events.throttle_seconds).map(([r, s]) => `${r.replace(/_/g, " ")}: ${s.toFixed(0)} s`).join("\n")}>
        {h.throttle_seconds > 0 ? `${h.throttle_seconds.toFixed(0)} s` : <span class="muted">–</span>}
      </td>
      <td title={h.last_incident ?? ""}>{h.last_incident ? fmt.ago(h.last_incident) : <span class="muted">never</span>}</td>
      <td>{lead ? `${fmt.cause(lead.cause)} (${lead.jobs})` : "–"}</td>
      <td>
        <Sparkline values={h.incidents_by_day} label={`incidents per day on ${h.host}`} testId="sparkline" />
      </td>
    </tr>
  );
}
