/**
 * Issue 45 item 3, one consistent sidebar: quota, rows and devices from one step; every
 * row titled by its notebook, never an id; ended rows as a short history in words; every
 * toast names its notebook.
 */
import { endedWords, rowState, stateWords } from '../format';
import { GpuModel, mergeChanges } from '../model';
import type { Device, GatewayEvent, GpuKernelInfo, GpuRequest, Tenant } from '../types';

const ME = { name: 'alice', groups: ['vision'], use: true, view: false, admin: false, tenants: ['vision'] };

function req(id: string, over: Partial<GpuRequest> = {}): GpuRequest {
  return {
    id,
    user: 'alice',
    tenant: 'vision',
    kind: 'kernel',
    gpus: 1,
    flavor: 'a100',
    priority: 0,
    state: 'queued',
    submit_time: 100,
    position: { tenant: 1, tenant_of: 1, overall: 1, of: 1 },
    estimated_wait: null,
    grant: null,
    ...over
  };
}

function admitted(id: string, over: Partial<GpuRequest> = {}): GpuRequest {
  return req(id, {
    state: 'admitted',
    position: null,
    grant: { node: 'a100-0', devices: [0], flavor: 'a100', lease_expires: 200 },
    ...over
  });
}

function kernel(over: Partial<GpuKernelInfo> = {}): GpuKernelInfo {
  return {
    kernel_id: 'k-1',
    kernel_name: 'Python 3 (1 GPU)',
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
    utilization: null,
    idle_since: null,
    created: 0,
    ended: null,
    ...over
  };
}

function ev(name: string, request: GpuRequest, extra: Record<string, unknown> = {}): GatewayEvent {
  return { name, data: { t: 1000, id: request.id, request, ...extra } };
}

/** vision's usage of its one a100 as the gateway reports it. */
function tenants(admittedGpus: number, pendingGpus: number): { tenants: Tenant[] } {
  return {
    tenants: [
      {
        name: 'vision',
        quota: { a100: 1 },
        usage: [
          {
            flavor: 'a100',
            quota: 1,
            admitted: admittedGpus,
            parked: 0,
            borrowed: 0,
            pending_gpus: pendingGpus,
            pending_requests: pendingGpus
          }
        ]
      }
    ]
  };
}

function devices(holder: string | null): { devices: Device[] } {
  return {
    devices: [
      {
        node: 'a100-0',
        index: 0,
        flavor: 'a100',
        holder: holder ? { id: holder, user: 'alice', tenant: 'vision', kind: 'kernel' } : null
      }
    ]
  };
}

function model(): GpuModel {
  const m = new GpuModel();
  m.setMe(ME);
  return m;
}

/** The quota card, the rows and the devices say the same: every GPU my rows run on is
 * counted in my tenant's usage and held by that row on the devices list, and the queue
 * the card counts is at least my queued rows. */
function agree(m: GpuModel): void {
  const usage = m.tenants[0].usage[0];
  const running = m.liveRows().filter(r => r.state === 'admitted');
  const queued = m.liveRows().filter(r => r.state === 'queued');
  expect(usage.admitted).toBeGreaterThanOrEqual(running.reduce((n, r) => n + r.gpus, 0));
  expect(usage.pending_gpus).toBeGreaterThanOrEqual(queued.reduce((n, r) => n + r.gpus, 0));
  for (const r of running) {
    expect(m.devices.some(d => d.holder?.id === r.id)).toBe(true);
  }
  for (const d of m.devices) {
    if (d.holder) {
      expect(m.requests.get(d.holder.id)?.state).toBe('admitted');
    }
  }
}

describe('one consistent sidebar', () => {
  it('applies events with the quota and devices read after them, in one change', () => {
    const m = model();
    m.setRequests([]);
    m.setTenants(tenants(0, 0).tenants);
    m.setDevices(devices(null).devices);
    agree(m);

    // A kernel is admitted on device 0 and a second one queues behind it: one step.
    const step = m.applyBatch([ev('submit', req('r-1')), ev('admit', admitted('r-1')), ev('submit', req('r-2'))], {
      tenants: tenants(1, 1),
      devices: devices('r-1')
    });
    expect(step.changes.map(c => c.section).sort()).toEqual(['devices', 'quota', 'work']);
    expect(step.changes.find(c => c.section === 'work')!.keys.sort()).toEqual(['r-1', 'r-2']);
    agree(m);
    expect(m.tenants[0].usage[0].admitted).toBe(1);

    // It ends, the second takes the GPU.
    m.applyBatch(
      [
        ev('finish', admitted('r-1', { state: 'finished', grant: null, reason: 'released by alice' })),
        ev('admit', admitted('r-2'))
      ],
      { tenants: tenants(1, 0), devices: devices('r-2') }
    );
    agree(m);
    expect(m.liveRows().map(r => r.id)).toEqual(['r-2']);
    expect(m.historyRows().map(r => r.id)).toEqual(['r-1']);
  });

  it('merges the changes of a batch, one per section', () => {
    expect(
      mergeChanges([
        { section: 'work', keys: ['a'] },
        { section: 'work', keys: ['b', 'a'] },
        { section: 'quota', keys: [] },
        { section: 'quota', keys: ['x'] }
      ])
    ).toEqual([
      { section: 'work', keys: ['a', 'b'] },
      { section: 'quota', keys: [] }
    ]);
  });

  it('titles a row by its notebook, even after its kernel ended, and never by an id', () => {
    const m = model();
    m.setRequests([admitted('r-1'), admitted('r-2'), admitted('r-3'), admitted('r-4')]);
    m.setKernels([
      kernel(),
      kernel({ kernel_id: 'k-2', request_id: 'r-2' }),
      kernel({ kernel_id: 'k-3', request_id: 'r-3' })
    ]);
    m.setNotebooks(
      new Map([
        ['k-1', 'work/train.ipynb'],
        ['k-2', 'eval.ipynb'],
        ['k-3', 'sweep.ipynb']
      ])
    );
    expect(m.titleOf(m.requests.get('r-1')!)).toBe('train.ipynb');

    // nlp takes its GPU back: the kernel is gone, its session too; the name stays.
    const stop = m.applyEvent(
      ev('preempt', admitted('r-1', { state: 'preempted', grant: null, reason: 'preempted: nlp took back its GPU' }), {
        by: 'r-nlp'
      })
    );
    m.setKernels([kernel({ kernel_id: 'k-2', request_id: 'r-2' }), kernel({ kernel_id: 'k-3', request_id: 'r-3' })]);
    m.setNotebooks(new Map([['k-2', 'eval.ipynb'], ['k-3', 'sweep.ipynb']]));
    const r1 = m.requests.get('r-1')!;
    expect(m.titleOf(r1)).toBe('train.ipynb');
    expect(m.endedReason(r1)).toBe('Preempted: nlp took back its GPU.');
    // The toast says which of the three GPU kernels stopped.
    expect(stop.notices.map(n => n.message)).toEqual(['Your GPU kernel train.ipynb was preempted: nlp took back its GPU.']);
    // Seen only in the gateway's list (the page opened later): its name without the
    // kernel id the gateway's name carries.
    m.setRequests([...m.requests.values(), admitted('r-5', { name: 'Python 3 (1 GPU) (047af73e)' })]);
    expect(m.titleOf(m.requests.get('r-5')!)).toBe('Python 3 (1 GPU)');
    // A request nothing names reads as what it is, not as its id.
    expect(m.titleOf(m.requests.get('r-4')!)).toBe('');
    expect(m.what(m.requests.get('r-4')!)).toBe('GPU kernel');
    for (const r of m.requests.values()) {
      expect(m.what(r)).not.toMatch(/r-\d|k-\d/);
    }
  });

  it('names the notebook in every toast', () => {
    const m = model();
    m.setRequests([admitted('r-1'), req('r-2')]);
    m.setKernels([kernel(), kernel({ kernel_id: 'k-2', request_id: 'r-2', state: 'queued' })]);
    m.setNotebooks(new Map([['k-1', 'train.ipynb'], ['k-2', 'eval.ipynb']]));
    const messages = [
      ...m.applyEvent(ev('cull_warning', admitted('r-1'), { cull_at: 1120 })).notices,
      ...m.applyEvent(ev('cull', admitted('r-1', { state: 'culled', grant: null }))).notices,
      ...m.applyEvent(ev('admit', admitted('r-2'))).notices
    ].map(n => n.message);
    expect(messages).toEqual([
      'Your GPU kernel train.ipynb is idle on its GPU and will be shut down in 2 min to free it. Keep it?',
      'Your GPU kernel train.ipynb was idle and gave back its GPU.',
      'Your GPU kernel eval.ipynb got 1 a100 GPU on a100-0.'
    ]);
  });

  it('says what happened to an ended row in a few words', () => {
    const ended = (over: Partial<GpuRequest>): GpuRequest => req('r-9', { position: null, ...over });
    expect(endedWords(ended({ kind: 'job', state: 'finished' }), 'alice', 'succeeded')).toBe('succeeded');
    expect(endedWords(ended({ state: 'cancelled', reason: 'cancelled by alice' }), 'alice')).toBe('cancelled by you');
    expect(endedWords(ended({ state: 'cancelled', reason: 'cancelled by an admin (root)' }), 'alice')).toBe(
      'cancelled by an admin (root)'
    );
    expect(endedWords(ended({ state: 'finished', reason: 'released by alice' }), 'alice')).toBe('stopped by you');
    expect(endedWords(ended({ state: 'preempted', reason: 'preempted: nlp took back its GPU' }), 'alice')).toBe(
      'preempted: nlp took back its GPU'
    );
    expect(endedWords(ended({ state: 'finished', reason: 'reservation claimed by r-41eb23f0ce1349ae' }), 'alice')).toBe(
      'resumed by a new request'
    );
    expect(endedWords(ended({ state: 'finished', reason: 'lease expired' }), 'alice')).toBe(
      'lost: it stopped answering the gateway'
    );
    // A succeeded and a cancelled job no longer read the same.
    const m = model();
    m.setRequests([
      ended({ id: 'r-5', kind: 'job', state: 'finished', reason: 'released by alice' }),
      ended({ id: 'r-6', kind: 'job', state: 'cancelled', reason: 'cancelled by alice' })
    ]);
    m.setJobs([
      { ...job('r-5'), state: 'succeeded' },
      { ...job('r-6'), state: 'cancelled' }
    ]);
    expect(m.historyRows().map(r => m.endedReason(r)).sort()).toEqual(['Cancelled by you.', 'Succeeded.']);
  });

  it('does not undo a Keep when the answered warning is heard late', () => {
    const m = model();
    m.setRequests([admitted('r-1')]);
    m.applyEvent(ev('cull_warning', admitted('r-1'), { cull_at: 1120 }));
    m.markKept('r-1');
    // The same warning again (a batch applied after the read of the quota): still kept.
    expect(m.applyEvent(ev('cull_warning', admitted('r-1'), { cull_at: 1120 })).notices).toEqual([]);
    expect(m.warnings.get('r-1')!.kept).toBe(true);
    // A new warning (its idle clock ran out again) is a new question.
    expect(m.applyEvent(ev('cull_warning', admitted('r-1'), { cull_at: 1300 })).notices).toHaveLength(1);
    expect(m.warnings.get('r-1')!.kept).toBe(false);
  });

  it("badges an expired reservation 'expired', as its sentence says, not 'culled'", () => {
    // The gateway ends a parked reservation that ran out as "culled", reason "expired: …".
    const m = model();
    const gone = req('r-7', {
      position: null,
      state: 'culled',
      reason: 'expired: its parked GPU was not taken back within 10 min'
    });
    const culled = req('r-8', { position: null, state: 'culled', reason: 'culled: idle on its GPU for 1 min' });
    m.setRequests([gone, culled]);
    expect(m.historyRows().map(r => r.id).sort()).toEqual(['r-7', 'r-8']);
    expect(stateWords(rowState(gone))).toBe('expired');
    expect(m.endedReason(gone)).toBe('Expired: its parked GPU was not taken back within 10 min.');
    // A cull without a reservation (or before it expired) still says culled.
    expect(stateWords(rowState(culled))).toBe('culled');
    expect(stateWords(rowState(req('r-9', { state: 'culled', reason: null })))).toBe('culled');
  });

  it('keeps a parked badge short enough for the card', () => {
    expect(stateWords('parked')).toBe('parked');
    expect(stateWords('culled')).toBe('culled');
  });
});

function job(id: string) {
  return {
    id,
    kind: 'notebook',
    name: 'train.ipynb',
    tenant: 'vision',
    gpus: 1,
    flavor: 'a100',
    priority: 0,
    state: 'succeeded',
    reason: null,
    exit_status: 0,
    position: null,
    source: 'train.ipynb',
    source_path: null,
    output_path: null,
    log_path: null,
    parameters: {},
    created: 0,
    started: 1,
    ended: 2
  };
}
