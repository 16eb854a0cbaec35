/** "Devices": per node and device, utilization, memory, temperature and health, and whose
 * it is (mine, my team's or another's; other users' names only with the view scope). */

import { bytes, percent } from '../format';
import { GpuModel } from '../model';
import type { Device } from '../types';
import { h, Rows, section } from './dom';

export class DevicesSection {
  readonly root: HTMLElement;
  private list: HTMLElement;
  private note: HTMLElement;
  private rows: Rows<Device>;

  constructor(private readonly model: GpuModel) {
    const s = section('devices', 'Devices');
    this.root = s.root;
    this.note = h('p', { class: 'jp-gpuaas-note' });
    this.list = h('ul', { class: 'jp-gpuaas-list', 'aria-label': 'GPU devices' });
    s.body.append(this.note, this.list);
    this.rows = new Rows(this.list, (d, row) => this.renderRow(d, row));
  }

  update(): void {
    this.note.textContent = this.model.simulated
      ? 'Simulated devices: queueing and quotas are real, the figures are not.'
      : '';
    this.note.hidden = !this.model.simulated;
    this.rows.sync(this.model.devices.map(d => [`${d.node}/${d.index}`, d]));
  }

  private renderRow(d: Device, row: HTMLElement): void {
    const owner = this.model.ownerOf(d);
    row.className = `jp-gpuaas-row jp-gpuaas-device jp-gpuaas-owner-${owner}`;
    row.dataset.owner = owner;
    row.replaceChildren();
    const whose = this.model.deviceOwnerWords(d);
    const health = d.healthy === false ? `unhealthy${d.error ? `: ${d.error}` : ''}` : 'healthy';
    const mem = d.memory_total ? `${bytes(d.memory_used)} of ${bytes(d.memory_total)}` : bytes(d.memory_used);
    const temp = d.temperature === null || d.temperature === undefined ? 'n/a' : `${Math.round(d.temperature)} °C`;
    row.append(
      h('div', { class: 'jp-gpuaas-row-head' },
        h('span', { class: 'jp-gpuaas-title', text: `${d.node} · GPU ${d.index}${d.flavor ? ` (${d.flavor})` : ''}` }),
        h('span', { class: `jp-gpuaas-badge jp-gpuaas-badge-owner-${owner}`, text: whose })
      ),
      h('p', {
        class: 'jp-gpuaas-line',
        text: `${percent(d.utilization)} busy · memory ${mem} · ${temp} · ${health}`
      })
    );
  }
}
