/** "My work": every request of mine, with its place and reason while queued, its devices
 * and idle time while running, and the notebook that holds a kernel. */

import {
  bytes,
  duration,
  formatPosition,
  formatWait,
  gpuWords,
  percent,
  rowState,
  stateWords,
  waitReason
} from '../format';
import { GpuModel, kindWord, preemptLine } from '../model';
import type { GpuRequest } from '../types';
import { Actions, runAction } from './actions';
import { button, h, Rows, section } from './dom';

export class MyWorkSection {
  readonly root: HTMLElement;
  private list: HTMLElement;
  private empty: HTMLElement;
  private summary: HTMLElement;
  private rows: Rows<GpuRequest>;
  private history: HTMLDetailsElement;
  private historySummary: HTMLElement;
  private historyRows: Rows<GpuRequest>;
  private deferred: HTMLElement;

  constructor(
    private readonly model: GpuModel,
    private readonly actions: Actions
  ) {
    const s = section('work', 'My work');
    this.root = s.root;
    this.summary = s.summary;
    this.list = h('ul', { class: 'jp-gpuaas-list', 'aria-label': 'My GPU requests' });
    this.empty = h('p', {
      class: 'jp-gpuaas-empty',
      text: 'Nothing of mine on GPUs. Start a GPU kernel, or run a notebook as a job.'
    });
    // Ended requests fold into a short history under the cards, one line each: what it
    // was and what happened ("cancelled by an admin (root)"), so they never crowd the
    // live cards or push the quota down.
    const historyList = h('ul', { class: 'jp-gpuaas-history-list', 'aria-label': 'Ended GPU requests' });
    this.historySummary = h('summary', { class: 'jp-gpuaas-history-summary' });
    this.history = h('details', { class: 'jp-gpuaas-history' }, this.historySummary, historyList);
    this.history.open = true; // shown, one short line each; a click folds it
    // Notebooks whose GPU kernel asks for a GPU only when a cell runs: no request, so no
    // card, one line each ("train.ipynb · GPU kernel: takes a GPU when you run a cell").
    this.deferred = h('ul', { class: 'jp-gpuaas-deferred-list', 'aria-label': 'GPU kernels not started yet' });
    s.body.append(this.list, this.deferred, this.empty, this.history);
    this.rows = new Rows(this.list, (r, row) => this.renderRow(r, row));
    this.historyRows = new Rows(historyList, (r, row) => this.renderEnded(r, row));
  }

  update(keys?: string[]): void {
    const items = this.model.liveRows();
    const ended = this.model.historyRows();
    const only = keys && keys.length ? new Set(keys) : undefined;
    this.rows.sync(
      items.map(r => [r.id, r]),
      only
    );
    this.historyRows.sync(
      ended.map(r => [r.id, r]),
      only
    );
    this.history.hidden = ended.length === 0;
    this.historySummary.textContent = `Ended recently (${ended.length})`;
    const deferred = this.model.deferredKernels();
    this.deferred.replaceChildren(
      ...deferred.map(k => {
        const title = this.model.kernelTitle(k);
        return h('li', {
          class: 'jp-gpuaas-deferred',
          'data-kernel': k.kernel_id,
          title,
          text: `${title} · ${k.message ?? ''}`
        });
      })
    );
    this.deferred.hidden = deferred.length === 0;
    this.empty.hidden = items.length > 0 || deferred.length > 0;
    const queued = items.filter(r => r.state === 'queued').length;
    const running = items.filter(r => r.state === 'admitted').length;
    this.summary.textContent = items.length ? ` · ${running} running, ${queued} queued` : '';
  }

  /** One line of the history: "train.ipynb · GPU kernel — preempted: nlp took back its GPU." */
  private renderEnded(r: GpuRequest, row: HTMLElement): void {
    const title = this.model.titleOf(r);
    const state = rowState(r, r.kind === 'job' ? this.model.jobs.get(r.id) : undefined);
    row.className = `jp-gpuaas-history-row jp-gpuaas-state-${state}`;
    row.dataset.state = state;
    row.replaceChildren(
      h(
        'div',
        { class: 'jp-gpuaas-row-head' },
        h('span', { class: 'jp-gpuaas-title', title, text: title ? `${title} · ${kindWord(r.kind)}` : kindWord(r.kind) }),
        h('span', { class: `jp-gpuaas-badge jp-gpuaas-badge-${state}`, text: stateWords(state) })
      ),
      h('p', { class: 'jp-gpuaas-line jp-gpuaas-reason', text: this.model.endedReason(r) })
    );
  }

  private renderRow(r: GpuRequest, row: HTMLElement): void {
    const model = this.model;
    const kernel = model.kernelOf(r.id);
    const notebook = kernel ? model.notebooks.get(kernel.kernel_id) : undefined;
    const job = r.kind === 'job' ? model.jobs.get(r.id) : undefined;
    const state = rowState(r, job);
    row.className = `jp-gpuaas-row jp-gpuaas-state-${state}`;
    row.dataset.state = state;
    row.replaceChildren();
    const error = h('p', { class: 'jp-gpuaas-error', role: 'alert' });

    // Title: what it is, and which notebook holds a kernel (a link to open it).
    let title: HTMLElement;
    if (notebook) {
      const link = h('a', {
        href: '#',
        class: 'jp-gpuaas-link',
        'aria-label': `Open notebook ${notebook}`,
        title: notebook,
        text: notebook.split('/').pop() ?? notebook
      });
      link.addEventListener('click', ev => {
        ev.preventDefault();
        this.actions.openPath(notebook);
      });
      title = h('span', { class: 'jp-gpuaas-title' }, link, ` · ${kindWord(r.kind)}`);
    } else {
      const name = model.titleOf(r); // never the request's id
      title = h('span', {
        class: 'jp-gpuaas-title',
        title: name,
        text: name ? `${name} · ${kindWord(r.kind)}` : kindWord(r.kind)
      });
    }
    const badge = h('span', {
      class: `jp-gpuaas-badge jp-gpuaas-badge-${state}`,
      text: stateWords(state)
    });
    row.append(h('div', { class: 'jp-gpuaas-row-head' }, title, badge));
    const what = `${gpuWords(r.gpus, r.grant?.flavor ?? r.flavor)} for ${r.tenant}`;
    row.append(h('p', { class: 'jp-gpuaas-line', text: what }));

    const buttons = h('div', { class: 'jp-gpuaas-actions' });
    if (r.state === 'queued') {
      row.append(
        h('p', { class: 'jp-gpuaas-line jp-gpuaas-position', text: formatPosition(r.position, r.tenant) }),
        h('p', { class: 'jp-gpuaas-line jp-gpuaas-reason', text: waitReason(r) })
      );
      if (!r.waiting_for?.message) {
        // The gateway's sentence says the reason and the estimate together (one function,
        // the same words as the spawn page and the API): shown as it is, nothing added.
        row.append(
          h('p', {
            class: 'jp-gpuaas-line jp-gpuaas-wait',
            text: `Estimated wait: ${formatWait(r.estimated_wait)}`
          })
        );
      }
      const b = button('Cancel', `Cancel the queued ${model.what(r)}`, () =>
        runAction(b, error, () => this.actions.cancel(r))
      );
      buttons.append(b);
    } else if (r.state === 'admitted' && r.grant) {
      const devs = r.grant.devices;
      row.append(
        h('p', {
          class: 'jp-gpuaas-line jp-gpuaas-node',
          text: `On ${r.grant.node}, ${devs.length === 1 ? 'device' : 'devices'} ${devs.join(', ')}`
        })
      );
      for (const index of devs) {
        const d = model.devices.find(x => x.node === r.grant!.node && x.index === index);
        if (d) {
          const mem =
            d.memory_total !== undefined
              ? `${bytes(d.memory_used)} of ${bytes(d.memory_total)}`
              : bytes(d.memory_used);
          row.append(
            h('p', {
              class: 'jp-gpuaas-line jp-gpuaas-util',
              text: `GPU ${index}: ${percent(d.utilization)} busy, memory ${mem}`
            })
          );
        }
      }
      const now = Date.now() / 1000;
      if (kernel && kernel.idle_since !== null && kernel.ended === null) {
        row.append(
          h('p', {
            class: 'jp-gpuaas-line jp-gpuaas-idle',
            text: `Idle for ${duration(now - kernel.idle_since)}`
          })
        );
      } else if (r.grant.busy === false && !kernel) {
        row.append(h('p', { class: 'jp-gpuaas-line jp-gpuaas-idle', text: 'Idle' }));
      }
      const preemption = model.preemptions.get(r.id);
      if (preemption) {
        row.append(
          h('p', {
            class: 'jp-gpuaas-line jp-gpuaas-warning jp-gpuaas-preempt',
            role: 'status',
            text: `⚠ ${preemptLine(preemption, now)}`
          })
        );
      }
      const warning = model.warnings.get(r.id);
      if (warning) {
        const when = warning.cullAt ? `in ${duration(warning.cullAt - now)}` : 'soon';
        row.append(
          h('p', {
            class: 'jp-gpuaas-line jp-gpuaas-warning',
            role: 'status',
            text: warning.kept
              ? 'Kept: its idle clock started again.'
              : `⚠ Idle: it will be shut down ${when} to free its GPU.`
          })
        );
        if (!warning.kept) {
          const keep = button('Keep my GPU', `Keep the GPU of ${model.what(r)}`, () =>
            runAction(keep, error, () => this.actions.keep(r.id))
          , 'jp-mod-accept');
          buttons.append(keep);
        }
      }
      if (kernel && kernel.ended === null) {
        const rel = button('Release', `Release the GPU: shut down kernel ${kernel.kernel_name}`, () =>
          runAction(rel, error, () => this.actions.release(kernel.kernel_id))
        );
        buttons.append(rel);
      } else if (r.kind === 'job' && job) {
        const c = button('Cancel', `Cancel job ${job.name || job.id}`, () =>
          runAction(c, error, () => this.actions.cancelJob(job))
        );
        buttons.append(c);
      }
    } else if (r.state === 'parked') {
      // Culled and parked: what happened first (as the spawn page's sentence, words.py
      // ending_sentence), then what it means for the next start.
      row.append(
        h('p', { class: 'jp-gpuaas-line jp-gpuaas-reason', text: 'Stopped: it was idle on its GPU.' }),
        h('p', {
          class: 'jp-gpuaas-line',
          text: "Its quota is kept for a while: starting it again gets the GPU at once."
        })
      );
    } else if (r.reason || r.state === 'preempted') {
      row.append(h('p', { class: 'jp-gpuaas-line jp-gpuaas-reason', text: model.endedReason(r) }));
    }
    if (buttons.childElementCount) {
      row.append(buttons);
    }
    row.append(error);
  }
}

