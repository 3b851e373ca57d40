// The public REST API (DESIGN §6), typed as the pages read it. Data reaches the pages only here.

export interface Job {
  job_id: string;
  attempt: number; // the newest attempt of the job (a restart under the same id is a new one)
  attempts: number;
  state: string;
  world_size: number;
  last_step: number | null;
  slowdown: number | null;
  waste_fraction: number | null;
  gpu_hours_wasted: number;
  first_seen: string;
  last_seen: string;
  stragglers: number;
  worst_rank: number | null;
  leading_cause: string | null;
  computed_at: string | null;
}

/** One attempt of a job (`GET /jobs/{id}/attempts`): a run under the job id, numbered from 1. */
export interface Attempt {
  attempt: number;
  state: string;
  world_size: number;
  last_step: number | null;
  slowdown: number | null;
  gpu_hours_wasted: number;
  first_seen: string;
  last_seen: string;
  reported_attempt: number | null;
}

/** The figures of one run: a job's newest attempt (a jobs-list row) or any attempt. */
export type Run = Pick<Job, "world_size" | "last_step" | "gpu_hours_wasted" | "first_seen" | "last_seen">;

/** GPU-hours the job (attempt) has run: every rank from its first report to its last. */
export function gpuHours(job: Run): number {
  return (job.world_size * Math.max(0, Date.parse(job.last_seen) - Date.parse(job.first_seen))) / 3.6e6;
}

export interface JobsPage {
  jobs: Job[];
  total: number;
  limit: number;
  offset: number;
}

export interface Straggler {
  rank: number;
  host: string;
  dp_rank: number;
  stage: number;
  slowdown: number;
  cause: string | null;
  evidence: Record<string, unknown>;
}

export interface Diagnosis {
  cause: string;
  share: number;
  confidence: number;
  evidence: unknown;
  recommendation: string;
}

export interface Summary {
  job_id: string;
  attempt: number;
  attempts: number;
  state: string;
  world_size: number;
  steps_seen: number;
  from_step: number | null;
  to_step: number | null;
  warmup_steps: number;
  estimator: string;
  slowdown: number | null;
  waste_fraction: number | null;
  gpu_hours_wasted: number;
  ideal_step_time: number | null;
  noise_floor: number | null;
  simulation_discrepancy: number | null;
  discrepancy_flagged: boolean;
  m_w: number | null;
  m_s: number | null;
  attribution: { by_op_type: Record<string, number>; by_dp_rank: Record<string, number>; by_stage: Record<string, number> };
  stragglers: Straggler[];
  diagnoses: Diagnosis[];
  recent: { from_step: number | null; to_step: number | null; steps_seen: number; slowdown: number | null; stragglers: Straggler[] } | null;
  computed_at: string | null;
  analysis_state?: "ok" | "failed";
  analysis_error?: string | null;
  analysis_failed_at?: string | null;
  data_quality_notes?: { kind: string; count: number; message: string }[];
}

export interface StepPoint {
  step: number;
  step_time: number;
  ideal_time: number;
  slowdown: number;
}

export interface TrendPoint {
  from_step: number;
  to_step: number;
  steps: number;
  start_time: string | null;
  end_time: string | null;
  step_time: number;
  ideal_time: number;
  slowdown: number | null;
  stragglers: number[];
  leading_cause: string;
}

export interface Heatmap {
  job_id: string;
  metric: string;
  ranks: number[];
  steps: number[];
  values: (number | null)[][];
  downsampled: boolean;
  rank_ranges: number[][] | null;
  step_ranges: number[][] | null;
  values_f32?: string | null;
}

/** A heatmap's cells as one float32 array (row-major, NaN where none): no per-cell objects. */
export interface HeatGrid extends Omit<Heatmap, "values" | "values_f32"> {
  cells: Float32Array;
}

export function decodeHeatmap(h: Heatmap): HeatGrid {
  const { values, values_f32, ...rest } = h;
  let cells: Float32Array;
  if (values_f32) {
    const raw = atob(values_f32);
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    cells = new Float32Array(bytes.buffer); // little-endian, as every browser platform is
  } else {
    cells = new Float32Array(h.ranks.length * h.steps.length);
    values.forEach((row, i) => row.forEach((v, j) => (cells[i * h.steps.length + j] = v === null ? NaN : v)));
  }
  return { ...rest, cells };
}

export interface WorkerGrid {
  dp_ranks: number[];
  stages: number[];
  values: (number | null)[][];
}

export interface RankInfo {
  rank: number;
  host: string;
  local_rank: number;
  dp_rank: number;
  stage: number;
  tp_rank: number;
  gpu_uuid: string;
}

export interface GpuSample {
  time: number;
  gpu_index: number;
  gpu_uuid: string;
  sm_clock_mhz: number | null;
  sm_clock_max_mhz: number | null;
  gpu_util: number | null;
  mem_used_bytes: number | null;
  temperature_c: number | null;
  power_w: number | null;
  power_limit_w: number | null;
  throttle_reasons: number | null;
  ecc_corrected: number | null;
  ecc_uncorrected: number | null;
  xid_events: number[];
}

export interface Worker {
  job_id: string;
  attempt: number;
  attempts: number;
  rank: number;
  host: string;
  dp_rank: number;
  stage: number;
  tp_rank: number;
  gpu_uuid: string;
  slowdown: number | null;
  last_heartbeat: { time: number; last_step: number | null; current_step: number | null; phase: string | null; phase_since: number | null } | null;
  steps: { step: number; start_time: number; duration: number; phases: Record<string, number>; slowdown: number | null }[];
  gpu: GpuSample[];
}

export interface Alert {
  id: number;
  dedup_key: string;
  rule: string;
  job_id: string;
  host: string;
  severity: string;
  state: string;
  summary: string;
  details: Record<string, unknown>;
  started_at: string | null;
  fired_at: string | null;
  resolved_at: string | null;
  acked_at: string | null;
  acked_by: string;
  silenced: boolean;
}

export interface Silence {
  id: number;
  matchers: Record<string, string>;
  starts_at: string | null;
  ends_at: string | null;
  created_by: string;
  comment: string;
  active: boolean;
}

export interface Info {
  version: string;
  gpu_hour_price: number;
  grafana_url: string | null;
  analysis_interval: number;
  stall_seconds: number;
  ingest_address: string;
  phases: string[];
}

/** What went wrong, in words an on-call engineer can act on. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
  get needsToken(): boolean {
    return this.status === 401 || this.status === 403;
  }
}

const TOKEN_KEY = "smon.api-token";

export function token(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value: string | null): void {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

type Params = Record<string, string | number | boolean | null | undefined>;

export function url(path: string, params: Params = {}): string {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") query.set(key, String(value));
  }
  const qs = query.toString();
  return `/api/v1${path}${qs ? `?${qs}` : ""}`;
}

/** A path segment holding a job id: ids may hold `/`, `?`, `#` and anything else agents send. */
export function jobPath(jobId: string): string {
  return `/jobs/${encodeURIComponent(jobId)}`;
}

export async function request<T>(path: string, params: Params = {}, init: RequestInit = {}): Promise<T> {
  const headers = new Headers(init.headers);
  headers.set("Accept", "application/json");
  const bearer = token();
  if (bearer) headers.set("Authorization", `Bearer ${bearer}`);
  if (init.body) headers.set("Content-Type", "application/json");
  let response: Response;
  try {
    response = await fetch(url(path, params), { ...init, headers });
  } catch {
    throw new ApiError(0, "Cannot reach the SMon server. Is it running? Retrying.");
  }
  if (!response.ok) {
    let detail = response.statusText;
    try {
      const body = (await response.json()) as { detail?: unknown };
      if (typeof body.detail === "string") detail = body.detail;
      else if (body.detail) detail = JSON.stringify(body.detail);
    } catch {
      // not JSON: keep the status text
    }
    if (response.status === 503) detail = `The server's database is unavailable (${detail}). Retrying.`;
    throw new ApiError(response.status, detail);
  }
  return (await response.json()) as T;
}

/** The fleet view (`GET /hosts`, `GET /hosts/{host}`): which hosts keep slowing jobs. */
export interface GpuEventTotals {
  xid_count: number;
  ecc_uncorrected: number;
  throttle_seconds: Record<string, number>;
}

export interface HostGpuEvents extends GpuEventTotals {
  xid: { code: number; time: string; gpu_uuid: string }[];
  gpus?: Record<string, GpuEventTotals>; // on the host page only
}

export interface Host {
  host: string;
  jobs: number;
  straggler_jobs: number;
  gpu_hours_lost: number;
  causes: { cause: string; jobs: number }[];
  gpu_events: HostGpuEvents;
  gpu_faults: number;
  throttle_seconds: number;
  suspect: boolean;
  suspect_jobs: number;
  last_incident: string | null;
  incidents_by_day: number[];
  first_seen: string | null;
  last_seen: string | null;
}

export interface HostsPage {
  hosts: Host[];
  total: number;
  limit: number;
  offset: number;
  since: string;
}

export interface HostIncident {
  job_id: string;
  attempt: number;
  rank: number;
  gpu_uuid: string;
  cause: string;
  slowdown: number;
  job_slowdown: number | null;
  gpu_hours_lost: number;
  evidence: Record<string, unknown>;
  first_seen: string;
  last_seen: string;
  counts_toward_suspect: boolean;
  link: string;
}

export interface HostGpuEvent {
  time: string;
  kind: "xid" | "ecc_uncorrected" | "throttle";
  code: number | null;
  reason: string | null;
  value: number;
  job_id: string;
  rank: number;
}

export interface HostDetail extends Host {
  since: string;
  verdict: string;
  recommendation: string | null;
  rule: { min_jobs: number; days: number };
  incidents: HostIncident[];
  jobs_run: { job_id: string; attempt: number; ranks: number; first_seen: string; last_seen: string }[];
  gpus: { gpu_uuid: string; events: HostGpuEvent[] }[];
}

export function hostPath(host: string): string {
  return `/hosts/${encodeURIComponent(host)}`;
}
