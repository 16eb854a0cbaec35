import { GpuModel, preemptLine } from '../model';
import { gpusTaken, statusText, usageSentence, waitReason } from '../format';
import type { GatewayEvent, GpuKernelInfo, GpuRequest, TenantUsage } from '../types';

const ME = { name: 'alice', groups: ['vision'], use: true, view: false, admin: false, tenants: ['vision'] };

function admitted(id: string, over: Partial<GpuRequest> = {}): GpuRequest {
  return {
    id,
    user: 'alice',
    tenant: 'vision',
    kind: 'kernel',
    gpus: 1,
    flavor: 'a100',
    priority: 0,
    state: 'admitted',
    submit_time: 100,
    position: null,
    estimated_wait: null,
    grant: { node: 'a100-0', devices: [1], flavor: 'a100', lease_expires: 200 },
    ...over
  };
}

function model(): GpuModel {
  const m = new GpuModel();
  m.setMe(ME);
  return m;
}

const WARNED = {
  preempt_at: 1240,
  preempted_by: 'r-nlp',
  preempt_reason: 'nlp is reclaiming its GPU'
};

function ev(name: string, request: GpuRequest, extra: Record<string, unknown> = {}): GatewayEvent {
  return { name, data: { t: 1000, id: request.id, request, ...extra } };
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
    devices: [1],
    reason: null,
    warning: null,
    utilization: null,
    idle_since: null,
    created: 0,
    ended: null,
    ...over
  };
}

describe('a preemption warning', () => {
  it('is shown on the row with its reason and told once, then withdrawn with an info', () => {
    const m = model();
    m.setRequests([admitted('r-1')]);
    expect(m.preemptions.size).toBe(0);

    const warn = m.applyEvent(ev('preempt_warning', admitted('r-1', WARNED), { by: 'r-nlp', at: 1240 }));
    expect(warn.notices).toHaveLength(1);
    expect(warn.notices[0].kind).toBe('preempt_warning');
    expect(warn.notices[0].message).toBe(
      'Your GPU kernel will be stopped in 4 min: nlp is reclaiming its GPU.'
    );
    const p = m.preemptions.get('r-1')!;
    expect(p).toEqual({ at: 1240, by: 'r-nlp', reason: 'nlp is reclaiming its GPU' });
    expect(preemptLine(p, 1000)).toBe('It will be stopped in 4 min: nlp is reclaiming its GPU.');
    expect(preemptLine(p, 1180)).toBe('It will be stopped in 60 s: nlp is reclaiming its GPU.');
    // The notebook's own line: one sentence too.
    expect(preemptLine(p, 1000, "This notebook's GPU kernel")).toBe(
      "This notebook's GPU kernel will be stopped in 4 min: nlp is reclaiming its GPU."
    );

    // The same warning heard again (a reconnect's replay): not told twice.
    expect(m.applyEvent(ev('preempt_warning', admitted('r-1', WARNED), { at: 1240 })).notices).toEqual([]);
    // A snapshot read meanwhile keeps it (the object carries preempt_at).
    m.setRequests([admitted('r-1', WARNED)]);
    expect(m.preemptions.has('r-1')).toBe(true);

    const back = m.applyEvent(ev('preempt_withdrawn', admitted('r-1'), { by: 'r-nlp' }));
    expect(m.preemptions.has('r-1')).toBe(false);
    expect(back.notices.map(n => [n.kind, n.message])).toEqual([
      ['preempt_withdrawn', 'Your GPU kernel keeps its GPU: it is no longer reclaimed.']
    ]);
    // A withdrawal of a warning never heard of tells nothing.
    expect(m.applyEvent(ev('preempt_withdrawn', admitted('r-1'))).notices).toEqual([]);
  });

  it('ends in preempted after the grace', () => {
    const m = model();
    m.setRequests([admitted('r-1', WARNED)]); // learned from a snapshot, not an event
    expect(m.preemptions.get('r-1')!.reason).toBe('nlp is reclaiming its GPU');
    // Told once, when read (the page opened during the grace); the event after it: not again.
    expect(m.untoldPreemptions(1000).map(n => n.message)).toEqual([
      'Your GPU kernel will be stopped in 4 min: nlp is reclaiming its GPU.'
    ]);
    expect(m.untoldPreemptions(1000)).toEqual([]);
    expect(m.applyEvent(ev('preempt_warning', admitted('r-1', WARNED), { at: 1240 })).notices).toEqual([]);
    const gone = m.applyEvent(ev('preempt', admitted('r-1', { state: 'preempted', grant: null }), { by: 'r-nlp' }));
    expect(m.preemptions.has('r-1')).toBe(false);
    expect(m.requests.get('r-1')!.state).toBe('preempted');
    expect(gone.notices.map(n => [n.kind, n.message])).toEqual([
      ['preempted', 'Your GPU kernel was stopped: nlp is reclaiming its GPU.']
    ]);
  });

  it('says in words who preempted a row, never the raw request id', () => {
    const m = model();
    const raw = { state: 'preempted', grant: null, reason: 'preempted by r-7f3a9c' };
    // Warned first: the warning's reason stays on the ended row.
    m.setRequests([admitted('r-1', WARNED), admitted('r-2')]);
    m.applyEvent(ev('preempt', admitted('r-1', raw), { by: 'r-nlp' }));
    expect(m.endedReason(m.requests.get('r-1')!)).toBe('Stopped: nlp is reclaiming its GPU.');
    // Not warned, by another user's request: what it was, not its id.
    const other = m.applyEvent(ev('preempt', admitted('r-2', raw), { by: 'r-7f3a9c' }));
    const words = m.endedReason(m.requests.get('r-2')!);
    expect(words).toBe(
      'Preempted: a request with a better claim (a higher priority, or a team taking back its quota) needed its GPU.'
    );
    expect(words).not.toContain('r-7f3a9c');
    expect(other.notices[0].message).toBe(
      'Your GPU kernel was preempted: a request with a better claim (a higher priority, or a team taking back its quota) needed its GPU.'
    );
    // By one of my own requests: named by what it is.
    m.setRequests([admitted('r-3'), admitted('r-9', { kind: 'job', name: 'train.ipynb', priority: 5 })]);
    m.applyEvent(ev('preempt', admitted('r-3', { ...raw, reason: 'preempted by r-9' }), { by: 'r-9' }));
    expect(m.endedReason(m.requests.get('r-3')!)).toBe(
      'Preempted: my GPU job train.ipynb, of a higher priority in vision, needed its GPU.'
    );
    // Read from a snapshot only (the page opened later): still no raw id.
    const fresh = model();
    fresh.setRequests([admitted('r-4', raw)]);
    expect(fresh.endedReason(fresh.requests.get('r-4')!)).not.toMatch(/r-7f3a9c|preempted by/);
  });

  it('counts the GPUs a preemption took, as the gateway does (words.gpus_taken)', () => {
    expect(gpusTaken(1)).toBe('its GPU');
    expect(gpusTaken(1, 3)).toBe('its GPU');
    expect(gpusTaken(4, 1)).toBe('1 of its 4 GPUs');
    expect(gpusTaken(4, 4)).toBe('its 4 GPUs');
    expect(gpusTaken(4)).toBe('its 4 GPUs');
    expect(gpusTaken(4, 2, 'the')).toBe('2 of the 4 GPUs');
    // The sidebar's own words, when the gateway's object names only the preemptor's id:
    // a 4-GPU kernel preempted by a 1-GPU job of mine, and by someone else's request.
    const m = model();
    const raw = { state: 'preempted', grant: null, reason: 'preempted by r-9', gpus: 4 };
    m.setRequests([admitted('r-3', { gpus: 4 }), admitted('r-9', { kind: 'job', name: 'train.ipynb', priority: 5 })]);
    m.applyEvent(ev('preempt', admitted('r-3', raw), { by: 'r-9' }));
    expect(m.endedReason(m.requests.get('r-3')!)).toBe(
      'Preempted: my GPU job train.ipynb, of a higher priority in vision, needed 1 of its 4 GPUs.'
    );
    m.setRequests([admitted('r-4', { gpus: 4 })]);
    m.applyEvent(ev('preempt', admitted('r-4', { ...raw, reason: 'preempted by r-7f3a9c' }), { by: 'r-7f3a9c' }));
    expect(m.endedReason(m.requests.get('r-4')!)).toMatch(/needed its 4 GPUs\.$/);
    // The gateway's counted words are shown as they are.
    m.setRequests([admitted('r-5', { gpus: 4, state: 'preempted', grant: null, reason: 'preempted: nlp took back 1 of its 4 GPUs' })]);
    expect(m.endedReason(m.requests.get('r-5')!)).toBe('Preempted: nlp took back 1 of its 4 GPUs.');
  });

  it('is not mistaken for a cull warning from the kernel record', () => {
    const m = model();
    m.setRequests([admitted('r-1', WARNED)]);
    m.setKernels([kernel({ warning: { message: 'your kernel gpu1 will be stopped', preempt_at: 1240, t: 1000 } })]);
    expect(m.warnings.has('r-1')).toBe(false); // no "Keep my GPU" for a preemption
    expect(m.preemptionOfKernel('k-1')!.at).toBe(1240);
  });

  it('shows in the status bar, over busy and idle', () => {
    const k = kernel({ idle_since: 900 });
    expect(statusText(k, admitted('r-1', WARNED), 600, 1000)).toBe('GPU: a100 ×1 · reclaimed in 4 min');
    expect(statusText(k, admitted('r-1'), 600, 1000)).toBe('GPU: a100 ×1 · idle 2 min · culled in 8 min');
  });
});

describe('wait reasons and usage from the gateway', () => {
  it('shows waiting_for.message as the reason, and falls back for older gateways', () => {
    const queued = admitted('r-2', {
      state: 'queued',
      grant: null,
      position: { tenant: 1, tenant_of: 1, overall: 2, of: 2 },
      waiting_for: { kind: 'capacity', message: 'All 2 a100 GPUs are in use; the first frees in about 4 min.' }
    });
    expect(waitReason(queued)).toBe('All 2 a100 GPUs are in use; the first frees in about 4 min.');
    expect(waitReason({ ...queued, waiting_for: undefined })).toBe(
      "Waiting for 1 a100 GPU to free up within vision's quota."
    );
  });

  it('uses the usage message of the gateway, with what waits; ours without one', () => {
    const u: TenantUsage = {
      flavor: 'a100',
      quota: 1,
      admitted: 2,
      parked: 0,
      borrowed: 1,
      pending_gpus: 1,
      pending_requests: 1,
      borrowed_from: ['nlp'],
      message: 'vision uses 2 a100: 1 of its own and 1 borrowed from nlp'
    };
    expect(usageSentence('vision', u)).toBe(
      'vision uses 2 a100: 1 of its own and 1 borrowed from nlp; 1 request waiting for 1 GPU.'
    );
    const { message: _m, ...old } = u;
    expect(usageSentence('vision', old)).toBe(
      'vision uses 2 a100 of its 1: 1 of its own and 1 borrowed; 1 request waiting for 1 GPU.'
    );
  });
});
