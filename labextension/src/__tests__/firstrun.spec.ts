/**
 * Issue 45 item 1: a notebook's GPU kernel takes its GPU at its first cell run. Until then
 * its record is `deferred` (no request): the status bar and "My work" say so, in the
 * server's words (the record's `message`), and it is no card, no request, no quota.
 */
import { statusText } from '../format';
import { GpuModel } from '../model';
import type { GpuKernelInfo } from '../types';

const SAID = 'GPU kernel: takes a GPU when you run a cell';

function deferred(id: string, over: Partial<GpuKernelInfo> = {}): GpuKernelInfo {
  return {
    kernel_id: id,
    kernel_name: 'Python 3 (1 GPU)',
    request_id: null,
    state: 'deferred',
    gpus: 1,
    flavor: 'a100',
    tenant: null,
    position: null,
    node: null,
    devices: [],
    reason: null,
    message: SAID,
    warning: null,
    utilization: null,
    idle_since: null,
    created: 0,
    ended: null,
    ...over
  };
}

describe('a GPU kernel that takes its GPU at its first run', () => {
  it('says so in the status bar, in the words the server sent', () => {
    expect(statusText(deferred('k-1'), null, null, 0)).toBe(SAID);
  });

  it('is listed by its notebook while deferred, and no longer once it asked', () => {
    const model = new GpuModel();
    model.setKernels([deferred('k-1'), deferred('k-2'), deferred('k-3', { state: 'queued', request_id: 'r-3', message: 'waiting' })]);
    model.setNotebooks(new Map([['k-1', 'work/train.ipynb']]));
    const listed = model.deferredKernels();
    expect(listed.map(k => k.kernel_id)).toEqual(['k-1', 'k-2']);
    expect(listed.map(k => model.kernelTitle(k))).toEqual(['train.ipynb', 'Python 3 (1 GPU)']);
    expect(model.liveRows()).toEqual([]); // no request: no card, nothing counted as queued
    model.setKernels([deferred('k-1', { state: 'submitting', message: 'asking' }), deferred('k-2')]);
    expect(model.deferredKernels().map(k => k.kernel_id)).toEqual(['k-2']);
  });
});
