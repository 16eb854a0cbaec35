/**
 * Words for people: waits, positions, reasons and states as sentences.
 *
 * Pure functions (no DOM, no JupyterLab), so they are unit-tested in node.
 */

import type {
  EstimatedWait,
  GpuKernelInfo,
  GpuRequest,
  Position,
  TenantUsage
} from './types';

/** 1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st... */
export function ordinal(n: number): string {
  const mod100 = n % 100;
  if (mod100 >= 11 && mod100 <= 13) {
    return `${n}th`;
  }
  switch (n % 10) {
    case 1:
      return `${n}st`;
    case 2:
      return `${n}nd`;
    case 3:
      return `${n}rd`;
    default:
      return `${n}th`;
  }
}

function plural(n: number, word: string, many = `${word}s`): string {
  return `${n} ${n === 1 ? word : many}`;
}

/** A duration in words: "45 s", "6 min", "1 h 20 min", "2 days". Never "0.0 seconds". */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 1) {
    return 'under a second';
  }
  if (s < 90) {
    return `${s} s`;
  }
  const minutes = Math.round(s / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  const hours = Math.floor(minutes / 60);
  const rest = minutes % 60;
  if (hours < 48) {
    return rest ? `${hours} h ${rest} min` : `${hours} h`;
  }
  return plural(Math.round(hours / 24), 'day');
}

/** "about 4 min", "4–9 min", "any moment now", or why there is no estimate. */
export function formatWait(wait: EstimatedWait | null | undefined): string {
  if (!wait) {
    return 'no estimate yet';
  }
  if (wait.seconds === null || wait.seconds === undefined) {
    return wait.basis ? `unknown (${lowerFirst(wait.basis)})` : 'no estimate yet';
  }
  if (wait.seconds < 5) {
    return 'any moment now';
  }
  if (
    typeof wait.low === 'number' &&
    typeof wait.high === 'number' &&
    wait.high > wait.low &&
    duration(wait.low) !== duration(wait.high)
  ) {
    return `between ${duration(wait.low)} and ${duration(wait.high)}`;
  }
  return `about ${duration(wait.seconds)}`;
}

/** "2nd of 3 in vision, 4th of 9 overall". */
export function formatPosition(pos: Position | null | undefined, tenant: string): string {
  if (!pos) {
    return 'waiting for its place in the queue';
  }
  const mine = `${ordinal(pos.tenant)} of ${pos.tenant_of} in ${tenant}`;
  if (pos.of === pos.tenant_of && pos.overall === pos.tenant) {
    return `${mine} (the only team waiting)`;
  }
  return `${mine}, ${ordinal(pos.overall)} of ${pos.of} overall`;
}

/** One word for what a queued request waits on: quota, capacity or its turn. */
export function waitKind(req: GpuRequest): string {
  const kind = req.waiting_for?.kind;
  if (kind === 'fifo') {
    return 'turn';
  }
  if (kind) {
    return kind;
  }
  return (req.position?.tenant ?? 1) > 1 ? 'turn' : 'quota';
}

/** Why a queued request waits, as one sentence. */
export function waitReason(req: GpuRequest): string {
  if (req.waiting_for?.message) {
    return req.waiting_for.message;
  }
  const gpus = gpuWords(req.gpus, req.flavor);
  const ahead = (req.position?.tenant ?? 1) - 1;
  if (ahead > 0) {
    return `${plural(ahead, 'earlier request')} of ${req.tenant} ${
      ahead === 1 ? 'is' : 'are'
    } ahead of it.`;
  }
  if (req.scaling) {
    return `No ${req.scaling.flavor} GPU is free; ${plural(
      req.scaling.nodes,
      'node'
    )} being added.`;
  }
  return `Waiting for ${gpus} to free up within ${req.tenant}'s quota.`;
}

/**
 * Which of a preempted request's GPUs were wanted, counted as the gateway's ending says
 * (jupyter_gpuaas/words.py `gpus_taken`): "its GPU", "its 4 GPUs", "1 of its 4 GPUs";
 * `needed` the preemptor's size (null: unknown).
 */
export function gpusTaken(gpus: number, needed: number | null = null, whose = 'its'): string {
  if (gpus === 1) {
    return `${whose} GPU`;
  }
  if (needed !== null && needed > 0 && needed < gpus) {
    return `${needed} of ${whose} ${gpus} GPUs`;
  }
  return `${whose} ${gpus} GPUs`;
}

/** "1 a100 GPU", "2 GPUs". */
export function gpuWords(gpus: number, flavor?: string | null): string {
  return `${gpus} ${flavor ? `${flavor} ` : ''}${gpus === 1 ? 'GPU' : 'GPUs'}`;
}

const STATE_WORDS: Record<string, string> = {
  queued: 'queued',
  admitted: 'running',
  parked: 'parked',
  culled: 'culled',
  finished: 'finished',
  cancelled: 'cancelled',
  rejected: 'rejected',
  preempted: 'preempted',
  expired: 'expired',
  failed: 'failed'
};

export function stateWords(state: string): string {
  return STATE_WORDS[state] ?? state;
}

/** The state a "My work" row shows. The gateway ends a job's request as "finished"
 * whether the notebook ran through or raised: the job's own state says which, so a failed
 * job's row says "failed", as its row under Jobs does. A parked reservation that ran out
 * ends in the gateway's state "culled" with the reason "expired: …": what happened last
 * is the expiry, so its badge says "expired", as its sentence does. */
export function rowState(req: GpuRequest, job?: { state: string }): string {
  if (req.state === 'finished' && job?.state === 'failed') {
    return 'failed';
  }
  if (req.state === 'culled' && (req.reason ?? '').startsWith('expired:')) {
    return 'expired';
  }
  return req.state;
}

/** The terminal gateway states: nothing more will happen to such a request. */
export const ENDED_STATES = ['finished', 'cancelled', 'rejected', 'culled', 'expired', 'preempted'];

export function isEnded(state: string): boolean {
  return ENDED_STATES.includes(state);
}

/**
 * What happened to an ended request, in a few words for its history row: "succeeded",
 * "cancelled by you", "cancelled by an admin (root)", "preempted: nlp took back its GPU".
 * From the gateway's reason (jupyter_gpuaas/words.py `ended_words` says the same), `me`
 * the reader, and a job's own state (the gateway ends a failed job as "finished" too).
 */
export function endedWords(r: GpuRequest, me: string | null, jobState?: string): string {
  const reason = r.reason ?? '';
  if (jobState === 'succeeded' || jobState === 'failed') {
    return jobState; // the job's own end, whoever released its GPU after it
  }
  const by = /^(cancelled|released) by (.+)$/.exec(reason);
  if (by) {
    const who = me !== null && by[2] === me ? 'you' : by[2];
    return `${by[1] === 'cancelled' || r.state === 'cancelled' ? 'cancelled' : 'stopped'} by ${who}`;
  }
  if (/^(preempted|culled|expired):/.test(reason)) {
    return reason;
  }
  if (reason === 'lease expired') {
    return 'lost: it stopped answering the gateway';
  }
  if (reason.startsWith('reservation claimed by')) {
    return 'resumed by a new request';
  }
  switch (r.state) {
    case 'rejected':
      return reason ? `refused: ${reason}` : 'refused';
    case 'cancelled':
      return 'cancelled';
    case 'culled':
      return 'culled: idle';
    case 'preempted':
      return 'preempted';
    case 'finished':
      return r.kind === 'job' ? 'succeeded' : reason || 'finished';
    default:
      return reason || r.state;
  }
}

/** "vision uses 3 of its 4 a100: 2 of its own and 1 borrowed; 1 parked; 2 waiting". */
export function quotaSentence(tenant: string, u: TenantUsage): string {
  const own = Math.min(u.admitted, u.quota);
  const parts = [
    `${tenant} uses ${u.admitted} ${u.flavor} of its ${u.quota}` +
      (u.borrowed > 0 ? `: ${own} of its own and ${u.borrowed} borrowed` : '')
  ];
  if (u.parked > 0) {
    parts.push(`${u.parked} parked`);
  }
  const lendable = lendableOf(u);
  if (lendable > 0) {
    parts.push(`${lendable} free to lend`);
  }
  if (u.pending_requests > 0) {
    parts.push(
      `${plural(u.pending_requests, 'request')} waiting for ${plural(u.pending_gpus, 'GPU')}`
    );
  } else {
    parts.push('nothing waiting');
  }
  return parts.join('; ');
}

/** The usage row's sentence: the gateway's `message` (newer gateways), else ours. */
export function usageSentence(tenant: string, u: TenantUsage): string {
  if (!u.message) {
    return `${quotaSentence(tenant, u)}.`;
  }
  let text = u.message.replace(/[.]$/, '');
  if (u.pending_requests > 0 && !/wait/.test(text)) {
    text += `; ${plural(u.pending_requests, 'request')} waiting for ${plural(u.pending_gpus, 'GPU')}`;
  }
  return `${text}.`;
}

/** Nominal quota neither used nor parked: what others in the cohort may borrow. */
export function lendableOf(u: TenantUsage, lendingLimit?: number): number {
  const own = Math.min(u.admitted, u.quota);
  const free = Math.max(0, u.quota - own - u.parked);
  return lendingLimit === undefined ? free : Math.min(free, lendingLimit);
}

export function percent(ratio: number | null | undefined): string {
  if (ratio === null || ratio === undefined || Number.isNaN(ratio)) {
    return 'n/a';
  }
  return `${Math.round(ratio * 100)}%`;
}

export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined) {
    return 'n/a';
  }
  const gib = n / 2 ** 30;
  if (gib >= 1) {
    return `${gib >= 10 ? gib.toFixed(0) : gib.toFixed(1)} GiB`;
  }
  return `${Math.round(n / 2 ** 20)} MiB`;
}

/**
 * The status-bar text of a notebook's GPU kernel, e.g. "GPU: queued 3rd (quota)",
 * "GPU: a100 ×1 · 43%", "GPU: idle 24 min · culled in 6 min".
 */
export function statusText(
  kernel: GpuKernelInfo | null,
  req: GpuRequest | null,
  idleTimeout: number | null,
  now: number
): string {
  if (!kernel) {
    return '';
  }
  const state = kernel.state;
  if (state === 'deferred') {
    // A notebook's kernel that asks for its GPU at its first cell run: the server's words.
    return kernel.message ?? '';
  }
  if (state === 'submitting') {
    return 'GPU: asking for a GPU…';
  }
  if (state === 'queued' || state === 'parked') {
    const pos = req?.position ?? kernel.position;
    const place = pos ? `${ordinal(pos.overall)} ` : '';
    const kind = req ? waitKind(req) : 'quota';
    return `GPU: queued ${place}(${kind})`;
  }
  if (state === 'admitted') {
    return 'GPU: starting on its GPU…';
  }
  if (state === 'running') {
    const label = `${kernel.flavor ?? 'GPU'} ×${kernel.devices.length || kernel.gpus}`;
    // A preemption warning outranks the rest: the kernel is stopped at that time.
    const preemptAt =
      typeof req?.preempt_at === 'number' ? req.preempt_at : kernel.warning?.preempt_at;
    if (typeof preemptAt === 'number' && (!req || req.state === 'admitted')) {
      return `GPU: ${label} · reclaimed in ${duration(preemptAt - now)}`;
    }
    if (kernel.idle_since !== null && kernel.idle_since !== undefined) {
      const idle = now - kernel.idle_since;
      let text = `GPU: ${label} · idle ${duration(idle)}`;
      const cullAt =
        (typeof kernel.warning?.preempt_at === 'number' ? null : kernel.warning?.cull_at) ??
        (idleTimeout && idleTimeout > 0 ? kernel.idle_since + idleTimeout : null);
      if (cullAt) {
        text += ` · culled in ${duration(cullAt - now)}`;
      }
      return text;
    }
    const util = kernel.utilization;
    return util === null || util === undefined
      ? `GPU: ${label} · busy`
      : `GPU: ${label} · ${percent(util)}`;
  }
  return `GPU: ${state}${kernel.reason ? ` (${kernel.reason})` : ''}`;
}

function lowerFirst(text: string): string {
  return text ? text[0].toLowerCase() + text.slice(1) : text;
}

/** An error body of the gateway or the server as one sentence, never raw JSON. */
export function errorSentence(status: number, body: unknown): string {
  if (status === 502 || status === 0) {
    return 'GPU service unreachable — retrying.';
  }
  if (body && typeof body === 'object' && 'error' in body) {
    const err = (body as { error: unknown; field?: unknown }).error;
    if (typeof err === 'string' && err) {
      // The field is told by where the sentence is shown (beside it), not appended.
      const text = err[0].toUpperCase() + err.slice(1);
      return /[.!?]$/.test(text) ? text : `${text}.`;
    }
  }
  if (status === 503) {
    return 'GPU service unreachable — retrying.';
  }
  return `The server answered ${status}.`;
}
