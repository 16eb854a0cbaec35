/**
 * The notebook's own line for a warned preemption victim: above the cells of a notebook
 * whose GPU kernel will be stopped, "⚠ This notebook's GPU kernel will be stopped in
 * 4 min: nlp is reclaiming its GPU." (a countdown), gone when the warning is withdrawn.
 *
 * Kernel-independent (the notebook's content header, drawn from the sidebar's model): no
 * message reaches the kernel, so the warning never counts as kernel activity.
 */

import { Widget } from '@lumino/widgets';

import { GpuModel, preemptLine } from '../model';

export class NotebookPreemptLine extends Widget {
  private timer: number | null = null;
  private readonly unlisten: () => void;

  constructor(
    private readonly model: GpuModel,
    private readonly kernelId: () => string | null
  ) {
    super();
    this.addClass('jp-gpuaas-notebook-line');
    this.node.setAttribute('role', 'status');
    this.node.setAttribute('aria-live', 'polite');
    this.unlisten = model.onChange(() => this.refresh());
    this.refresh();
  }

  refresh(): void {
    const id = this.kernelId();
    const p = id ? this.model.preemptionOfKernel(id) : undefined;
    // One sentence, as the row and the notification say it (its notebooks are saved).
    const text = p ? `⚠ ${preemptLine(p, Date.now() / 1000, "This notebook's GPU kernel")}` : '';
    if (this.node.textContent !== text) {
      this.node.textContent = text;
      this.node.title = text; // all of it, should the line be cut
    }
    this.setHidden(!text);
    // The countdown moves without events: redraw every few seconds while shown.
    if (text && this.timer === null) {
      this.timer = window.setInterval(() => this.refresh(), 5000);
    } else if (!text && this.timer !== null) {
      window.clearInterval(this.timer);
      this.timer = null;
    }
  }

  dispose(): void {
    if (this.timer !== null) {
      window.clearInterval(this.timer);
    }
    this.unlisten();
    super.dispose();
  }
}

