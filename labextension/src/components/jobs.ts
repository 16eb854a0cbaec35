/** "Jobs": my batch jobs with their state, a log tail that grows while running, cancel,
 * the executed notebook, and run again with the same parameters. */

import { duration, formatPosition } from '../format';
import { GpuModel } from '../model';
import type { Job } from '../types';
import { Actions, runAction } from './actions';
import { button, h, Rows, section } from './dom';

const JOB_STATES: Record<string, string> = {
  queued: 'queued',
  starting: 'starting',
  running: 'running',
  succeeded: 'succeeded',
  failed: 'failed',
  cancelled: 'cancelled'
};

export class JobsSection {
  readonly root: HTMLElement;
  private list: HTMLElement;
  private empty: HTMLElement;
  private rows: Rows<Job>;

  constructor(
    private readonly model: GpuModel,
    private readonly actions: Actions
  ) {
    const s = section('jobs', 'Jobs');
    this.root = s.root;
    this.list = h('ul', { class: 'jp-gpuaas-list', 'aria-label': 'My GPU jobs' });
    this.empty = h('p', {
      class: 'jp-gpuaas-empty',
      text: 'No jobs yet: right-click a notebook and choose "Run on GPU as a job…".'
    });
    s.body.append(this.list, this.empty);
    this.rows = new Rows(this.list, (j, row) => this.renderRow(j, row));
  }

  update(keys?: string[]): void {
    const jobs = [...this.model.jobs.values()].sort((a, b) => b.created - a.created);
    this.rows.sync(jobs.map(j => [j.id, j]), keys && keys.length ? new Set(keys) : undefined);
    this.empty.hidden = jobs.length > 0;
  }

  private renderRow(j: Job, row: HTMLElement): void {
    row.className = `jp-gpuaas-row jp-gpuaas-job jp-gpuaas-state-${j.state}`;
    row.dataset.state = j.state;
    row.replaceChildren();
    const error = h('p', { class: 'jp-gpuaas-error', role: 'alert' });
    const name = j.name || j.source_path || j.id.slice(0, 8);
    row.append(
      h('div', { class: 'jp-gpuaas-row-head' },
        h('span', { class: 'jp-gpuaas-title', text: name }),
        h('span', { class: `jp-gpuaas-badge jp-gpuaas-badge-${j.state}`, text: JOB_STATES[j.state] ?? j.state })
      )
    );
    const params = Object.entries(j.parameters || {});
    const detail = [`${j.gpus} ${j.flavor ?? ''} GPU${j.gpus === 1 ? '' : 's'} for ${j.tenant}`.replace('  ', ' ')];
    if (params.length) {
      detail.push(`parameters ${params.map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(', ')}`);
    }
    row.append(h('p', { class: 'jp-gpuaas-line', text: detail.join('; ') }));
    if (j.state === 'queued') {
      row.append(h('p', { class: 'jp-gpuaas-line', text: formatPosition(j.position, j.tenant) }));
    }
    if (j.started) {
      const end = j.ended ?? Date.now() / 1000;
      row.append(
        h('p', {
          class: 'jp-gpuaas-line',
          text: `${j.ended ? 'Ran' : 'Running'} for ${duration(end - j.started)}${
            j.exit_status !== null && j.ended ? `, exit status ${j.exit_status}` : ''
          }`
        })
      );
    }
    if (j.reason && j.state !== 'succeeded') {
      row.append(h('p', { class: 'jp-gpuaas-line jp-gpuaas-reason', text: j.reason }));
    }
    // role=log (a <pre> may not carry a label); not read aloud as it grows.
    const log = h('pre', {
      class: 'jp-gpuaas-log',
      role: 'log',
      'aria-live': 'off',
      tabindex: 0,
      'aria-label': `Log of job ${name}`,
      text: this.model.logs.get(j.id) ?? ''
    });
    if (j.state !== 'queued') {
      row.append(log);
    }
    const buttons = h('div', { class: 'jp-gpuaas-actions' });
    if (['queued', 'starting', 'running'].includes(j.state)) {
      const c = button('Cancel', `Cancel job ${name}`, () => runAction(c, error, () => this.actions.cancelJob(j)));
      buttons.append(c);
    }
    if (j.output_path && j.ended) {
      const path = j.output_path;
      buttons.append(button('Open result', `Open the executed notebook of job ${name}`, () => this.actions.openPath(path)));
    }
    if (j.ended && j.source_path) {
      const again = button('Run again', `Run job ${name} again with the same parameters`, () =>
        runAction(again, error, () => this.actions.runAgain(j))
      );
      buttons.append(again);
    }
    row.append(buttons, error);
  }
}
