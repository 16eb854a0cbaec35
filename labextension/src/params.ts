/** Papermill parameters typed in the Run on GPU dialog: one "name = value" a line. */

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

export function parseParameters(text: string): { parameters: Record<string, unknown> } | { error: string } {
  const parameters: Record<string, unknown> = {};
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].trim();
    if (!line || line.startsWith('#')) {
      continue;
    }
    const eq = line.indexOf('=');
    if (eq < 0) {
      return { error: `Line ${i + 1} of the parameters needs "name = value".` };
    }
    const name = line.slice(0, eq).trim();
    if (!NAME.test(name)) {
      return { error: `Line ${i + 1}: "${name}" is not a Python name.` };
    }
    const raw = line.slice(eq + 1).trim();
    let value: unknown = raw;
    try {
      value = JSON.parse(raw);
    } catch {
      value = raw.replace(/^(['"])(.*)\1$/, '$2'); // not JSON: text, quotes optional
    }
    if (raw === 'True' || raw === 'False') {
      value = raw === 'True';
    }
    parameters[name] = value;
  }
  return { parameters };
}

/** The inverse, for "Run again": the same parameters as the dialog shows them. */
export function formatParameters(parameters: Record<string, unknown>): string {
  return Object.entries(parameters)
    .map(([k, v]) => `${k} = ${JSON.stringify(v)}`)
    .join('\n');
}

export interface RunValues {
  tenant: string;
  flavor: string;
  gpus: string;
  priority: string;
  parameters: string;
}

export interface RunSpec {
  kind: 'notebook' | 'script';
  path: string;
  tenant?: string;
  flavor?: string;
  gpus: number;
  priority: number;
  parameters?: Record<string, unknown>;
}

/** Check the form; a spec, or the field and sentence that are wrong. */
export function validate(path: string, v: RunValues): RunSpec | { field: string; message: string } {
  const gpus = Number(v.gpus);
  if (!/^\s*\d+\s*$/.test(v.gpus) || !Number.isInteger(gpus) || gpus < 1) {
    return { field: 'gpus', message: 'GPUs must be a whole number of at least 1.' };
  }
  const priority = v.priority.trim() === '' ? 0 : Number(v.priority);
  if (!Number.isInteger(priority)) {
    return { field: 'priority', message: 'Priority must be a whole number.' };
  }
  const kind = path.endsWith('.ipynb') ? 'notebook' : 'script';
  const spec: RunSpec = { kind, path, gpus, priority };
  if (v.tenant) {
    spec.tenant = v.tenant;
  }
  if (v.flavor) {
    spec.flavor = v.flavor;
  }
  if (kind === 'notebook') {
    const parsed = parseParameters(v.parameters);
    if ('error' in parsed) {
      return { field: 'parameters', message: parsed.error };
    }
    if (Object.keys(parsed.parameters).length) {
      spec.parameters = parsed.parameters;
    }
  }
  return spec;
}

