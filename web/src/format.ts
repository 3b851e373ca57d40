// How numbers read on screen. One place, so every page rounds the same way.

export function slowdown(s: number | null | undefined): string {
  return s === null || s === undefined ? "–" : `${s.toFixed(3)}×`;
}

export function percent(f: number | null | undefined, digits = 1): string {
  return f === null || f === undefined ? "–" : `${(f * 100).toFixed(digits)}%`;
}

export function hours(h: number | null | undefined): string {
  if (h === null || h === undefined) return "–";
  if (h >= 100) return h.toFixed(0);
  if (h >= 1) return h.toFixed(1);
  return h.toFixed(3);
}

export function money(amount: number): string {
  const digits = amount >= 100 ? 0 : 2; // $12,345 but $0.75, not $1
  return amount.toLocaleString(undefined, { style: "currency", currency: "USD", minimumFractionDigits: digits, maximumFractionDigits: digits });
}

export function seconds(s: number | null | undefined): string {
  if (s === null || s === undefined || Number.isNaN(s)) return "–";
  if (s >= 1) return `${s.toFixed(2)} s`;
  if (s >= 1e-3) return `${(s * 1e3).toFixed(1)} ms`;
  return `${(s * 1e6).toFixed(0)} µs`;
}

export function ago(iso: string | number | null | undefined, now = Date.now()): string {
  if (iso === null || iso === undefined) return "never";
  const t = typeof iso === "number" ? iso * 1000 : Date.parse(iso);
  const s = Math.max(0, (now - t) / 1000);
  if (s < 60) return `${s.toFixed(0)} s ago`;
  if (s < 3600) return `${(s / 60).toFixed(0)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} d ago`;
}

export function dateTime(iso: string | number | null | undefined): string {
  if (iso === null || iso === undefined) return "–";
  const d = typeof iso === "number" ? new Date(iso * 1000) : new Date(iso);
  return d.toLocaleString();
}

/** Cause names (DESIGN §5) as people say them. */
export function cause(name: string | null | undefined): string {
  if (!name) return "–";
  return name.replace(/_/g, " ");
}

/** A short line from an evidence object: its scalar fields, as `key value`. */
export function evidence(value: unknown, limit = 4): string {
  if (value === null || value === undefined) return "";
  if (typeof value !== "object") return String(value);
  const parts: string[] = [];
  for (const [key, v] of Object.entries(value as Record<string, unknown>)) {
    if (parts.length >= limit) break;
    if (typeof v === "number") parts.push(`${key.replace(/_/g, " ")} ${Number.isInteger(v) ? v : v.toFixed(3)}`);
    else if (typeof v === "string" || typeof v === "boolean") parts.push(`${key.replace(/_/g, " ")} ${v}`);
    else if (Array.isArray(v) && v.length <= 8 && v.every((x) => typeof x !== "object"))
      parts.push(`${key.replace(/_/g, " ")} ${v.join(", ")}`);
  }
  return parts.join(" · ");
}
