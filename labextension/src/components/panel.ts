/** The left-area panel "GPUs": a connection banner and five sections (landmarks). */

import { Widget } from '@lumino/widgets';

import { Change, GpuModel } from '../model';
import { Actions } from './actions';
import { AdviceSection } from './advice';
import { DevicesSection } from './devices';
import { h } from './dom';
import { JobsSection } from './jobs';
import { MyWorkSection } from './mywork';
import { QuotaSection } from './quota';

export class GpuPanel extends Widget {
  readonly work: MyWorkSection;
  readonly quota: QuotaSection;
  readonly devices: DevicesSection;
  readonly jobs: JobsSection;
  readonly advice: AdviceSection;
  private banner: HTMLElement;
  private ticker: number | null = null;

  constructor(
    private readonly model: GpuModel,
    actions: Actions,
    private readonly onVisible: (visible: boolean) => void
  ) {
    super();
    this.id = 'jp-gpuaas-panel';
    this.addClass('jp-gpuaas-panel');
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'GPUs');
    this.banner = h('div', { class: 'jp-gpuaas-banner', role: 'status', 'aria-live': 'polite' });
    this.work = new MyWorkSection(model, actions);
    this.quota = new QuotaSection(model);
    this.devices = new DevicesSection(model);
    this.jobs = new JobsSection(model, actions);
    this.advice = new AdviceSection(model);
    this.node.append(
      // A div, not a <header>: a banner landmark inside the panel's region is misplaced.
      h('div', { class: 'jp-gpuaas-header' }, h('h1', { class: 'jp-gpuaas-h1', text: 'GPUs' }), this.banner),
      this.work.root,
      this.quota.root,
      this.devices.root,
      this.jobs.root,
      this.advice.root
    );
    model.onChange(changes => this.apply(changes));
    this.apply([{ section: 'connection', keys: [] }]);
  }

  apply(changes: Change[]): void {
    for (const c of changes) {
      switch (c.section) {
        case 'work':
          this.work.update(c.keys);
          break;
        case 'quota':
          this.quota.update();
          break;
        case 'devices':
          this.devices.update();
          this.work.update(); // live utilization of my devices
          break;
        case 'jobs':
          this.jobs.update(c.keys);
          this.work.update(c.keys);
          break;
        case 'connection':
          this.showConnection();
          break;
        case 'advice':
          this.advice.update();
          break;
      }
    }
  }

  private showConnection(): void {
    const state = this.model.connection;
    const text =
      state === 'unreachable'
        ? this.model.error || 'GPU service unreachable — retrying.'
        : state === 'polling'
          ? 'Live updates interrupted: refreshing every few seconds while reconnecting.'
          : state === 'connecting'
            ? 'Connecting to the GPU service…'
            : '';
    this.banner.textContent = text;
    this.banner.dataset.state = state;
    this.banner.hidden = !text;
  }

  protected onAfterShow(): void {
    this.onVisible(true);
    // Idle clocks and countdowns move without events: redraw "My work" every few seconds
    // while shown (no request: the model already has the timestamps).
    this.ticker = window.setInterval(() => this.work.update(), 5000);
  }

  protected onAfterHide(): void {
    this.onVisible(false);
    if (this.ticker !== null) {
      window.clearInterval(this.ticker);
      this.ticker = null;
    }
  }
}
