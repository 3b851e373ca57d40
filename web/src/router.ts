// Routes and page state live in the URL (DESIGN §6), so a link pasted into an incident restores the view.
import { useEffect, useState } from "preact/hooks";

export type Route =
  | { page: "jobs" }
  | { page: "alerts" }
  | { page: "hosts" }
  | { page: "host"; host: string }
  | { page: "job"; jobId: string }
  | { page: "worker"; jobId: string; rank: number }
  | { page: "missing"; path: string };

export function parse(pathname: string): Route {
  const parts = pathname.split("/").filter((p) => p !== "");
  if (parts.length === 0) return { page: "jobs" };
  if (parts.length === 1 && parts[0] === "alerts") return { page: "alerts" };
  if (parts.length === 1 && parts[0] === "hosts") return { page: "hosts" };
  if (parts.length === 2 && parts[0] === "hosts") {
    try {
      return { page: "host", host: decodeURIComponent(parts[1]) };
    } catch {
      return { page: "missing", path: pathname };
    }
  }
  if (parts[0] === "jobs" && parts.length >= 2) {
    let jobId: string;
    try {
      jobId = decodeURIComponent(parts[1]);
    } catch {
      return { page: "missing", path: pathname };
    }
    if (parts.length === 2) return { page: "job", jobId };
    if (parts.length === 4 && parts[2] === "workers" && /^\d+$/.test(parts[3])) {
      return { page: "worker", jobId, rank: Number(parts[3]) };
    }
  }
  return { page: "missing", path: pathname };
}

const CHANGE = "smon:navigate";

/** Go to `href` (same origin) without reloading; `replace` keeps the history entry (filters, zoom). */
export function navigate(href: string, replace = false): void {
  if (href === location.pathname + location.search) return;
  if (replace) history.replaceState(null, "", href);
  else history.pushState(null, "", href);
  window.dispatchEvent(new Event(CHANGE));
}

export function useLocation(): { pathname: string; search: URLSearchParams } {
  const read = () => ({ pathname: location.pathname, search: new URLSearchParams(location.search) });
  const [loc, setLoc] = useState(read);
  useEffect(() => {
    const update = () => setLoc(read());
    window.addEventListener("popstate", update);
    window.addEventListener(CHANGE, update);
    return () => {
      window.removeEventListener("popstate", update);
      window.removeEventListener(CHANGE, update);
    };
  }, []);
  return loc;
}

/** The current URL with `changes` applied to its query (null or "" removes a key). */
export function withQuery(changes: Record<string, string | number | null | undefined>): string {
  const query = new URLSearchParams(location.search);
  for (const [key, value] of Object.entries(changes)) {
    if (value === null || value === undefined || value === "") query.delete(key);
    else query.set(key, String(value));
  }
  const qs = query.toString();
  return location.pathname + (qs ? `?${qs}` : "");
}

/** An in-app link: a real <a href> (open in a new tab works), followed without a reload. */
export function onLinkClick(event: MouseEvent): void {
  const anchor = (event.currentTarget as HTMLAnchorElement | null) ?? null;
  if (!anchor || event.defaultPrevented || event.button !== 0) return;
  if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  event.preventDefault();
  navigate(anchor.getAttribute("href") ?? "/");
}

export function intParam(search: URLSearchParams, key: string): number | null {
  const raw = search.get(key);
  if (raw === null || !/^\d+$/.test(raw)) return null;
  return Number(raw);
}
