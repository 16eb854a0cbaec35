/**
 * Ties the model to the server: the first read, the event stream, and the few polls of what
 * has no events (device samples; this server's kernel records and jobs, for idle clocks and
 * log tails). Polls run only while the panel is shown or something of mine is live, and
 * stand by while the browser tab is hidden.
 */

import { Poll } from '@lumino/polling';

import { ADVICE_MAX_AGE_MS } from './advice';
import { ApiError, GpuApi } from './api';
import { EventConnection } from './connection';
import { Change, GpuModel, Notice, Snapshot } from './model';
import type { GatewayEvent } from './types';

export interface ControllerOptions {
  api: GpuApi;
  model: GpuModel;
  /** Notebook path of each running kernel id (JupyterLab's sessions, already polled). */
  notebooks: () => Map<string, string>;
  notify: (notice: Notice) => void;
  /** Seconds between device polls while the panel is shown. */
  devicesInterval?: number;
}

/** Events that change no tenant's usage nor any device: applied as they come. */
const QUOTA_NEUTRAL = ['cull_warning', 'preempt_warning', 'preempt_withdrawn'];

export class GpuController {
  readonly api: GpuApi;
  readonly model: GpuModel;
  private connection: EventConnection;
  private fast: Poll;
  private panelVisible = false;
  private reloading: Promise<void> | null = null;
  private tenantsTimer: number | null = null;
  private adviceAt = 0;
  private adviceReading = false;

  constructor(private readonly options: ControllerOptions) {
    this.api = options.api;
    this.model = options.model;
    this.connection = new EventConnection({
      url: () => this.api.eventsUrl(),
      onEvent: e => this.onEvent(e),
      reload: () => this.reload(),
      onState: (state, error) => this.emit(this.model.setConnection(state, error ?? ''))
    });
    // Device samples, kernel idle clocks and job logs have no events: read them every few
    // seconds, but only while someone looks (the panel) or a GPU kernel/job of mine lives
    // (the status bar); never while the tab is hidden.
    this.fast = new Poll({
      auto: false,
      factory: () => this.refreshLocal(),
      frequency: { interval: (options.devicesInterval ?? 3) * 1000, backoff: true, max: 30000 },
      name: 'jupyter-gpuaas:local',
      standby: () => document.hidden || !this.wanted()
    });
  }

  start(): void {
    this.connection.start();
    void this.fast.start();
  }

  setPanelVisible(visible: boolean): void {
    this.panelVisible = visible;
    if (visible) {
      void this.fast.refresh();
      void this.refreshAdvice();
    }
  }

  /**
   * My advice, read when the panel is shown and the last answer is older than
   * ADVICE_MAX_AGE_MS: it changes over days, and each read replays the gateway's history
   * (the gateway caches it, and answers a stale one or a 503 while it works).
   */
  async refreshAdvice(): Promise<void> {
    const now = Date.now();
    if (this.adviceReading || now - this.adviceAt < ADVICE_MAX_AGE_MS) {
      return;
    }
    this.adviceReading = true;
    try {
      const answer = await this.api.advice();
      this.adviceAt = answer.stale ? 0 : now; // a stale answer: ask again on the next show
      this.emit(this.model.setAdvice(answer));
    } catch (e) {
      this.emit(this.model.setAdvice(null, e instanceof ApiError ? e.message : String(e)));
    } finally {
      this.adviceReading = false;
    }
  }

  private wanted(): boolean {
    if (this.panelVisible) {
      return true;
    }
    for (const k of this.model.kernels.values()) {
      if (k.ended === null) {
        return true;
      }
    }
    for (const j of this.model.jobs.values()) {
      if (['queued', 'starting', 'running'].includes(j.state)) {
        return true;
      }
    }
    return false;
  }

  /** Read everything again (on open, on reconnect, after a `reset`). */
  reload(): Promise<void> {
    if (!this.reloading) {
      this.reloading = this.doReload().finally(() => {
        this.reloading = null;
      });
    }
    return this.reloading;
  }

  private async doReload(): Promise<void> {
    const model = this.model;
    if (!model.me) {
      model.setMe(await this.api.me());
    }
    const me = model.me;
    const [requests, tenants, devices] = await Promise.all([
      this.api.requests(me && !me.view ? null : (me?.name ?? null)),
      this.api.tenants(),
      this.api.devices()
    ]);
    const changes: Change[] = [
      ...model.setRequests(requests),
      ...model.setTenants(tenants.tenants, tenants.simulated),
      ...model.setDevices(devices.devices, devices.simulated)
    ];
    this.emit(changes);
    // A warning that came while the page was closed or the stream down: told now, once.
    model.untoldPreemptions().forEach(n => this.options.notify(n));
    await this.refreshLocal();
  }

  /** This server's own state: kernels, notebooks, jobs; and the device samples. */
  async refreshLocal(): Promise<void> {
    const model = this.model;
    const [kernels, jobs, devices] = await Promise.all([
      this.api.kernels().catch(() => null),
      this.api.jobs().catch(() => null),
      this.panelVisible ? this.api.devices().catch(() => null) : Promise.resolve(null)
    ]);
    const changes: Change[] = [];
    if (kernels) {
      changes.push(...model.setKernels(kernels));
    }
    changes.push(...model.setNotebooks(this.options.notebooks()));
    if (jobs) {
      const result = model.setJobs(jobs);
      changes.push(...result.changes);
      result.notices.forEach(n => this.options.notify(n));
      changes.push(...(await this.readLogs()));
    }
    if (devices) {
      changes.push(...model.setDevices(devices.devices, devices.simulated));
    }
    this.emit(changes);
  }

  /** Log tails: of running jobs at every round, of an ended one once more (its last lines). */
  private async readLogs(): Promise<Change[]> {
    const due = [...this.model.jobs.values()].filter(
      j =>
        ['starting', 'running'].includes(j.state) ||
        (j.ended !== null && !this.finalLogs.has(j.id) && j.started !== null)
    );
    const changes: Change[] = [];
    await Promise.all(
      due.map(async j => {
        const text = await this.api.logTail(j.id).catch(() => null);
        if (text !== null) {
          if (j.ended !== null) {
            this.finalLogs.add(j.id);
          }
          changes.push(...this.model.setLog(j.id, text));
        }
      })
    );
    return changes;
  }

  private finalLogs = new Set<string>();

  /** Events heard, applied together with the quota and devices read after them. */
  private pending: GatewayEvent[] = [];

  private onEvent(event: GatewayEvent): void {
    if (event.name === 'reset') {
      this.pending = [];
      void this.reload().catch(() => undefined);
      return;
    }
    if (!QUOTA_NEUTRAL.includes(event.name) || this.pending.length) {
      // Rows, quota and devices change together (model.applyBatch): a burst of events
      // costs one read of the quota and the devices, and the panel never shows one
      // without the other. (Behind such events, any event waits its turn.)
      this.pending.push(event);
      this.scheduleTenants();
      return;
    }
    // A warning moves no quota: told at once, not after a read of the quota.
    const result = this.model.applyBatch([event]);
    this.emit(result.changes.filter(c => c.section !== 'quota' && c.section !== 'devices'));
    result.notices.forEach(n => this.options.notify(n));
  }

  private scheduleTenants(): void {
    if (this.tenantsTimer !== null) {
      return;
    }
    this.tenantsTimer = window.setTimeout(async () => {
      this.tenantsTimer = null;
      let snapshot: Snapshot = {};
      try {
        const [tenants, devices] = await Promise.all([this.api.tenants(), this.api.devices()]);
        snapshot = { tenants, devices };
      } catch (e) {
        if (e instanceof ApiError && e.unreachable) {
          this.emit(this.model.setConnection('unreachable', e.message));
        }
      }
      const events = this.pending;
      this.pending = [];
      const result = this.model.applyBatch(events, snapshot);
      if (result.reload) {
        void this.reload().catch(() => undefined);
        return;
      }
      this.emit(result.changes);
      if (events.some(e => ['job', 'kernel'].includes(e.data.request?.kind ?? ''))) {
        void this.refreshLocal().catch(() => undefined);
      }
      result.notices.forEach(n => this.options.notify(n));
    }, 50);
  }

  emit(changes: Change[]): void {
    this.model.emit(changes);
  }

  dispose(): void {
    this.connection.dispose();
    this.fast.dispose();
  }
}
