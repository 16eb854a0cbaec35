/** "Team quota": per tenant of mine and flavor, used against nominal, with borrowed,
 * parked and lendable shown apart (in words and in a bar whose parts are labelled). */

import { lendableOf, usageSentence } from '../format';
import { GpuModel } from '../model';
import type { Tenant, TenantUsage } from '../types';
import { h, Rows, section } from './dom';

export class QuotaSection {
  readonly root: HTMLElement;
  private list: HTMLElement;
  private empty: HTMLElement;
  private rows: Rows<[Tenant, TenantUsage]>;

  constructor(private readonly model: GpuModel) {
    const s = section('quota', 'Team quota');
    this.root = s.root;
    this.list = h('ul', { class: 'jp-gpuaas-list', 'aria-label': 'Quota of my teams' });
    this.empty = h('p', { class: 'jp-gpuaas-empty', text: 'You belong to no GPU team.' });
    s.body.append(this.list, this.empty);
    this.rows = new Rows(this.list, ([t, u], row) => this.renderRow(t, u, row));
  }

  update(): void {
    const items: Array<[string, [Tenant, TenantUsage]]> = [];
    for (const t of this.model.tenants) {
      const usage = t.usage.length
        ? t.usage
        : Object.entries(t.quota).map(([flavor, quota]) => ({
            flavor,
            quota,
            admitted: 0,
            parked: 0,
            borrowed: 0,
            pending_gpus: 0,
            pending_requests: 0
          }));
      for (const u of usage) {
        items.push([`${t.name}/${u.flavor}`, [t, u]]);
      }
    }
    this.rows.sync(items);
    this.empty.hidden = items.length > 0;
  }

  private renderRow(t: Tenant, u: TenantUsage, row: HTMLElement): void {
    row.className = 'jp-gpuaas-row jp-gpuaas-quota-row';
    row.replaceChildren();
    const own = Math.min(u.admitted, u.quota);
    const lendable = lendableOf(u, t.lending_limit?.[u.flavor]);
    const total = Math.max(u.quota + u.borrowed, 1);
    const part = (cls: string, n: number, label: string): HTMLElement | null =>
      n > 0
        ? h('span', {
            class: `jp-gpuaas-bar-part ${cls}`,
            style: `width: ${(100 * n) / total}%`,
            title: label,
            text: String(n)
          })
        : null;
    const bar = h(
      'div',
      {
        class: 'jp-gpuaas-bar',
        role: 'meter',
        'aria-valuemin': 0,
        'aria-valuemax': u.quota,
        'aria-valuenow': u.admitted,
        'aria-label': `${t.name} ${u.flavor}: ${u.admitted} used of ${u.quota}`
      },
      part('jp-gpuaas-bar-own', own, `${own} used of its own`),
      part('jp-gpuaas-bar-borrowed', u.borrowed, `${u.borrowed} borrowed`),
      part('jp-gpuaas-bar-parked', u.parked, `${u.parked} parked`)
    );
    row.append(
      h('div', { class: 'jp-gpuaas-row-head' },
        h('span', { class: 'jp-gpuaas-title', text: `${t.name} · ${u.flavor}` }),
        h('span', { class: 'jp-gpuaas-count', text: `${u.admitted} / ${u.quota}` })
      ),
      bar,
      // The gateway's own sentence when it gives one (it names the lenders); ours else.
      h('p', { class: 'jp-gpuaas-line', text: usageSentence(t.name, u) }),
      h('p', {
        class: 'jp-gpuaas-line jp-gpuaas-legend',
        text: `own ${own} · borrowed ${u.borrowed} · parked ${u.parked} · lendable ${lendable} · waiting ${u.pending_requests}`
      })
    );
  }
}
