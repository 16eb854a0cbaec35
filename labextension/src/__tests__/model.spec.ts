import { Change, ENDED_KEPT, GpuModel } from '../model';
import type { GatewayEvent, GpuRequest, Job } from '../types';

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
    estimated_wait: { seconds: null, basis: 'no running grant releases on its own' },
    grant: null,
    ...over
  };
}

function admitted(id: string, node = 'a100-0', devices = [0]): GpuRequest {
  return req(id, {
    state: 'admitted',
    position: null,
    estimated_wait: null,
    grant: { node, devices, flavor: 'a100', lease_expires: 200 }
  });
}

function ev(name: string, request: GpuRequest, extra: Record<string, unknown> = {}): GatewayEvent {
  return { name, data: { t: 1000, id: request.id, request, ...extra } };
}

function model(): GpuModel {
  const m = new GpuModel();
  m.setMe(ME);
  return m;
}

function workKeys(changes: Change[]): string[] {
  return changes.filter(c => c.section === 'work').flatMap(c => c.keys);
}

describe('GpuModel from an event stream', () => {
  it('follows a kernel from queued to admitted and tells me', () => {
    const m = model();
    m.setRequests([admitted('r-1'), req('r-2', { position: { tenant: 1, tenant_of: 1, overall: 1, of: 1 } })]);
    expect(m.requests.get('r-2')!.state).toBe('queued');

    // r-1 is released; r-2 is admitted: only r-2's row changes.
    const fin = m.applyEvent(ev('finish', { ...admitted('r-1'), state: 'finished', grant: null }));
    expect(workKeys(fin.changes)).toEqual(['r-1']);
    expect(fin.notices).toEqual([]);
    const adm = m.applyEvent(ev('admit', admitted('r-2')));
    expect(workKeys(adm.changes)).toEqual(['r-2']);
    expect(m.requests.get('r-2')!.state).toBe('admitted');
    expect(adm.notices).toHaveLength(1);
    expect(adm.notices[0]).toMatchObject({ kind: 'admitted', requestId: 'r-2' });
    expect(adm.notices[0].message).toBe('Your GPU kernel got 1 a100 GPU on a100-0.');
    // Queued rows come first, running next, ended last.
    expect(m.workRows().map(r => r.state)).toEqual(['admitted', 'finished']);
  });

  it('does not announce an admission it never saw waiting', () => {
    const m = model();
    const result = m.applyEvent(ev('admit', admitted('r-9')));
    expect(result.notices).toEqual([]);
    expect(m.requests.get('r-9')!.state).toBe('admitted');
  });

  it('updates the position of a queued row', () => {
    const m = model();
    m.setRequests([req('r-2', { position: { tenant: 2, tenant_of: 2, overall: 2, of: 2 } })]);
    m.applyEvent(ev('update', req('r-2', { position: { tenant: 1, tenant_of: 1, overall: 1, of: 1 } })));
    expect(m.requests.get('r-2')!.position!.overall).toBe(1);
  });

  it('ignores other users\' requests', () => {
    const m = model();
    const result = m.applyEvent(ev('submit', req('r-bob', { user: 'bob' })));
    expect(result.changes).toEqual([]);
    expect(m.requests.has('r-bob')).toBe(false);
  });

  it('marks a cancelled request cancelled', () => {
    const m = model();
    m.setRequests([req('r-3')]);
    m.applyEvent(ev('cancel', req('r-3', { state: 'cancelled', position: null })));
    expect(m.requests.get('r-3')!.state).toBe('cancelled');
    expect(m.workRows()[0].state).toBe('cancelled');
  });

  it('warns before a cull, once kept shows it kept, and forgets it on the cull', () => {
    const m = model();
    m.setRequests([admitted('r-1')]);
    const warned = m.applyEvent(ev('cull_warning', admitted('r-1'), { cull_at: 1120 }));
    expect(warned.notices).toHaveLength(1);
    expect(warned.notices[0]).toMatchObject({ kind: 'cull_warning', requestId: 'r-1', cullAt: 1120 });
    expect(warned.notices[0].message).toBe(
      'Your GPU kernel is idle on its GPU and will be shut down in 2 min to free it. Keep it?'
    );
    expect(m.warnings.get('r-1')).toEqual({ cullAt: 1120, t: 1000, kept: false });
    m.markKept('r-1');
    expect(m.warnings.get('r-1')!.kept).toBe(true);
    const culled = m.applyEvent(ev('cull', { ...admitted('r-1'), state: 'parked', grant: null }));
    expect(culled.notices[0].kind).toBe('culled');
    expect(m.warnings.has('r-1')).toBe(false);
  });

  it('asks for a full read on reset', () => {
    expect(model().applyEvent({ name: 'reset', data: {} }).reload).toBe(true);
  });

  it('keeps only the last few ended requests', () => {
    const m = model();
    const ended = Array.from({ length: ENDED_KEPT + 3 }, (_, i) =>
      req(`e-${i}`, { state: 'finished', submit_time: i })
    );
    m.setRequests([...ended, req('q-1')]);
    expect(m.requests.size).toBe(ENDED_KEPT + 1);
    expect(m.requests.has('e-0')).toBe(false);
    expect(m.requests.has(`e-${ENDED_KEPT + 2}`)).toBe(true);
  });

  it('says whose a device is', () => {
    const m = model();
    m.setRequests([admitted('r-1')]);
    const holder = (id: string, user: string, tenant: string) => ({ id, user, tenant, kind: 'kernel' });
    expect(m.ownerOf({ node: 'n', index: 0, holder: holder('r-1', 'alice', 'vision') })).toBe('mine');
    expect(m.ownerOf({ node: 'n', index: 1, holder: holder('r-7', 'bob', 'vision') })).toBe('team');
    expect(m.ownerOf({ node: 'n', index: 2, holder: holder('r-8', 'carol', 'nlp') })).toBe('other');
    expect(m.ownerOf({ node: 'n', index: 3, holder: null })).toBe('free');
  });

  it("names other users' devices only with the view scope", () => {
    const holder = (id: string, user: string | null, tenant: string) => ({ id, user, tenant, kind: 'kernel' });
    const carol = { node: 'n', index: 2, holder: holder('r-8', 'carol', 'nlp') };
    const bob = { node: 'n', index: 1, holder: holder('r-7', 'bob', 'vision') };
    const plain = model();
    plain.setRequests([admitted('r-1')]);
    expect(plain.deviceOwnerWords({ node: 'n', index: 0, holder: holder('r-1', 'alice', 'vision') })).toBe('mine');
    expect(plain.deviceOwnerWords({ node: 'n', index: 3, holder: null })).toBe('free');
    // Without view: never a name, even if one came (the gateway sends none: user null).
    expect(plain.deviceOwnerWords(carol)).toBe('another team (nlp)');
    expect(plain.deviceOwnerWords(bob)).toBe('my team (vision)');
    expect(plain.deviceOwnerWords({ ...carol, holder: holder('r-8', null, 'nlp') })).toBe('another team (nlp)');
    const viewer = new GpuModel();
    viewer.setMe({ ...ME, view: true });
    expect(viewer.deviceOwnerWords(carol)).toBe('carol (nlp)');
    expect(viewer.deviceOwnerWords(bob)).toBe('bob (vision)');
  });

  it('tells me when a job finishes or fails', () => {
    const m = model();
    const job = (state: string, reason: string | null = null): Job => ({
      id: 'j-1',
      kind: 'notebook',
      name: 'train.ipynb',
      tenant: 'vision',
      gpus: 1,
      flavor: null,
      priority: 0,
      state,
      reason,
      exit_status: null,
      position: null,
      source: '/root/train.ipynb',
      source_path: 'train.ipynb',
      output_path: 'gpu-jobs/j-1/train.ipynb',
      log_path: 'gpu-jobs/j-1/output.log',
      parameters: {},
      created: 1,
      started: null,
      ended: null
    });
    expect(m.setJobs([job('running')]).notices).toEqual([]);
    const done = m.setJobs([job('succeeded')]);
    expect(done.notices).toEqual([{ kind: 'job_done', requestId: 'j-1', message: 'Job train.ipynb finished.' }]);
    expect(done.changes).toEqual([{ section: 'jobs', keys: ['j-1'] }]);
    expect(m.setJobs([job('succeeded')]).changes).toEqual([]); // nothing changed: no redraw
    m.setJobs([job('running')]);
    expect(m.setJob(job('failed', 'exit status 1')).notices[0].message).toBe(
      'Job train.ipynb failed: exit status 1.'
    );
  });

  it('maps kernels to their requests and notebooks', () => {
    const m = model();
    const k = {
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
      utilization: null,
      idle_since: null,
      created: 0,
      ended: null
    };
    expect(workKeys(m.setKernels([k]))).toEqual(['r-1']);
    expect(m.setKernels([k])).toEqual([]); // the same again: no change
    expect(workKeys(m.setNotebooks(new Map([['k-1', 'work/train.ipynb']])))).toEqual(['r-1']);
    expect(m.kernelById('k-1')!.request_id).toBe('r-1');
  });
});
