import {
  duration,
  errorSentence,
  formatPosition,
  formatWait,
  ordinal,
  quotaSentence,
  rowState,
  stateWords,
  statusText,
  waitKind,
  waitReason
} from '../format';
import { parseParameters, validate } from '../params';
import type { GpuKernelInfo, GpuRequest } from '../types';

function request(over: Partial<GpuRequest> = {}): GpuRequest {
  return {
    id: 'r-1',
    user: 'alice',
    tenant: 'vision',
    kind: 'kernel',
    gpus: 1,
    flavor: 'a100',
    priority: 0,
    state: 'queued',
    position: { tenant: 1, tenant_of: 1, overall: 1, of: 1 },
    estimated_wait: null,
    grant: null,
    ...over
  };
}

function kernel(over: Partial<GpuKernelInfo> = {}): GpuKernelInfo {
  return {
    kernel_id: 'k-1',
    kernel_name: 'gpu1',
    request_id: 'r-1',
    state: 'running',
    gpus: 1,
    flavor: 'a100',
    tenant: 'vision',
    position: null,
    node: 'a100-0',
    devices: [0],
    reason: null,
    warning: null,
    utilization: 0.43,
    idle_since: null,
    created: 0,
    ended: null,
    ...over
  };
}

describe('ordinal', () => {
  it.each([
    [1, '1st'],
    [2, '2nd'],
    [3, '3rd'],
    [4, '4th'],
    [11, '11th'],
    [12, '12th'],
    [13, '13th'],
    [21, '21st'],
    [102, '102nd'],
    [111, '111th']
  ])('%i is %s', (n, text) => expect(ordinal(n)).toBe(text));
});

describe('duration', () => {
  it('never says 0.0 seconds', () => {
    expect(duration(0)).toBe('under a second');
    expect(duration(0.4)).toBe('under a second');
    expect(duration(-3)).toBe('under a second');
  });
  it('reads as seconds, minutes, hours, days', () => {
    expect(duration(45)).toBe('45 s');
    expect(duration(89)).toBe('89 s');
    expect(duration(90)).toBe('2 min');
    expect(duration(6 * 60)).toBe('6 min');
    expect(duration(3600)).toBe('1 h');
    expect(duration(80 * 60)).toBe('1 h 20 min');
    expect(duration(3 * 86400)).toBe('3 days');
  });
});

describe('formatWait', () => {
  it('says why there is no estimate', () => {
    expect(formatWait({ seconds: null, basis: 'No running grant releases on its own' })).toBe(
      'unknown (no running grant releases on its own)'
    );
    expect(formatWait(null)).toBe('no estimate yet');
  });
  it('rounds to words', () => {
    expect(formatWait({ seconds: 240 })).toBe('about 4 min');
    expect(formatWait({ seconds: 2 })).toBe('any moment now');
    expect(formatWait({ seconds: 300, low: 240, high: 540 })).toBe('between 4 min and 9 min');
  });
});

describe('positions and reasons', () => {
  it('places a request in its tenant and overall', () => {
    expect(formatPosition({ tenant: 2, tenant_of: 3, overall: 4, of: 9 }, 'vision')).toBe(
      '2nd of 3 in vision, 4th of 9 overall'
    );
    expect(formatPosition({ tenant: 1, tenant_of: 1, overall: 1, of: 1 }, 'nlp')).toBe(
      '1st of 1 in nlp (the only team waiting)'
    );
  });
  it("uses the gateway's own sentence when it gives one", () => {
    const r = request({ waiting_for: { kind: 'capacity', message: 'No a100 GPU is free on any node.' } });
    expect(waitReason(r)).toBe('No a100 GPU is free on any node.');
    expect(waitKind(r)).toBe('capacity');
  });
  it('otherwise says what it waits for', () => {
    expect(waitReason(request())).toBe("Waiting for 1 a100 GPU to free up within vision's quota.");
    const behind = request({ position: { tenant: 3, tenant_of: 3, overall: 3, of: 3 } });
    expect(waitReason(behind)).toBe('2 earlier requests of vision are ahead of it.');
    expect(waitKind(behind)).toBe('turn');
    expect(waitKind(request())).toBe('quota');
  });
});

describe('rowState', () => {
  it("says a failed job's request failed, not finished", () => {
    const ended = request({ kind: 'job', state: 'finished' });
    expect(stateWords(rowState(ended, { state: 'failed' }))).toBe('failed');
    expect(stateWords(rowState(ended, { state: 'succeeded' }))).toBe('finished');
    expect(rowState(ended)).toBe('finished');
    // Only an ended request: a job whose state is stale does not hide a running one.
    expect(rowState(request({ kind: 'job', state: 'admitted' }), { state: 'failed' })).toBe('admitted');
  });
});

describe('quotaSentence', () => {
  it('tells own, borrowed, parked and waiting apart', () => {
    const text = quotaSentence('vision', {
      flavor: 'a100',
      quota: 2,
      admitted: 4,
      parked: 0,
      borrowed: 2,
      pending_gpus: 1,
      pending_requests: 1
    });
    expect(text).toBe(
      'vision uses 4 a100 of its 2: 2 of its own and 2 borrowed; 1 request waiting for 1 GPU'
    );
  });
  it('shows what is free to lend', () => {
    const text = quotaSentence('nlp', {
      flavor: 'a100',
      quota: 4,
      admitted: 1,
      parked: 1,
      borrowed: 0,
      pending_gpus: 0,
      pending_requests: 0
    });
    expect(text).toBe('nlp uses 1 a100 of its 4; 1 parked; 2 free to lend; nothing waiting');
  });
});

describe('statusText', () => {
  it('reads a queued kernel', () => {
    const r = request({ position: { tenant: 1, tenant_of: 1, overall: 3, of: 3 } });
    expect(statusText(kernel({ state: 'queued', devices: [] }), r, null, 0)).toBe(
      'GPU: queued 3rd (quota)'
    );
  });
  it('reads a busy kernel', () => {
    expect(statusText(kernel(), null, null, 0)).toBe('GPU: a100 ×1 · 43%');
  });
  it('reads an idle kernel with its cull time', () => {
    const now = 10000;
    const k = kernel({ idle_since: now - 24 * 60 });
    expect(statusText(k, null, 30 * 60, now)).toBe('GPU: a100 ×1 · idle 24 min · culled in 6 min');
  });
  it('is empty without a GPU kernel', () => {
    expect(statusText(null, null, null, 0)).toBe('');
  });
});

describe('errors', () => {
  it('turns an error body into a sentence, never JSON', () => {
    expect(errorSentence(403, { error: "you are not a member of tenant 'vision'", field: 'tenant' })).toBe(
      "You are not a member of tenant 'vision'."
    );
    expect(errorSentence(400, { error: 'must be a whole number', field: 'gpus' })).toBe(
      'Must be a whole number.'
    );
    expect(errorSentence(502, '<html>')).toBe('GPU service unreachable — retrying.');
  });
});

describe('the Run on GPU form', () => {
  it('parses papermill parameters', () => {
    expect(parseParameters('lr = 0.01\nepochs=20\nname = resnet\nflag = True\n# note')).toEqual({
      parameters: { lr: 0.01, epochs: 20, name: 'resnet', flag: true }
    });
    expect(parseParameters('lr 0.01')).toEqual({
      error: 'Line 1 of the parameters needs "name = value".'
    });
    expect(parseParameters('2x = 1')).toEqual({ error: 'Line 1: "2x" is not a Python name.' });
  });
  it('validates GPUs and priority, naming the field', () => {
    const base = { tenant: 'vision', flavor: '', gpus: '1', priority: '0', parameters: '' };
    expect(validate('a.ipynb', { ...base, gpus: '0' })).toEqual({
      field: 'gpus',
      message: 'GPUs must be a whole number of at least 1.'
    });
    expect(validate('a.ipynb', { ...base, priority: '1.5' })).toEqual({
      field: 'priority',
      message: 'Priority must be a whole number.'
    });
    expect(validate('dir/a.ipynb', { ...base, gpus: '2', parameters: 'lr = 0.1' })).toEqual({
      kind: 'notebook',
      path: 'dir/a.ipynb',
      tenant: 'vision',
      gpus: 2,
      priority: 0,
      parameters: { lr: 0.1 }
    });
    expect(validate('train.py', base)).toEqual({
      kind: 'script',
      path: 'train.py',
      tenant: 'vision',
      gpus: 1,
      priority: 0
    });
  });
});
