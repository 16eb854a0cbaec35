/** The JSON shapes of the gateway (through /gpuaas/api/) and of this server's routes. */

export interface Position {
  tenant: number;
  tenant_of: number;
  overall: number;
  of: number;
}

export interface EstimatedWait {
  seconds: number | null;
  low?: number | null;
  high?: number | null;
  basis?: string;
  /** "high": known times only (culls); "low": few past grants to go by. */
  confidence?: 'high' | 'medium' | 'low';
}

export interface Grant {
  flavor?: string | null;
  node: string | null;
  devices: number[];
  lease_expires?: number | null;
  admitted_at?: number | null;
  busy?: boolean | null;
  utilization?: number | null;
}

/** `GET api/requests/{id}` of the gateway. */
export interface GpuRequest {
  id: string;
  user: string;
  tenant: string;
  kind: string; // server | kernel | job
  gpus: number;
  flavor: string | null;
  priority: number;
  name?: string | null;
  state: string;
  submit_time?: number | null;
  admitted_at?: number | null;
  reason?: string | null;
  position: Position | null;
  estimated_wait: EstimatedWait | null;
  grant: Grant | null;
  waiting_for?: { kind: string; message: string } | null;
  /** A warned preemption victim (preemption_grace): stopped at `preempt_at` for
   * `preempted_by`, and why in words ("nlp is reclaiming its GPU"). Older gateways: absent. */
  preempt_at?: number | null;
  preempted_by?: string | null;
  preempt_reason?: string | null;
  scaling?: { flavor: string; nodes: number; ready_by?: number } | null;
  parked?: { flavor: string | null; expires: number | null } | null;
}

export interface TenantUsage {
  flavor: string;
  quota: number;
  admitted: number;
  parked: number;
  borrowed: number;
  pending_gpus: number;
  pending_requests: number;
  /** The usage in one sentence (newer gateways), and the tenants it borrows from. */
  message?: string;
  borrowed_from?: string[];
}

export interface Tenant {
  name: string;
  cohort?: string | null;
  quota: Record<string, number>;
  lending_limit?: Record<string, number>;
  borrowing_limit?: Record<string, number>;
  idle_timeout?: number;
  usage: TenantUsage[];
}

export interface Device {
  node: string;
  index: number;
  flavor?: string;
  name?: string;
  memory_total?: number;
  utilization?: number | null;
  memory_used?: number | null;
  temperature?: number | null;
  healthy?: boolean | null;
  error?: string | null;
  holder: { id: string; user?: string | null; tenant: string; kind: string } | null;
}

/** `GET api/me`: who the server's token is, and the tenants it may charge. */
export interface Me {
  name: string;
  groups: string[];
  use: boolean;
  view: boolean;
  admin: boolean;
  tenants: string[];
}

/** One record of `/gpuaas/kernels` (this server's GPU kernels). */
export interface GpuKernelInfo {
  kernel_id: string;
  kernel_name: string;
  request_id: string | null;
  state: string;
  gpus: number;
  flavor: string | null;
  tenant: string | null;
  position: Position | null;
  node: string | null;
  devices: number[];
  reason: string | null;
  /** Where it stands, in the server's words (a `deferred` kernel: it takes a GPU when a cell runs). */
  message?: string;
  /** A cull warning (`cull_at`) or a preemption warning (`preempt_at`). */
  warning: { message: string; cull_at?: number | null; preempt_at?: number | null; t: number } | null;
  utilization: number | null;
  idle_since: number | null;
  created: number;
  ended: number | null;
}

/** One job of `/gpuaas/sidebar/jobs` (a `/gpuaas/jobs` record with server-relative paths). */
export interface Job {
  id: string;
  kind: string;
  name: string;
  tenant: string;
  gpus: number;
  flavor: string | null;
  priority: number;
  state: string; // queued starting running succeeded failed cancelled
  reason: string | null;
  exit_status: number | null;
  position: Position | null;
  source: string | null;
  source_path: string | null;
  output_path: string | null;
  log_path: string | null;
  parameters: Record<string, unknown>;
  created: number;
  started: number | null;
  ended: number | null;
}

/** An SSE event of the gateway: its name and its JSON data. */
export interface GatewayEvent {
  name: string;
  data: {
    t?: number;
    id?: string;
    request?: GpuRequest;
    cull_at?: number;
    [key: string]: unknown;
  };
}

/** One piece of `GET api/advice`: a sentence about whom, and why it is believed. */
export interface Advice {
  kind: 'smaller_gpu' | 'move_quota';
  subject: string;
  tenant: string;
  flavor: string;
  sentence: string;
  evidence: Record<string, unknown>;
}

/** `GET api/advice`: a user sees only the advice about their own work. */
export interface AdviceAnswer {
  advice: Advice[];
  since: number;
  until: number;
  requests: number;
  min_grants: number;
  /** The last answer, given while a fresher one is worked out (advice_deadline). */
  stale?: boolean;
}
