// The dashboard's shell: top bar, routing, and the one-time API token prompt.
import "uplot/dist/uPlot.min.css";
import "./styles.css";

import { render } from "preact";
import { useEffect, useState } from "preact/hooks";

import { type Info, request, setToken, token } from "./api";
import { Link } from "./components/ui";
import { AUTH_NEEDED, usePoll } from "./data";
import { AlertsPage } from "./pages/Alerts";
import { HostPage } from "./pages/Host";
import { HostsPage } from "./pages/Hosts";
import { JobPage } from "./pages/Job";
import { JobsPage } from "./pages/Jobs";
import { WorkerPage } from "./pages/Worker";
import { parse, useLocation } from "./router";
import { ServerInfo } from "./serverInfo";

function App() {
  const { pathname, search } = useLocation();
  const route = parse(pathname);
  const [askToken, setAskToken] = useState(false);
  const [authEpoch, setAuthEpoch] = useState(0);
  const info = usePoll(() => request<Info>("/info"), `info|${authEpoch}`, 60_000);

  useEffect(() => {
    const ask = () => setAskToken(true);
    window.addEventListener(AUTH_NEEDED, ask);
    return () => window.removeEventListener(AUTH_NEEDED, ask);
  }, []);

  useEffect(() => {
    document.title =
      route.page === "job" ? `${route.jobId} · SMon` : route.page === "worker" ? `rank ${route.rank} · ${route.jobId} · SMon` : route.page === "alerts" ? "Alerts · SMon" : route.page === "hosts" ? "Hosts · SMon" : route.page === "host" ? `${route.host} · SMon` : "SMon";
  }, [pathname]);

  if (askToken) {
    return (
      <TokenPrompt
        onDone={() => {
          setAskToken(false);
          setAuthEpoch((n) => n + 1);
        }}
      />
    );
  }

  const i = info.data;
  // Remount pages after a new token so their requests start over.
  let page;
  if (route.page === "jobs") page = <JobsPage key={authEpoch} search={search} info={i} />;
  else if (route.page === "alerts") page = <AlertsPage key={authEpoch} search={search} info={i} />;
  else if (route.page === "hosts") page = <HostsPage key={authEpoch} search={search} info={i} />;
  else if (route.page === "host") page = <HostPage key={`${route.host}|${authEpoch}`} host={route.host} info={i} />;
  else if (route.page === "job") page = <JobPage key={`${route.jobId}|${authEpoch}`} jobId={route.jobId} search={search} info={i} />;
  else if (route.page === "worker") page = <WorkerPage key={`${route.jobId}|${route.rank}|${authEpoch}`} jobId={route.jobId} rank={route.rank} search={search} info={i} />;
  else
    page = (
      <main>
        <div class="empty">
          <h2>Nothing here</h2>
          <p>
            SMon has no page at <code>{route.path}</code>. <Link href="/">See all jobs</Link>.
          </p>
        </div>
      </main>
    );

  return (
    <>
      <header class="topbar">
        <Link href="/" class="brand">
          SMon
        </Link>
        <nav>
          <Link href="/" class={route.page === "jobs" || route.page === "job" || route.page === "worker" ? "active" : ""}>
            Jobs
          </Link>
          <Link href="/hosts" class={route.page === "hosts" || route.page === "host" ? "active" : ""}>
            Hosts
          </Link>
          <Link href="/alerts" class={route.page === "alerts" ? "active" : ""}>
            Alerts
          </Link>
          {i?.grafana_url && (
            <a href={i.grafana_url} target="_blank" rel="noopener noreferrer">
              Grafana ↗
            </a>
          )}
        </nav>
        <span class="topbar-right muted">
          {i ? `v${i.version}` : ""}
          {token() && (
            <button
              type="button"
              class="link"
              onClick={() => {
                setToken(null);
                setAskToken(true);
              }}
            >
              forget token
            </button>
          )}
        </span>
      </header>
      <ServerInfo.Provider value={i}>{page}</ServerInfo.Provider>
    </>
  );
}

function TokenPrompt({ onDone }: { onDone: () => void }) {
  const [value, setValue] = useState("");
  const [error, setError] = useState("");
  return (
    <main class="token-page">
      <form
        class="card token-form"
        data-testid="token-form"
        onSubmit={async (e) => {
          e.preventDefault();
          setToken(value.trim());
          try {
            await request("/info");
            onDone();
          } catch (err) {
            setToken(null);
            setError(err instanceof Error ? err.message : String(err));
          }
        }}
      >
        <h1>SMon</h1>
        <p>This server needs an API token (the value of its SMON_API_TOKEN). It is kept for this browser tab's session only.</p>
        <input type="password" autocomplete="current-password" aria-label="API token" value={value} onInput={(e) => setValue((e.target as HTMLInputElement).value)} autofocus />
        <button type="submit">Continue</button>
        {error && (
          <p class="error" role="alert">
            {error}
          </p>
        )}
      </form>
    </main>
  );
}

const root = document.getElementById("app");
if (root) render(<App />, root);
