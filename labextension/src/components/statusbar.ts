/** The status-bar item: the GPU of the current notebook's kernel, in a few words. */

import { Widget } from '@lumino/widgets';

import { statusText } from '../format';
import { GpuModel } from '../model';

export class GpuStatus extends Widget {
  private kernelId: string | null = null;

  constructor(private readonly model: GpuModel) {
    super();
    this.addClass('jp-gpuaas-status');
    this.node.setAttribute('role', 'status');
    this.node.setAttribute('aria-live', 'polite');
    model.onChange(() => this.refresh());
    window.setInterval(() => this.refresh(), 5000); // idle clocks move between events
  }

  setKernel(kernelId: string | null): void {
    this.kernelId = kernelId;
    this.refresh();
  }

  refresh(): void {
    const kernel = this.kernelId ? (this.model.kernelById(this.kernelId) ?? null) : null;
    let req = kernel?.request_id ? (this.model.requests.get(kernel.request_id) ?? null) : null;
    const preemption = kernel?.request_id ? this.model.preemptions.get(kernel.request_id) : undefined;
    if (req && preemption) {
      req = { ...req, preempt_at: preemption.at }; // heard by event, newer than the object
    }
    let text = statusText(kernel, req, this.model.idleTimeout(kernel?.tenant ?? null), Date.now() / 1000);
    if (kernel && kernel.state === 'running' && kernel.utilization === null && kernel.idle_since === null) {
      const dev = this.model.devices.find(d => d.node === kernel.node && kernel.devices.includes(d.index));
      if (dev && typeof dev.utilization === 'number') {
        text = statusText({ ...kernel, utilization: dev.utilization }, req, null, Date.now() / 1000);
      }
    }
    if (this.node.textContent !== text) {
      this.node.textContent = text;
      this.node.title = text ? `${text} (click for the GPUs panel)` : '';
    }
    this.setHidden(!text);
  }
}
