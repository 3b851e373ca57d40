// Fetching with refresh: the last good data stays on screen while the next request runs, so a
// refreshing page never flashes or loses the reader's place.
import { useCallback, useEffect, useRef, useState } from "preact/hooks";

import { ApiError } from "./api";

export const AUTH_NEEDED = "smon:auth-needed";

export interface Loaded<T> {
  data: T | null;
  error: ApiError | null;
  loading: boolean;
  refresh: () => void;
}

/**
 * `load()` now and whenever `key` changes, and every `everyMs` while the tab is visible (0: once).
 * Responses to superseded keys are dropped, so a slow old answer never overwrites a newer view.
 * Until `enabled`, nothing is fetched: a page asks for what it draws first before the rest (a
 * browser runs six requests per server at once, and the server's answers share its cores).
 */
export function usePoll<T>(load: () => Promise<T>, key: string, everyMs = 0, enabled = true): Loaded<T> {
  const [data, setData] = useState<T | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [loading, setLoading] = useState(true);
  const generation = useRef(0);
  const current = useRef(load);
  current.current = load;
  const lastKey = useRef(key);

  const run = useCallback(() => {
    const mine = ++generation.current;
    setLoading(true);
    current
      .current()
      .then((value) => {
        if (mine !== generation.current) return;
        setData(value);
        setError(null);
      })
      .catch((err: unknown) => {
        if (mine !== generation.current) return;
        const apiError = err instanceof ApiError ? err : new ApiError(-1, String(err));
        if (apiError.needsToken) window.dispatchEvent(new Event(AUTH_NEEDED));
        setError(apiError);
      })
      .finally(() => {
        if (mine === generation.current) setLoading(false);
      });
  }, []);

  useEffect(() => {
    if (lastKey.current !== key) {
      lastKey.current = key;
      setData(null); // another view: do not show the old one's numbers under the new one's title
    }
    if (enabled) run();
  }, [key, enabled, run]);

  // The refresh timer, apart: a new interval (the server's settings arrived) does not refetch.
  useEffect(() => {
    if (!everyMs || !enabled) return undefined;
    const timer = window.setInterval(() => {
      if (document.visibilityState === "visible") run();
    }, everyMs);
    return () => window.clearInterval(timer);
  }, [everyMs, enabled, run]);

  return { data, error, loading, refresh: run };
}
