/** "Run on GPU as a job…": tenant, flavor, GPUs, priority and papermill parameters, checked
 * here first, then by the server; a refusal is shown inline and the form stays filled. */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { RunSpec, RunValues, validate } from '../params';
import type { Me, Tenant } from '../types';
import { h } from './dom';

class RunForm extends Widget {
  private fields: Record<keyof RunValues, HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement>;
  private errors: Record<string, HTMLElement> = {};

  constructor(path: string, me: Me | null, tenants: Tenant[], values: RunValues, error: { field: string | null; message: string } | null) {
    super();
    this.addClass('jp-gpuaas-runform');
    const notebook = path.endsWith('.ipynb');
    const tenantSel = h('select', { id: 'jp-gpuaas-run-tenant', name: 'tenant' });
    for (const t of me?.tenants ?? []) {
      tenantSel.append(h('option', { value: t, text: t }));
    }
    tenantSel.value = values.tenant || (me?.tenants[0] ?? '');
    const flavorSel = h('select', { id: 'jp-gpuaas-run-flavor', name: 'flavor' });
    const fillFlavors = (): void => {
      const t = tenants.find(x => x.name === tenantSel.value);
      flavorSel.replaceChildren(h('option', { value: '', text: 'any of the team' }));
      for (const f of Object.keys(t?.quota ?? {})) {
        flavorSel.append(h('option', { value: f, text: f }));
      }
    };
    fillFlavors();
    tenantSel.addEventListener('change', fillFlavors);
    flavorSel.value = values.flavor;
    const gpus = h('input', { id: 'jp-gpuaas-run-gpus', name: 'gpus', type: 'number', min: 1, step: 1, value: values.gpus || '1' });
    const priority = h('input', { id: 'jp-gpuaas-run-priority', name: 'priority', type: 'number', step: 1, value: values.priority || '0' });
    const params = h('textarea', {
      id: 'jp-gpuaas-run-parameters',
      name: 'parameters',
      rows: 3,
      placeholder: 'lr = 0.01\nepochs = 20'
    });
    params.value = values.parameters;
    this.fields = { tenant: tenantSel, flavor: flavorSel, gpus, priority, parameters: params };
    const row = (label: string, field: keyof RunValues, el: HTMLElement, help = ''): HTMLElement => {
      const err = h('span', { class: 'jp-gpuaas-error', id: `jp-gpuaas-run-${field}-error`, role: 'alert' });
      this.errors[field] = err;
      el.setAttribute('aria-describedby', err.id);
      return h('div', { class: 'jp-gpuaas-field' },
        h('label', { for: el.id, text: label }), el,
        help ? h('span', { class: 'jp-gpuaas-help', text: help }) : null, err);
    };
    this.node.append(
      h('p', { class: 'jp-gpuaas-line', text: `Runs ${path} on its own GPUs; the outputs land in gpu-jobs/ beside it.` }),
      row('Team (tenant)', 'tenant', tenantSel),
      row('GPU kind (flavor)', 'flavor', flavorSel),
      row('GPUs', 'gpus', gpus),
      row('Priority', 'priority', priority, 'higher runs first within the team'),
    );
    if (notebook) {
      this.node.append(
        row('Parameters (papermill)', 'parameters', params, 'one "name = value" a line; values are read as JSON, else as text')
      );
    }
    this.general = h('p', { class: 'jp-gpuaas-error jp-gpuaas-run-error', role: 'alert' });
    this.node.append(this.general);
    if (error) {
      this.showError(error.field, error.message);
    }
  }

  general: HTMLElement;

  showError(field: string | null, message: string): void {
    const el = (field && this.errors[field]) || this.general;
    el.textContent = message;
  }

  values(): RunValues {
    return {
      tenant: this.fields.tenant.value,
      flavor: this.fields.flavor.value,
      gpus: this.fields.gpus.value,
      priority: this.fields.priority.value,
      parameters: this.fields.parameters.value
    };
  }
}

/**
 * Show the dialog until the server accepts the job or the user cancels; null if cancelled.
 * `submit` throws an error with `message` (and `field`) when the server refuses.
 */
export async function runOnGpuDialog<T>(
  path: string,
  me: Me | null,
  tenants: Tenant[],
  submit: (spec: RunSpec) => Promise<T>,
  initial?: Partial<RunValues>
): Promise<T | null> {
  let values: RunValues = { tenant: '', flavor: '', gpus: '1', priority: '0', parameters: '', ...initial };
  let error: { field: string | null; message: string } | null = null;
  for (;;) {
    const form = new RunForm(path, me, tenants, values, error);
    const result = await showDialog({
      title: 'Run on GPU as a job',
      body: form,
      focusNodeSelector: '#jp-gpuaas-run-gpus',
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Run on GPU', ariaLabel: 'Run on GPU' })]
    });
    values = form.values();
    if (!result.button.accept) {
      return null;
    }
    const spec = validate(path, values);
    if ('message' in spec) {
      error = spec;
      continue;
    }
    try {
      return await submit(spec);
    } catch (e) {
      const err = e as { message: string; field?: string | null };
      error = { field: err.field ?? null, message: err.message };
    }
  }
}
