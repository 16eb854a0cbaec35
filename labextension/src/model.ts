/**
 * The sidebar's state: my requests, this server's GPU kernels, my tenants, the devices and
 * my jobs, kept current from snapshots (REST) and the gateway's events (SSE).
 *
 * Pure TypeScript (no DOM, no JupyterLab): `applyEvent` is a function of the state and one
 * event, returning what changed (keys of rows, so each view redraws only those rows) and
 * what to tell the user (notifications). Unit-tested in node.
 */

import { duration, endedWords, gpusTaken, gpuWords, isEnded, ordinal } from './format';
import type {
  AdviceAnswer,
  Device,
  GatewayEvent,
  GpuKernelInfo,
  GpuRequest,
  Job,
  Me,
  Tenant
} from './types';

export type Section = 'work' | 'quota' | 'devices' | 'jobs' | 'connection' | 'advice';

/** What changed: a section and the keys of its rows (empty: redraw the whole section). */
export interface Change {
  section: Section;
  keys: string[];
}

export interface Notice {
  kind:
    | 'admitted'
    | 'cull_warning'
    | 'culled'
    | 'preempt_warning'
    | 'preempt_withdrawn'
    | 'preempted'
    | 'job_done'
    | 'job_failed';
  requestId: string;
  message: string;
  /** For a cull warning: when the cull happens (epoch seconds). */
  cullAt?: number | null;
}

export type Connection = 'connecting' | 'live' | 'polling' | 'unreachable';

/** A warned preemption victim of mine: stopped at `at` (epoch seconds), and why. */
export interface Preemption {
  at: number | null;
  by: string | null;
  reason: string;
}

export interface Warning {
  cullAt: number | null;
  t: number;
  kept: boolean;
}

/** How many ended requests of mine "My work" keeps showing. */
export const ENDED_KEPT = 5;

export class GpuModel {
  me: Me | null = null;
  requests = new Map<string, GpuRequest>();
  /** This server's GPU kernels by request id (kernels without one yet: by kernel id). */
  kernels = new Map<string, GpuKernelInfo>();
  /** Notebook path of each kernel id (from the sessions API). */
  notebooks = new Map<string, string>();
  /**
   * The notebook or file each request of mine is for, by request id, kept once seen: a
   * kernel that ended (preempted, culled) has no session any more, but its row and its
   * toasts still say which notebook it was.
   */
  titles = new Map<string, string>();
  tenants: Tenant[] = [];
  devices: Device[] = [];
  simulated = false;
  /** My advice (`GET api/advice`), the last one read; and why the last read failed. */
  advice: AdviceAnswer | null = null;
  adviceError = '';
  jobs = new Map<string, Job>();
  warnings = new Map<string, Warning>();
  /** My requests under a preemption warning, by request id. */
  preemptions = new Map<string, Preemption>();
  /** How a preempted request of mine ended, in words ("stopped: nlp is reclaiming its GPU"). */
  stopped = new Map<string, string>();
  /** `id@at` of the preemption warnings already told (one notification per warning). */
  private told = new Set<string>();
  /** The log tail of each job (read while it runs, once more after it ended). */
  logs = new Map<string, string>();
  connection: Connection = 'connecting';
  error = '';

  private listeners: Array<(changes: Change[]) => void> = [];

  onChange(listener: (changes: Change[]) => void): () => void {
    this.listeners.push(listener);
    return () => {
      this.listeners = this.listeners.filter(l => l !== listener);
    };
  }

  emit(changes: Change[]): void {
    if (!changes.length) {
      return;
    }
    for (const listener of [...this.listeners]) {
      listener(changes);
    }
  }

  // ------------------------------------------------------------------ snapshots

  setMe(me: Me): void {
    this.me = me;
  }

  /** My requests from `GET api/requests` (replaces what was known). */
  setRequests(list: GpuRequest[]): Change[] {
    const mine = list.filter(r => this.isMine(r));
    const before = new Set(this.requests.keys());
    const next = new Map<string, GpuRequest>();
    for (const r of mine) {
      next.set(r.id, r);
    }
    // Requests that ended since, and are no longer listed, stay as ended rows.
    for (const [id, r] of this.requests) {
      if (!next.has(id) && isEnded(r.state)) {
        next.set(id, r);
      }
    }
    this.requests = next;
    this.trimEnded();
    for (const id of before) {
      if (!this.requests.has(id)) {
        this.warnings.delete(id);
      }
    }
    for (const id of new Set([...this.preemptions.keys(), ...this.requests.keys()])) {
      this.syncPreemption(id);
    }
    return [{ section: 'work', keys: [] }];
  }

  setKernels(list: GpuKernelInfo[]): Change[] {
    const keys: string[] = [];
    const next = new Map<string, GpuKernelInfo>();
    for (const k of list) {
      const key = k.request_id ?? k.kernel_id;
      if (next.has(key)) {
        continue; // the live record comes first; older ones of the same request follow
      }
      next.set(key, k);
      this.rememberTitle(k);
      const old = this.kernels.get(key);
      if (!old || JSON.stringify(old) !== JSON.stringify(k)) {
        keys.push(key);
      }
      const culling = k.warning && typeof k.warning.preempt_at !== 'number';
      if (culling && k.warning && k.request_id && !this.warnings.has(k.request_id)) {
        this.warnings.set(k.request_id, {
          cullAt: k.warning.cull_at ?? null,
          t: k.warning.t,
          kept: false
        });
      }
      if (!k.warning && k.request_id && k.idle_since === null) {
        this.warnings.delete(k.request_id); // busy again: the warning is over
      }
    }
    for (const key of this.kernels.keys()) {
      if (!next.has(key)) {
        keys.push(key);
      }
    }
    this.kernels = next;
    return keys.length ? [{ section: 'work', keys }] : [];
  }

  setNotebooks(paths: Map<string, string>): Change[] {
    const changed: string[] = [];
    for (const [key, k] of this.kernels) {
      if (this.notebooks.get(k.kernel_id) !== paths.get(k.kernel_id)) {
        changed.push(key);
      }
    }
    this.notebooks = paths;
    for (const k of this.kernels.values()) {
      this.rememberTitle(k);
    }
    return changed.length ? [{ section: 'work', keys: changed }] : [];
  }

  /** `GET api/advice`'s answer, or why it could not be read (one sentence). */
  setAdvice(answer: AdviceAnswer | null, error = ''): Change[] {
    this.advice = answer ?? this.advice;
    this.adviceError = error;
    return [{ section: 'advice', keys: [] }];
  }

  setTenants(tenants: Tenant[], simulated = false): Change[] {
    const mine = this.me ? new Set(this.me.tenants) : null;
    this.tenants = tenants.filter(t => !mine || mine.has(t.name));
    this.simulated = simulated || this.simulated;
    return [{ section: 'quota', keys: [] }];
  }

  setDevices(devices: Device[], simulated = false): Change[] {
    this.devices = devices;
    this.simulated = simulated || this.simulated;
    return [{ section: 'devices', keys: [] }];
  }

  setJobs(jobs: Job[]): { changes: Change[]; notices: Notice[] } {
    const notices: Notice[] = [];
    const keys: string[] = [];
    const next = new Map<string, Job>();
    for (const job of jobs) {
      next.set(job.id, job);
      const old = this.jobs.get(job.id);
      if (!old || JSON.stringify(old) !== JSON.stringify(job)) {
        keys.push(job.id);
      }
      if (old && old.state !== job.state) {
        const notice = jobNotice(job);
        if (notice) {
          notices.push(notice);
        }
      }
    }
    for (const id of this.jobs.keys()) {
      if (!next.has(id)) {
        keys.push(id);
      }
    }
    this.jobs = next;
    return { changes: keys.length ? [{ section: 'jobs', keys }] : [], notices };
  }

  setJob(job: Job): { changes: Change[]; notices: Notice[] } {
    const old = this.jobs.get(job.id);
    const all = [job, ...[...this.jobs.values()].filter(j => j.id !== job.id)];
    all.sort((a, b) => b.created - a.created);
    const notices: Notice[] = [];
    if (old && old.state !== job.state) {
      const notice = jobNotice(job);
      if (notice) {
        notices.push(notice);
      }
    }
    const next = new Map<string, Job>();
    for (const j of all) {
      next.set(j.id, j);
    }
    this.jobs = next;
    return { changes: [{ section: 'jobs', keys: [job.id] }], notices };
  }

  setConnection(state: Connection, error = ''): Change[] {
    if (state === this.connection && error === this.error) {
      return [];
    }
    this.connection = state;
    this.error = error;
    return [{ section: 'connection', keys: [] }];
  }

  // ------------------------------------------------------------------ events

  /**
   * One gateway event: update the row it is about. Returns the changes, the notices for
   * the user, and whether the whole state must be read again (`reset`).
   */
  applyEvent(event: GatewayEvent): { changes: Change[]; notices: Notice[]; reload: boolean } {
    const notices: Notice[] = [];
    const changes: Change[] = [];
    if (event.name === 'reset') {
      return { changes, notices, reload: true };
    }
    const req = event.data.request;
    const id = event.data.id ?? req?.id;
    if (!id) {
      // About no request (scale_up, node_ready...): quotas and devices may have moved.
      changes.push({ section: 'devices', keys: [] });
      return { changes, notices, reload: false };
    }
    const old = this.requests.get(id);
    if (req && !this.isMine(req)) {
      return { changes, notices, reload: false };
    }
    if (req) {
      const next: GpuRequest = { ...req };
      if (event.name === 'cancel' && next.state !== 'cancelled') {
        next.state = 'cancelled';
      }
      this.requests.set(id, next);
    } else if (!old) {
      return { changes, notices, reload: false };
    }
    const current = this.requests.get(id)!;
    const warnedWith = this.preemptions.get(id);
    const wasWarned = warnedWith !== undefined;
    if (event.name !== 'preempt_warning') {
      this.syncPreemption(id); // the object says whether a warning still stands
    }
    switch (event.name) {
      case 'admit': {
        this.warnings.delete(id);
        if (old && old.state === 'queued') {
          notices.push({
            kind: 'admitted',
            requestId: id,
            message: `Your ${this.what(current)} got ${gpuWords(
              current.gpus,
              current.grant?.flavor ?? current.flavor
            )} on ${current.grant?.node ?? 'a node'}.`
          });
        }
        break;
      }
      case 'cull_warning': {
        const cullAt = typeof event.data.cull_at === 'number' ? event.data.cull_at : null;
        const known = this.warnings.get(id);
        if (known && known.kept && known.cullAt === cullAt) {
          break; // this warning was answered already (heard late, or told again)
        }
        this.warnings.set(id, { cullAt, t: event.data.t ?? 0, kept: false });
        notices.push({
          kind: 'cull_warning',
          requestId: id,
          cullAt,
          message: `Your ${this.what(current)} is idle on its GPU and will be shut down ${
            cullAt && event.data.t ? `in ${duration(cullAt - event.data.t)}` : 'soon'
          } to free it. Keep it?`
        });
        break;
      }
      case 'cull':
        this.warnings.delete(id);
        notices.push({
          kind: 'culled',
          requestId: id,
          message: `Your ${this.what(current)} was idle and gave back its GPU.`
        });
        break;
      case 'preempt_warning': {
        const at = typeof event.data.at === 'number' ? event.data.at : (current.preempt_at ?? null);
        const by = typeof event.data.by === 'string' ? event.data.by : (current.preempted_by ?? null);
        const reason = current.preempt_reason || 'its GPU is reclaimed';
        this.preemptions.set(id, { at, by, reason });
        const t = typeof event.data.t === 'number' ? event.data.t : Date.now() / 1000;
        notices.push(...this.untoldPreemptions(t));
        break;
      }
      case 'preempt_withdrawn':
        if (wasWarned) {
          notices.push({
            kind: 'preempt_withdrawn',
            requestId: id,
            message: `Your ${this.what(current)} keeps its GPU: it is no longer reclaimed.`
          });
        }
        this.preemptions.delete(id);
        break;
      case 'preempt': {
        this.warnings.delete(id);
        this.preemptions.delete(id);
        const by = typeof event.data.by === 'string' ? event.data.by : null;
        const said = /^preempted: (.+)$/.exec(current.reason ?? '');
        const why = warnedWith
          ? warnedWith.reason
          : said
            ? said[1]
            : this.preemptorWords(by, current);
        const how = `${warnedWith ? 'stopped' : 'preempted'}: ${why}`;
        this.stopped.set(id, how);
        notices.push({ kind: 'preempted', requestId: id, message: `Your ${this.what(current)} was ${how}.` });
        break;
      }
      case 'finish':
      case 'cancel':
      case 'reject':
      case 'expire':
        this.warnings.delete(id);
        break;
      default:
        break;
    }
    this.trimEnded();
    changes.push({ section: 'work', keys: [id] });
    // Every decision about a request moves some tenant's usage.
    changes.push({ section: 'quota', keys: [] });
    if (['admit', 'finish', 'cancel', 'cull', 'preempt', 'expire'].includes(event.name)) {
      changes.push({ section: 'devices', keys: [] });
    }
    if (current.kind === 'job') {
      changes.push({ section: 'jobs', keys: [id] });
    }
    return { changes, notices, reload: false };
  }

  /**
   * Events, and the quota and device snapshot read after them, applied as one step: the
   * rows, the quota card and the devices then come from the same state and never
   * disagree ("vision uses none of its a100" beside a row running on it). The snapshot is
   * read once the events arrived, so it already counts their decisions (the gateway
   * commits a decision before it tells anyone).
   */
  applyBatch(events: GatewayEvent[], snapshot: Snapshot = {}): { changes: Change[]; notices: Notice[]; reload: boolean } {
    const changes: Change[] = [];
    const notices: Notice[] = [];
    let reload = false;
    for (const event of events) {
      const result = this.applyEvent(event);
      changes.push(...result.changes);
      notices.push(...result.notices);
      reload = reload || result.reload;
    }
    if (snapshot.tenants) {
      changes.push(...this.setTenants(snapshot.tenants.tenants, snapshot.tenants.simulated));
    }
    if (snapshot.devices) {
      changes.push(...this.setDevices(snapshot.devices.devices, snapshot.devices.simulated));
    }
    return { changes: mergeChanges(changes), notices, reload };
  }

  setLog(id: string, text: string): Change[] {
    if (this.logs.get(id) === text) {
      return [];
    }
    this.logs.set(id, text);
    return [{ section: 'jobs', keys: [id] }];
  }

  /**
   * The preemption warnings not told yet, one notice each: from an event, or from a read
   * (the page opened, or the stream came back, during a grace). Each is told once.
   */
  untoldPreemptions(now: number = Date.now() / 1000): Notice[] {
    const notices: Notice[] = [];
    for (const [id, p] of this.preemptions) {
      const key = `${id}@${p.at}`;
      const r = this.requests.get(id);
      if (this.told.has(key) || !r) {
        continue;
      }
      this.told.add(key);
      notices.push({
        kind: 'preempt_warning',
        requestId: id,
        cullAt: p.at,
        message: `Your ${this.what(r)} will be stopped ${
          p.at ? `in ${duration(p.at - now)}` : 'soon'
        }: ${p.reason}.`
      });
    }
    return notices;
  }

  /**
   * Who preempted a request, in words: one of my own requests by what it is; another
   * user's only as "a request with a better claim" (the event names it by id alone, and
   * the gateway shows me no one else's request).
   */
  private preemptorWords(by: string | null, victim: GpuRequest): string {
    const mine = by ? this.requests.get(by) : undefined;
    if (mine) {
      const what = `my ${kindWord(mine.kind)}${mine.name ? ` ${mine.name}` : ''}`;
      return mine.tenant === victim.tenant
        ? `${what}, of a higher priority in ${mine.tenant}, needed ${gpusTaken(victim.gpus, mine.gpus)}`
        : `${what} for ${mine.tenant} took back ${mine.tenant}'s quota`;
    }
    return `a request with a better claim (a higher priority, or a team taking back its quota) needed ${gpusTaken(
      victim.gpus
    )}`;
  }

  /**
   * Why an ended request ended, as one sentence: a preempted one by whom (never the raw
   * "preempted by r-…" of the gateway's object); others by the gateway's reason.
   */
  endedReason(r: GpuRequest): string {
    if (r.state === 'preempted') {
      const how = this.stopped.get(r.id);
      if (how) {
        return sentence(how);
      }
      if ((r.reason ?? '').startsWith('preempted:')) {
        return sentence(r.reason!); // the gateway's words: "preempted: nlp took back its GPU"
      }
      const m = /^preempted by (\S+)$/.exec(r.reason ?? '');
      return sentence(`preempted: ${this.preemptorWords(m ? m[1] : null, r)}`);
    }
    const job = r.kind === 'job' ? this.jobs.get(r.id) : undefined;
    return sentence(endedWords(r, this.me?.name ?? null, job?.state));
  }

  /**
   * A request's title: the notebook or file it is for (a kernel's notebook, a job's
   * notebook), else its kernel's name; never its id. '' when nothing names it.
   */
  titleOf(r: GpuRequest): string {
    const path = this.titles.get(r.id);
    if (path) {
      return path.split('/').pop() ?? path;
    }
    const job = r.kind === 'job' ? this.jobs.get(r.id) : undefined;
    const source = job?.name || job?.source;
    if (source) {
      return source.split('/').pop() ?? source;
    }
    // The gateway's name of a kernel's request ends with the kernel's id, "GPU 1
    // (f7df35bd)": the name is kept, the id is not.
    const named = r.kind !== 'server' && r.name ? r.name : (this.kernels.get(r.id)?.kernel_name ?? '');
    return named.replace(/\s*\([0-9a-f]{6,}\)$/, '');
  }

  /** "GPU kernel train.ipynb": what a toast or a button says a request is. */
  what(r: GpuRequest): string {
    const title = this.titleOf(r);
    return title ? `${kindWord(r.kind)} ${title}` : kindWord(r.kind);
  }

  private rememberTitle(k: GpuKernelInfo): void {
    const path = this.notebooks.get(k.kernel_id);
    if (k.request_id && path) {
      this.titles.set(k.request_id, path);
    }
  }

  /**
   * Whose a device is, in words: "free", "mine", "bob (nlp)" when the gateway names the
   * holder (it does only to the view scope, or for my own), else "my team (vision)" or
   * "another team (nlp)".
   */
  deviceOwnerWords(device: Device): string {
    const owner = this.ownerOf(device);
    const h = device.holder;
    if (owner === 'free' || owner === 'mine' || !h) {
      return owner === 'mine' ? 'mine' : 'free';
    }
    if (this.me?.view && h.user) {
      return `${h.user} (${h.tenant})`;
    }
    return owner === 'team' ? `my team (${h.tenant})` : `another team (${h.tenant})`;
  }

  /** A request's preemption warning, as its object says (admitted with `preempt_at`). */
  private syncPreemption(id: string): void {
    const r = this.requests.get(id);
    if (r && r.state === 'admitted' && typeof r.preempt_at === 'number') {
      this.preemptions.set(id, {
        at: r.preempt_at,
        by: r.preempted_by ?? null,
        reason: r.preempt_reason || 'its GPU is reclaimed'
      });
    } else {
      this.preemptions.delete(id);
    }
  }

  /** The preemption warning of a kernel's request (for the status bar and the notebook). */
  preemptionOfKernel(kernelId: string): Preemption | undefined {
    const k = this.kernelById(kernelId);
    return k?.request_id ? this.preemptions.get(k.request_id) : undefined;
  }

  /** A Keep answered: the warning stays shown as kept until the next one. */
  markKept(requestId: string): Change[] {
    const w = this.warnings.get(requestId);
    if (w) {
      w.kept = true;
    }
    return [{ section: 'work', keys: [requestId] }];
  }

  // ------------------------------------------------------------------ views

  /** My requests, live first (queued before running), then recently ended. */
  workRows(): GpuRequest[] {
    const rank = (r: GpuRequest): number =>
      r.state === 'queued' ? 0 : r.state === 'admitted' ? 1 : r.state === 'parked' ? 2 : 3;
    return [...this.requests.values()].sort(
      (a, b) => rank(a) - rank(b) || (b.submit_time ?? 0) - (a.submit_time ?? 0)
    );
  }

  /** The rows "My work" shows as cards: what is queued, running or parked. */
  liveRows(): GpuRequest[] {
    return this.workRows().filter(r => !isEnded(r.state));
  }

  /** The short history under them: what ended, newest first (at most ENDED_KEPT). */
  historyRows(): GpuRequest[] {
    return this.workRows().filter(r => isEnded(r.state));
  }

  /**
   * This server's notebook kernels that hold and ask for nothing until a cell runs
   * (`deferred`): they have no request, so no card; "My work" lists them on a line each.
   */
  deferredKernels(): GpuKernelInfo[] {
    return [...this.kernels.values()].filter(k => k.state === 'deferred' && k.ended === null);
  }

  /** A kernel's title: its notebook's file name, else the kernel's name. */
  kernelTitle(k: GpuKernelInfo): string {
    const path = this.notebooks.get(k.kernel_id);
    return path ? (path.split('/').pop() ?? path) : k.kernel_name;
  }

  kernelOf(requestId: string): GpuKernelInfo | undefined {
    return this.kernels.get(requestId);
  }

  kernelById(kernelId: string): GpuKernelInfo | undefined {
    for (const k of this.kernels.values()) {
      if (k.kernel_id === kernelId && k.ended === null) {
        return k;
      }
    }
    return undefined;
  }

  idleTimeout(tenant: string | null): number | null {
    const t = this.tenants.find(x => x.name === tenant);
    return t?.idle_timeout ?? null;
  }

  /** Whose a device is, from my point of view. */
  ownerOf(device: Device): 'mine' | 'team' | 'other' | 'free' {
    const h = device.holder;
    if (!h) {
      return 'free';
    }
    if (this.requests.has(h.id) || (this.me && h.user === this.me.name)) {
      return 'mine';
    }
    if (this.me && this.me.tenants.includes(h.tenant)) {
      return 'team';
    }
    return 'other';
  }

  isMine(r: GpuRequest): boolean {
    return !this.me || r.user === this.me.name;
  }

  private trimEnded(): void {
    const ended = [...this.requests.values()]
      .filter(r => isEnded(r.state))
      .sort((a, b) => (b.submit_time ?? 0) - (a.submit_time ?? 0));
    for (const r of ended.slice(ENDED_KEPT)) {
      this.requests.delete(r.id);
      this.warnings.delete(r.id);
      this.preemptions.delete(r.id);
      this.stopped.delete(r.id);
      this.titles.delete(r.id);
    }
  }
}

/** What `applyBatch` reads with the events: the tenants' quota and the devices. */
export interface Snapshot {
  tenants?: { tenants: Tenant[]; simulated?: boolean };
  devices?: { devices: Device[]; simulated?: boolean };
}

/** One change per section; a section redrawn whole (no keys) stays whole. */
export function mergeChanges(changes: Change[]): Change[] {
  const out = new Map<Section, Set<string> | null>();
  for (const c of changes) {
    const seen = out.get(c.section);
    if (!c.keys.length || seen === null) {
      out.set(c.section, null);
    } else {
      out.set(c.section, new Set([...(seen ?? []), ...c.keys]));
    }
  }
  return [...out].map(([section, keys]) => ({ section, keys: keys ? [...keys] : [] }));
}

function sentence(text: string): string {
  const t = text[0].toUpperCase() + text.slice(1);
  return /[.!?]$/.test(t) ? t : `${t}.`;
}

export function kindWord(kind: string): string {
  return kind === 'kernel' ? 'GPU kernel' : kind === 'server' ? 'GPU server' : 'GPU job';
}

function jobNotice(job: Job): Notice | null {
  const name = job.name || job.source || job.id.slice(0, 8);
  if (job.state === 'succeeded') {
    return { kind: 'job_done', requestId: job.id, message: `Job ${name} finished.` };
  }
  if (job.state === 'failed') {
    return {
      kind: 'job_failed',
      requestId: job.id,
      message: `Job ${name} failed${job.reason ? `: ${job.reason}` : ''}.`
    };
  }
  return null;
}

/** "It will be stopped in 4 min: nlp is reclaiming its GPU." (a countdown to `now`). */
export function preemptLine(p: Preemption, now: number, subject = 'It'): string {
  const when = p.at ? `in ${duration(p.at - now)}` : 'soon';
  return `${subject} will be stopped ${when}: ${p.reason}.`;
}

/** "3rd in vision": the short place of a queued request. */
export function shortPlace(r: GpuRequest): string {
  return r.position ? `${ordinal(r.position.tenant)} in ${r.tenant}` : 'queued';
}
