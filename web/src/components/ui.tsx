// Small building blocks every page uses. Text is always rendered as text (never as HTML), so
// strings agents send (job ids, hosts, phase names) cannot inject markup.
import type { ComponentChildren } from "preact";

import type { ApiError } from "../api";
import { onLinkClick } from "../router";
import { useServerInfo } from "../serverInfo";

export function Link({ href, children, class: cls, title }: { href: string; children: ComponentChildren; class?: string; title?: string }) {
  return (
    <a href={href} onClick={onLinkClick} class={cls} title={title}>
      {children}
    </a>
  );
}

export function StateBadge({ state }: { state: string }) {
  return <span class={`badge state-${state}`}>{state}</span>;
}

export function SlowdownBadge({ value }: { value: number | null }) {
  const straggling = useServerInfo()?.straggling_threshold ?? Infinity;
  if (value === null) return <span class="muted">not analysed yet</span>;
  const level = value >= 1.25 ? "bad" : value >= straggling ? "warn" : "ok";
  return <span class={`slowdown ${level}`}>{value.toFixed(3)}×</span>;
}

export function ErrorBanner({ error, what }: { error: ApiError | null; what: string }) {
  if (!error) return null;
  const hint =
    error.status === 0
      ? "Check that `smon server` is running and reachable from this browser."
      : error.status === 503 || error.status === 504
        ? "SMon keeps the last numbers on screen and retries on its own."
        : error.needsToken
          ? "This server needs an API token (SMON_API_TOKEN)."
          : "";
  return (
    <div class="error" role="alert">
      <strong>Could not load {what}:</strong> {error.message} {hint && <span class="muted">{hint}</span>}
    </div>
  );
}

export function Stat({ label, value, note, testId }: { label: string; value: ComponentChildren; note?: ComponentChildren; testId?: string }) {
  return (
    <div class="stat" data-testid={testId}>
      <div class="stat-label">{label}</div>
      <div class="stat-value">{value}</div>
      {note && <div class="stat-note">{note}</div>}
    </div>
  );
}

export function Section({ title, children, actions, id }: { title: string; children: ComponentChildren; actions?: ComponentChildren; id?: string }) {
  return (
    <section class="card" id={id}>
      <header class="card-head">
        <h2>{title}</h2>
        {actions && <div class="card-actions">{actions}</div>}
      </header>
      {children}
    </section>
  );
}

export function Loading({ what }: { what: string }) {
  return <div class="muted loading">Loading {what}…</div>;
}
