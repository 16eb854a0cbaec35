/**
 * The GPUs sidebar in a real browser, against a real jupyter server (with the
 * jupyter_gpuaas server extension) and a real standalone gateway with simulated devices.
 * The tests run in order on one server: each leaves the GPUs free for the next.
 */
import AxeBuilder from '@axe-core/playwright';
import { expect, galata, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import type { APIRequestContext, Locator } from '@playwright/test';
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';

const ARTIFACTS = process.env.GPUAAS_ARTIFACTS || path.resolve(__dirname, '../../../test-artifacts/ui');
const GATEWAY = process.env.GPUAAS_GATEWAY_URL || '';
const ADMIN = process.env.GPUAAS_ADMIN_TOKEN || '';
/** bob's token: a user of `nlp`, the tenant that lends `cv` (alice's) a GPU and reclaims it. */
const OTHER = process.env.GPUAAS_OTHER_TOKEN || '';
const GRACE = Number(process.env.GPUAAS_PREEMPTION_GRACE || 15);
/** A second JupyterLab whose server holds carol's token: a member of vision with view. */
const VIEWER = process.env.GPUAAS_VIEWER_URL || '';

// mockUser off: Galata's mock of `**/api/me` would also answer the gateway's `gpuaas/api/me`.
// sessions/kernels null: Galata would otherwise show the page only the sessions it started
// itself, and these tests start GPU kernels through the REST API as well.
test.use({
  autoGoto: true,
  mockUser: false,
  sessions: null,
  kernels: null,
  mockSettings: { ...galata.DEFAULT_SETTINGS }
});
test.describe.configure({ mode: 'serial' });

async function xsrf(page: IJupyterLabPageFixture): Promise<Record<string, string>> {
  const cookies = await page.context().cookies();
  const token = cookies.find(c => c.name === '_xsrf')?.value;
  return token ? { 'X-XSRFToken': token } : {};
}

/**
 * A notebook session on a GPU kernel that asks for its GPU at once (REST, same origin):
 * the kernel started by `POST api/kernels`, as a program starts one, then the notebook's
 * session on it. A kernel JupyterLab starts for a session would wait for its first cell
 * run (GpuaasExtension.take_gpu_at_first_run; the test after the first one).
 */
async function startSession(page: IJupyterLabPageFixture, name: string, kernel: string): Promise<string> {
  const headers = await xsrf(page);
  const started = await page.request.post('api/kernels', { headers, data: { name: kernel } });
  expect(started.ok()).toBeTruthy();
  const id = (await started.json()).id as string;
  const resp = await page.request.post('api/sessions', {
    headers,
    data: { path: name, name, type: 'notebook', kernel: { id, name: kernel } }
  });
  expect(resp.ok()).toBeTruthy();
  return (await resp.json()).kernel.id as string;
}

async function kernelRecord(request: APIRequestContext, kernelId: string): Promise<any> {
  for (let i = 0; i < 100; i++) {
    const resp = await request.get('gpuaas/kernels');
    const rec = (await resp.json()).find((k: any) => k.kernel_id === kernelId && k.request_id);
    if (rec) {
      return rec;
    }
    await new Promise(r => setTimeout(r, 200));
  }
  throw new Error(`kernel ${kernelId} has no GPU request`);
}

async function gateway(request: APIRequestContext, rid: string): Promise<any> {
  const resp = await request.get(`${GATEWAY}api/requests/${rid}`, {
    headers: { Authorization: `token ${ADMIN}` }
  });
  return resp.json();
}

async function openPanel(page: IJupyterLabPageFixture): Promise<Locator> {
  const panel = page.locator('#jp-gpuaas-panel');
  if (!(await panel.isVisible())) {
    await page.locator('.jp-SideBar [data-id="jp-gpuaas-panel"]').click();
  }
  await expect(panel).toBeVisible();
  return panel;
}

/**
 * An accessibility audit (axe-core) of the open panel: no serious or critical violation.
 * Every finding, of any impact, is printed and saved beside the screenshots.
 */
async function audit(page: IJupyterLabPageFixture, name: string): Promise<void> {
  const results = await new AxeBuilder({ page }).include('#jp-gpuaas-panel').analyze();
  fs.writeFileSync(`${ARTIFACTS}/axe-${name}.json`, JSON.stringify(results.violations, null, 1));
  const found = results.violations.map(
    v => `${v.impact} ${v.id}: ${v.help} (${v.nodes.map(n => n.target.join(' ')).join('; ')})`
  );
  found.forEach(f => console.log(`[axe ${name}] ${f}`));
  // What axe could not decide alone (e.g. contrast over a bar): listed, for a person to judge.
  const unsure = results.incomplete.filter(v => v.impact === 'serious' || v.impact === 'critical');
  unsure.forEach(v => console.log(`[axe ${name}] to review: ${v.id} on ${v.nodes.length} element(s)`));
  expect(results.passes.length).toBeGreaterThan(5); // it did look at the panel
  expect(found.filter(f => /^(serious|critical) /.test(f))).toEqual([]);
}

function row(panel: Locator, rid: string): Locator {
  return panel.locator(`.jp-gpuaas-work li[data-key="${rid}"]`);
}

async function shutdownAll(page: IJupyterLabPageFixture): Promise<void> {
  const sessions = await (await page.request.get('api/sessions')).json();
  for (const s of sessions) {
    await page.request.delete(`api/sessions/${s.id}`, { headers: await xsrf(page) });
  }
}

test.beforeEach(async ({ page }) => {
  // The browser's errors in the test's output: a failing UI test says why.
  page.on('console', msg => {
    if (msg.type() === 'error' || msg.type() === 'warning') {
      console.log(`[browser ${msg.type()}] ${msg.text()}`);
    }
  });
  page.on('pageerror', err => console.log(`[browser exception] ${err.message}`));
});

test.afterEach(async ({ page }) => {
  await shutdownAll(page);
});

test('opens the GPUs panel with its five sections', async ({ page }) => {
  const tab = page.locator('.jp-SideBar [data-id="jp-gpuaas-panel"]');
  await expect(tab).toHaveAttribute('title', /GPUs/);
  const panel = await openPanel(page);
  for (const name of ['My work', 'Team quota', 'Devices', 'Jobs', 'Advice']) {
    await expect(panel.getByRole('region', { name })).toBeVisible();
  }
  // My advice, read through the server's proxy from the gateway's api/advice: a fresh
  // gateway has no history, so none, and the sentence says why.
  await expect(panel.getByRole('region', { name: 'Advice' })).toContainText(
    'No advice about your GPU use in the last 30 days: nothing stands out on at least 10 grants.'
  );
  await expect(panel.locator('.jp-gpuaas-device')).toHaveCount(2);
  await expect(panel.locator('.jp-gpuaas-device').first()).toContainText('free');
  await expect(panel.getByText('Simulated devices')).toBeVisible();
  const quota = panel.locator('.jp-gpuaas-quota-row', { hasText: 'vision · a100' });
  await expect(quota).toContainText('0 / 1');
  await expect(quota.getByRole('meter')).toHaveAttribute('aria-valuemax', '1');
  await expect(panel.locator('.jp-gpuaas-quota-row', { hasText: 'scratch · a100' })).toBeVisible();
  await expect(panel.locator('.jp-gpuaas-banner')).toBeHidden(); // live, no error
  // Nothing in the panel is a raw JSON dump.
  expect(await panel.innerText()).not.toMatch(/[{[]"/);
  await panel.screenshot({ path: `${ARTIFACTS}/panel-empty.png` });
});

/** A notebook saved with a GPU kernel, as a user's is: JupyterLab starts that kernel. */
function gpuNotebook(code: string): string {
  return JSON.stringify({
    cells: [{ cell_type: 'code', source: code, metadata: {}, outputs: [], execution_count: null }],
    metadata: { kernelspec: { name: 'gpu1', display_name: 'GPU 1', language: 'python' } },
    nbformat: 4,
    nbformat_minor: 5
  });
}

/** My live GPU requests at the gateway (queued or admitted). */
async function liveRequests(request: APIRequestContext): Promise<any[]> {
  const out: any[] = [];
  for (const state of ['queued', 'admitted']) {
    const resp = await request.get(`${GATEWAY}api/requests?user=alice&state=${state}`, {
      headers: { Authorization: `token ${ADMIN}` }
    });
    out.push(...(await resp.json()));
  }
  return out;
}

/** The kernel of each open notebook's session, by path. */
async function sessionKernels(page: IJupyterLabPageFixture, paths: string[]): Promise<string[]> {
  const sessions = await (await page.request.get('api/sessions')).json();
  return paths.map(p => sessions.find((s: any) => s.path === p)?.kernel?.id ?? '');
}

async function gpuRecords(page: IJupyterLabPageFixture, ids: string[]): Promise<any[]> {
  const all = await (await page.request.get('gpuaas/kernels')).json();
  return ids.map(id => all.find((k: any) => k.kernel_id === id && k.ended === null));
}

test('reopened GPU notebooks take no GPU until a cell runs; running one takes one', async ({ page, tmpPath }) => {
  const names = ['train.ipynb', 'eval.ipynb', 'plot.ipynb'];
  const paths = names.map(n => `${tmpPath}/${n}`);
  for (const p of paths) {
    await page.contents.uploadContent(gpuNotebook('print(6 * 7)'), 'text', p);
  }
  for (const p of paths) {
    await page.notebook.openByPath(p); // JupyterLab starts each notebook's GPU kernel
  }
  const said = 'GPU kernel: takes a GPU when you run a cell';
  const panel = await openPanel(page);
  const deferredLines = panel.locator('.jp-gpuaas-deferred');

  // Open, then reloaded (JupyterLab restores the three notebooks and reconnects their
  // kernels): each time, three kernels wait with no GPU request, and the sidebar and the
  // notebook say so.
  for (const step of ['opened', 'reloaded']) {
    let kernels: string[] = [];
    await expect
      .poll(async () => {
        kernels = await sessionKernels(page, paths);
        return (await gpuRecords(page, kernels)).map(k => k?.state ?? null);
      }, { message: `the three kernels ${step}` })
      .toEqual(['deferred', 'deferred', 'deferred']);
    for (const k of await gpuRecords(page, kernels)) {
      expect(k.request_id).toBeNull();
      expect(k.message).toBe(said);
    }
    expect(await liveRequests(page.request)).toEqual([]);
    await expect(deferredLines).toHaveCount(3);
    for (const n of names) {
      await expect(deferredLines.filter({ hasText: n })).toHaveText(`${n} · ${said}`);
    }
    if (step === 'opened') {
      await expect(page.locator('.jp-gpuaas-status')).toHaveText(said); // the current notebook's
      await expect(page.locator('#jp-main-statusbar')).toContainText('Idle');
    }
    await panel.screenshot({ path: `${ARTIFACTS}/panel-deferred-${step}.png` });
    if (step === 'opened') {
      // Galata's own readiness check waits for a Launcher, which a restored layout has not.
      // (Galata's reload takes `waitForIsReady`; the fixture's type shows Playwright's.)
      const galataPage = page as unknown as { reload(o: { waitForIsReady: boolean }): Promise<unknown> };
      await galataPage.reload({ waitForIsReady: false });
      await page.waitForSelector('#jupyterlab-splash', { state: 'detached' });
      await page.evaluate(() => (window as any).jupyterapp.restored); // the layout restored
      await openPanel(page);
    }
  }

  // Running a cell of one notebook asks for one GPU, which is granted; its output comes.
  // Which notebook is current after the restore is JupyterLab's choice: that one runs.
  for (const p of paths) {
    await page.evaluate(p => (window as any).jupyterapp.commands.execute('docmanager:open', { path: p }), p);
  }
  const current = (): Promise<string> =>
    page.evaluate(() => (window as any).jupyterapp.shell.currentWidget?.context?.path ?? '');
  const target = await current();
  expect(paths).toContain(target);
  await expect(page.locator('.jp-gpuaas-status')).toHaveText(said);
  await expect(page.locator('#jp-main-statusbar')).toContainText('Idle');
  await page.notebook.runCell(0);
  expect(await current()).toBe(target);
  expect(await page.notebook.getCellTextOutput(0)).toEqual(['42\n']);
  const live = await liveRequests(page.request);
  expect(live.map(r => r.state)).toEqual(['admitted']);
  const [ran] = await gpuRecords(page, await sessionKernels(page, [target]));
  expect(ran.request_id).toBe(live[0].id);
  await expect(row(panel, live[0].id)).toHaveAttribute('data-state', 'admitted');
  await expect(page.locator('.jp-gpuaas-status')).toContainText('a100 ×1');
  // The two others still hold nothing.
  await expect(deferredLines).toHaveCount(2);
  await expect(deferredLines.filter({ hasText: path.basename(target) })).toHaveCount(0);
  await panel.screenshot({ path: `${ARTIFACTS}/panel-deferred-ran.png` });
  for (const n of names) {
    if (await page.notebook.isOpen(n)) {
      await page.notebook.activate(n);
      await page.notebook.close(true);
    }
  }
});

test('a second GPU kernel queues, then is admitted when the first is shut down', async ({ page, tmpPath }) => {
  const panel = await openPanel(page);
  await page.contents.uploadFile(path.resolve(__dirname, 'train.ipynb'), `${tmpPath}/first.ipynb`);
  const first = await startSession(page, `${tmpPath}/first.ipynb`, 'gpu1');
  const r1 = (await kernelRecord(page.request, first)).request_id;
  await expect(row(panel, r1)).toHaveAttribute('data-state', 'admitted');
  await expect(row(panel, r1)).toContainText('On a100-0');
  await expect(row(panel, r1).getByRole('link')).toHaveAttribute('title', `${tmpPath}/first.ipynb`);
  await expect(row(panel, r1).getByRole('link')).toHaveText('first.ipynb');
  // The quota card changes with the row, in the same step (read once, no waiting).
  const visionQuota = panel.locator('.jp-gpuaas-quota-row', { hasText: 'vision · a100' });
  expect(await visionQuota.innerText()).toContain('1 / 1');

  await page.contents.uploadFile(path.resolve(__dirname, 'train.ipynb'), `${tmpPath}/second.ipynb`);
  const second = await startSession(page, `${tmpPath}/second.ipynb`, 'gpu1');
  const r2 = (await kernelRecord(page.request, second)).request_id;
  const queued = row(panel, r2);
  await expect(queued).toHaveAttribute('data-state', 'queued');
  await expect(queued).toContainText('1st of 1 in vision');
  // The reason and the estimate are the gateway's one sentence (`waiting_for.message`),
  // shown as it is: no estimate of the sidebar's own beside it.
  await expect(queued.locator('.jp-gpuaas-wait')).toHaveCount(0);
  const why = (await gateway(page.request, r2)).waiting_for;
  expect(why.message.length).toBeGreaterThan(10);
  await expect(queued.locator('.jp-gpuaas-reason')).toHaveText(why.message);
  await expect(panel.locator('.jp-gpuaas-quota-row', { hasText: 'vision · a100' })).toContainText(
    '1 request waiting'
  );
  await panel.screenshot({ path: `${ARTIFACTS}/panel-queued.png` });
  await audit(page, 'queued');

  // The status bar of the open notebook follows its kernel.
  await row(panel, r1).getByRole('link').click();
  await expect(page.locator('.jp-gpuaas-status')).toHaveText(/GPU: a100 ×1/);
  await page.evaluate(p => (window as any).jupyterapp.commands.execute('docmanager:open', { path: p }), `${tmpPath}/second.ipynb`);
  await expect(page.locator('.jp-gpuaas-status')).toHaveText('GPU: queued 1st (quota)');

  // Release the first: the second's row changes in place, without a reload.
  const handle = await queued.elementHandle();
  await row(panel, r1).getByRole('button', { name: /Release the GPU/ }).click();
  await expect(row(panel, r2)).toHaveAttribute('data-state', 'admitted', { timeout: 30000 });
  // The toast names the notebook whose kernel got the GPU.
  await expect(
    page.locator('.Toastify__toast', { hasText: 'Your GPU kernel second.ipynb got 1 a100 GPU on a100-0.' })
  ).toBeVisible();
  expect(await visionQuota.innerText()).toContain('1 / 1');
  expect(await visionQuota.innerText()).not.toContain('request waiting');
  expect(await handle!.evaluate(el => el.isConnected)).toBe(true); // the same row element
  await expect(row(panel, r1)).toHaveAttribute('data-state', 'finished');
  // Ended: one line of the short history under the cards, titled by its notebook.
  await expect(row(panel, r1)).toHaveClass(/jp-gpuaas-history-row/);
  await expect(row(panel, r1).locator('.jp-gpuaas-title')).toHaveText('first.ipynb · GPU kernel');
  await expect(row(panel, r1).locator('.jp-gpuaas-reason')).toHaveText('Stopped by you.');
  expect((await gateway(page.request, r2)).state).toBe('admitted');
  // The status bar of the (second) notebook follows too.
  await expect(page.locator('.jp-gpuaas-status')).toHaveText(/GPU: a100 ×1/);
});

test('cancel a queued GPU kernel', async ({ page, tmpPath }) => {
  const panel = await openPanel(page);
  const holder = await startSession(page, `${tmpPath}/holder.ipynb`, 'gpu1');
  const rh = (await kernelRecord(page.request, holder)).request_id;
  await expect(row(panel, rh)).toHaveAttribute('data-state', 'admitted');
  const waiting = await startSession(page, `${tmpPath}/waiting.ipynb`, 'gpu1');
  const rw = (await kernelRecord(page.request, waiting)).request_id;
  await expect(row(panel, rw)).toHaveAttribute('data-state', 'queued');
  // By keyboard: from the top of the panel, Tab reaches the row's Cancel (the queued row
  // comes first: its notebook link, then Cancel), and Enter presses it.
  const cancel = row(panel, rw).getByRole('button', { name: /Cancel the queued/ });
  await panel.getByRole('heading', { name: /My work/ }).click(); // Tab starts from here
  let tabs = 0;
  while (!(await cancel.evaluate(el => el === document.activeElement)) && tabs < 8) {
    await page.keyboard.press('Tab');
    tabs++;
  }
  await expect(cancel).toBeFocused();
  console.log(`Cancel reached with ${tabs} Tab presses`);
  await page.keyboard.press('Enter');
  await expect(row(panel, rw)).toHaveAttribute('data-state', 'cancelled');
  expect((await gateway(page.request, rw)).state).toBe('cancelled');
  expect((await gateway(page.request, rh)).state).toBe('admitted'); // the other one stays
});

test('an admin cancels a queued GPU kernel: its row says who, in words', async ({ page, tmpPath }) => {
  await shutdownAll(page); // the GPU the test before kept
  const panel = await openPanel(page);
  const holder = await startSession(page, `${tmpPath}/busy.ipynb`, 'gpu1');
  const rh = (await kernelRecord(page.request, holder)).request_id;
  await expect(row(panel, rh)).toHaveAttribute('data-state', 'admitted');
  const name = 'queued-behind.ipynb';
  const waiting = await startSession(page, `${tmpPath}/${name}`, 'gpu1');
  const rw = (await kernelRecord(page.request, waiting)).request_id;
  await expect(row(panel, rw)).toHaveAttribute('data-state', 'queued');
  // The admin (root) cancels it through the gateway's API, as the admin page does.
  const resp = await page.request.delete(`${GATEWAY}api/requests/${rw}`, {
    headers: { Authorization: `token ${ADMIN}` }
  });
  expect(resp.ok()).toBeTruthy();
  await expect(row(panel, rw)).toHaveClass(/jp-gpuaas-history-row/);
  await expect(row(panel, rw).locator('.jp-gpuaas-title')).toHaveText(`${name} · GPU kernel`);
  await expect(row(panel, rw).locator('.jp-gpuaas-reason')).toHaveText('Cancelled by an admin (root).');
  const text = await row(panel, rw).innerText();
  expect(text).not.toMatch(/HTTP\s*\d{3}|\b[45]\d\d\b/);
  expect(text).not.toContain(rw);
  await panel.screenshot({ path: `${ARTIFACTS}/panel-ending-admin-cancel.png` });
  await shutdownAll(page);
});

test('an idle GPU kernel culled, then its parked GPU expired: each ending in words', async ({ page, tmpPath }) => {
  const panel = await openPanel(page);
  const name = 'left-idle.ipynb';
  const kernel = await startSession(page, `${tmpPath}/${name}`, 'gpu-scratch');
  const rid = (await kernelRecord(page.request, kernel)).request_id;
  await expect(row(panel, rid)).toHaveAttribute('data-state', 'admitted');
  // What no ending may show: an HTTP status, a request id, a clause said twice.
  const clean = async (text: string): Promise<void> => {
    expect(text).not.toMatch(/HTTP\s*\d{3}|\b[45]\d\d\b/);
    expect(text).not.toContain(rid);
    expect(text).not.toMatch(/\br-[0-9a-f]{8,}/);
    const clauses = text.split(/[.;:\n]/).map(c => c.trim()).filter(c => c.length > 8);
    expect(clauses.length).toBe(new Set(clauses).size);
  };

  // Left idle past scratch's idle timeout: culled, said by a notification naming the
  // notebook, and its card says its quota is parked, titled by the notebook.
  const culled = page.locator('.Toastify__toast', { hasText: `Your GPU kernel ${name} was idle and gave back its GPU.` });
  await expect(culled).toBeVisible({ timeout: 60000 });
  await clean(await culled.innerText());
  await expect(row(panel, rid)).toHaveAttribute('data-state', 'parked');
  await expect(row(panel, rid).locator('.jp-gpuaas-title').first()).toContainText(name);
  await expect(row(panel, rid)).toContainText('Its quota is kept for a while');
  await clean(await row(panel, rid).innerText());
  // The team's quota card says the same: parked, kept for the kernel (not a "server").
  const scratchQuota = panel.locator('.jp-gpuaas-quota-row', { hasText: 'scratch · a100' });
  await expect(scratchQuota).toContainText('parked 1');
  await expect(scratchQuota).toContainText('1 of them parked for a culled kernel or server');
  await panel.screenshot({ path: `${ARTIFACTS}/panel-ending-culled.png` });

  // Not taken back within the reservation's time: expired, one line of the history that
  // says so in the gateway's words.
  const parked = (await gateway(page.request, rid)).state;
  await expect
    .poll(async () => (await gateway(page.request, rid)).state, { timeout: 60000 })
    .not.toBe(parked);
  const gone = await gateway(page.request, rid);
  expect(gone.reason).toMatch(/^expired: its parked GPU was not taken back/);
  await expect(row(panel, rid)).toHaveClass(/jp-gpuaas-history-row/);
  await expect(row(panel, rid).locator('.jp-gpuaas-title')).toHaveText(`${name} · GPU kernel`);
  const said = gone.reason.charAt(0).toUpperCase() + gone.reason.slice(1) + '.';
  await expect(row(panel, rid).locator('.jp-gpuaas-reason')).toHaveText(said);
  // Its badge says what happened last, as its sentence does: expired, no longer culled.
  await expect(row(panel, rid).locator('.jp-gpuaas-badge')).toHaveText('expired');
  await clean(await row(panel, rid).innerText());
  await expect(scratchQuota).toContainText('parked 0');
  await panel.screenshot({ path: `${ARTIFACTS}/panel-ending-expired.png` });
  await shutdownAll(page);
});

test('a cull warning offers Keep, and Keep saves the GPU', async ({ page, tmpPath }) => {
  const panel = await openPanel(page);
  const idle = await startSession(page, `${tmpPath}/idle.ipynb`, 'gpu-scratch');
  const rid = (await kernelRecord(page.request, idle)).request_id;
  await expect(row(panel, rid)).toHaveAttribute('data-state', 'admitted');
  await expect(row(panel, rid)).toContainText('Idle for');
  // jupyter_server's own view of the kernel (nothing in this test connects to it).
  const jupyterKernel = async (): Promise<any> => (await page.request.get(`api/kernels/${idle}`)).json();

  // The warning comes a few seconds after the kernel went idle: in the row and as a toast.
  const warning = row(panel, rid).locator('.jp-gpuaas-warning');
  await expect(warning).toContainText('it will be shut down in', { timeout: 30000 });
  const toast = page.locator('.Toastify__toast', { hasText: 'Keep it?' });
  await expect(toast).toHaveCount(1);
  await panel.screenshot({ path: `${ARTIFACTS}/panel-cull-warning.png` });
  // All that time the panel polled and listened, and the gateway's idle clock ran.
  const settled = (await jupyterKernel()).last_activity;
  expect((await gateway(page.request, rid)).state).toBe('admitted');
  const firstCull: number = (await kernelRecord(page.request, idle)).warning.cull_at;
  expect(firstCull).toBeGreaterThan(Date.now() / 1000);

  // Keep, from the notification: the row says kept, its Keep button is gone, the toast
  // closes, and the same warning cannot be answered twice.
  await toast.getByRole('button', { name: 'Keep' }).click();
  await expect(warning).toHaveText('Kept: its idle clock started again.');
  await expect(row(panel, rid).getByRole('button', { name: /Keep the GPU/ })).toHaveCount(0);
  await expect(toast).toHaveCount(0);
  const again = await page.request.post(`gpuaas/sidebar/keep/${rid}`, { headers: await xsrf(page) });
  expect(again.status()).toBe(409);
  console.log(`a second Keep: ${(await again.json()).error}`);

  // Its idle clock started again: a new warning, later than the first, with a new toast.
  await expect(warning).toContainText('it will be shut down in', { timeout: 30000 });
  const secondCull: number = (await kernelRecord(page.request, idle)).warning.cull_at;
  expect(secondCull).toBeGreaterThan(firstCull);
  // The panel's traffic and the Keep reached the gateway, never the kernel: it did not
  // turn busy, and its last activity (what JupyterHub's culler reads) did not move.
  const seen = await jupyterKernel();
  expect(seen.execution_state).not.toBe('busy');
  expect(seen.last_activity).toBe(settled);
  await expect(toast).toHaveCount(1);

  // This one kept from the panel, by keyboard, while the countdown redraws the row: the
  // button keeps the focus. Its notification goes too (no Keep left to press twice).
  const keep = row(panel, rid).getByRole('button', { name: /Keep the GPU/ });
  await keep.focus();
  await page.waitForTimeout(6000);
  await expect(keep).toBeFocused();
  await page.keyboard.press('Enter');
  await expect(warning).toHaveText('Kept: its idle clock started again.');
  await expect(toast).toHaveCount(0);
  // Past the time it would have been culled at, it still holds its GPU.
  await page.waitForTimeout(Math.max(0, secondCull + 2 - Date.now() / 1000) * 1000);
  expect((await gateway(page.request, rid)).state).toBe('admitted');
  await expect(row(panel, rid)).toHaveAttribute('data-state', 'admitted');
});

test('a borrowed GPU reclaimed: warned in the row, a notification, the notebook; withdrawn; then preempted', async ({ page, tmpPath }) => {
  const panel = await openPanel(page);
  const paths = [`${tmpPath}/own.ipynb`, `${tmpPath}/borrowed.ipynb`];
  const kernels: string[] = [];
  const rids: string[] = [];
  for (const p of paths) {
    await page.contents.uploadFile(path.resolve(__dirname, 'train.ipynb'), p);
    kernels.push(await startSession(page, p, 'gpu-cv'));
    rids.push((await kernelRecord(page.request, kernels[kernels.length - 1])).request_id);
    await expect(row(panel, rids[rids.length - 1])).toHaveAttribute('data-state', 'admitted');
  }
  // cv holds both GPUs of the node: one of its own and one lent by nlp, in words.
  const quota = panel.locator('.jp-gpuaas-quota-row', { hasText: 'cv · a100' });
  await expect(quota).toContainText('borrowed from nlp');

  // bob (nlp) asks for its GPU back, through the gateway's REST API: one of cv's kernels
  // is warned (which one is the gateway's choice: read from its objects).
  const bobAuth = { Authorization: `token ${OTHER}` };
  const reclaim = async (): Promise<[string, number]> => {
    const resp = await page.request.post(`${GATEWAY}api/requests`, {
      headers: bobAuth,
      data: { tenant: 'nlp', kind: 'server', gpus: 1, flavor: 'a100', name: 'bob reclaims' }
    });
    expect(resp.status()).toBeLessThan(300);
    const id = (await resp.json()).id as string;
    for (let i = 0; i < 100; i++) {
      for (let j = 0; j < rids.length; j++) {
        if (typeof (await gateway(page.request, rids[j])).preempt_at === 'number') {
          return [id, j];
        }
      }
      await page.waitForTimeout(200);
    }
    throw new Error('no kernel of cv was warned');
  };
  let [bob, victim] = await reclaim();
  let warned = row(panel, rids[victim]);
  await expect(warned.locator('.jp-gpuaas-preempt')).toHaveText(
    /^⚠ It will be stopped in \d+ s: nlp is reclaiming its GPU\.$/
  );
  // A warning notification, once.
  const toast = page.locator('.Toastify__toast', { hasText: 'nlp is reclaiming its GPU' });
  await expect(toast).toHaveCount(1);
  await expect(toast).toHaveClass(/Toastify__toast--warning/);
  // The other kernel is not warned.
  await expect(row(panel, rids[1 - victim]).locator('.jp-gpuaas-preempt')).toHaveCount(0);
  await panel.screenshot({ path: `${ARTIFACTS}/panel-preempt-warning.png` });

  // In the notebook itself: a line above its cells, and the status bar.
  await page.evaluate(p => (window as any).jupyterapp.commands.execute('docmanager:open', { path: p }), paths[victim]);
  const line = page.locator('.jp-NotebookPanel:visible .jp-gpuaas-notebook-line');
  const status = page.locator('.jp-gpuaas-status');
  await expect(line).toBeVisible();
  expect((await line.boundingBox())!.height).toBeGreaterThan(15); // a line, not a sliver
  await expect(line).toContainText('will be stopped in');
  await expect(line).toContainText('nlp is reclaiming its GPU');
  await expect(status).toHaveText(/^GPU: a100 ×1 · reclaimed in \d+ s$/);
  await page.screenshot({ path: `${ARTIFACTS}/notebook-preempt-warning.png` });

  // bob gives up within the grace: withdrawn, an info notification, the warning gone.
  expect((await page.request.delete(`${GATEWAY}api/requests/${bob}`, { headers: bobAuth })).ok()).toBeTruthy();
  const info = page.locator('.Toastify__toast', { hasText: 'keeps its GPU: it is no longer reclaimed' });
  await expect(info).toHaveCount(1);
  await expect(info).toHaveClass(/Toastify__toast--info/);
  await expect(warned.locator('.jp-gpuaas-preempt')).toHaveCount(0);
  await expect(line).toBeHidden();
  await expect(status).not.toContainText('reclaimed');
  expect((await gateway(page.request, rids[victim])).state).toBe('admitted');

  // bob again, and this time he waits the grace out: a new warning (told once more), then
  // preempted, in the row and at the gateway; the other kernel keeps its GPU.
  [bob, victim] = await reclaim();
  warned = row(panel, rids[victim]);
  await expect(warned.locator('.jp-gpuaas-preempt')).toContainText('nlp is reclaiming its GPU');
  await expect(toast).toHaveCount(2);
  await expect(warned).toHaveAttribute('data-state', 'preempted', { timeout: (GRACE + 30) * 1000 });
  await expect(warned.locator('.jp-gpuaas-preempt')).toHaveCount(0);
  await expect(page.locator('.Toastify__toast', { hasText: 'was stopped: nlp is reclaiming its GPU.' })).toBeVisible();
  expect((await gateway(page.request, rids[victim])).state).toBe('preempted');
  expect((await gateway(page.request, rids[1 - victim])).state).toBe('admitted');
  await panel.screenshot({ path: `${ARTIFACTS}/panel-preempted.png` });
  // The row says who preempted it in words, never the gateway's raw request id.
  await expect(warned.locator('.jp-gpuaas-reason')).toHaveText('Stopped: nlp is reclaiming its GPU.');
  expect(await warned.innerText()).not.toMatch(/\br-[0-9a-f]/);
  // ... and keeps its notebook's name, though its kernel and session are gone.
  const victimName = paths[victim].split('/').pop()!;
  await expect(warned.locator('.jp-gpuaas-title')).toHaveText(`${victimName} · GPU kernel`);
  await expect(
    page.locator('.Toastify__toast', { hasText: `Your GPU kernel ${victimName} was stopped` })
  ).toBeVisible();

  // bob's GPU in Devices: another team's, by tenant only (alice has no view scope), and
  // his name is not even in what the browser was sent.
  await expect.poll(async () => (await gateway(page.request, bob)).state).toBe('admitted');
  const bobs = (await gateway(page.request, bob)).grant;
  const device = panel.locator(`.jp-gpuaas-device[data-key="${bobs.node}/${bobs.devices[0]}"]`);
  await expect(device).toHaveAttribute('data-owner', 'other');
  await expect(device.locator('.jp-gpuaas-badge')).toHaveText('another team (nlp)');
  expect(await panel.innerText()).not.toContain('bob');
  const sent = await (await page.request.get('gpuaas/api/devices')).json();
  const held = sent.devices.find((d: any) => d.holder && d.holder.id === bob);
  expect(held.holder).toMatchObject({ tenant: 'nlp', user: null });
  // carol has the view scope: in her JupyterLab the same device names bob.
  const carol = await page.context().newPage();
  await carol.goto(`${VIEWER}lab`);
  await carol.locator('.jp-SideBar [data-id="jp-gpuaas-panel"]').click({ timeout: 60000 });
  const hers = carol.locator(`#jp-gpuaas-panel .jp-gpuaas-device[data-key="${bobs.node}/${bobs.devices[0]}"]`);
  await expect(hers.locator('.jp-gpuaas-badge')).toHaveText('bob (nlp)');
  await carol.locator('#jp-gpuaas-panel').screenshot({ path: `${ARTIFACTS}/panel-viewer.png` });
  await carol.close();
  await page.request.delete(`${GATEWAY}api/requests/${bob}`, { headers: bobAuth });
});

test('Run on GPU as a job from the file browser, through to the executed notebook', async ({ page, tmpPath }) => {
  const panel = await openPanel(page);
  await page.contents.uploadFile(path.resolve(__dirname, 'train.ipynb'), `${tmpPath}/train.ipynb`);
  await page.sidebar.openTab('filebrowser');
  await page.filebrowser.refresh();
  await page.locator('.jp-DirListing-item[data-file-type="notebook"]', { hasText: 'train.ipynb' }).click({ button: 'right' });
  await page.getByRole('menuitem', { name: 'Run on GPU as a job…' }).click();
  const dialog = page.locator('.jp-Dialog');
  await expect(dialog).toContainText('Run on GPU as a job');

  // A request that can never be admitted: the server's reason, inline; the form stays.
  await dialog.getByLabel('GPUs').fill('5');
  await dialog.getByLabel('Parameters (papermill)').fill('lr = 0.5');
  await dialog.getByRole('button', { name: 'Run on GPU' }).click();
  const refusal = page.locator('.jp-Dialog .jp-gpuaas-error:not(:empty)');
  await expect(refusal).toHaveCount(1);
  console.log(`refusal shown: ${await refusal.innerText()}`);
  await expect(refusal).toContainText(/never|cannot|quota|at most|more/i);
  await page.locator('.jp-Dialog').screenshot({ path: `${ARTIFACTS}/run-dialog-refused.png` });
  await expect(page.locator('.jp-Dialog').getByLabel('Parameters (papermill)')).toHaveValue('lr = 0.5');

  await page.locator('.jp-Dialog').getByLabel('GPUs').fill('1');
  await page.locator('.jp-Dialog').getByRole('button', { name: 'Run on GPU' }).click();
  await expect(page.locator('.jp-Dialog')).toHaveCount(0);
  const job = panel.locator('.jp-gpuaas-job', { hasText: 'train.ipynb' }).first();
  await expect(job).toBeVisible();
  await expect(job).toContainText('lr=0.5');
  await expect(job).toHaveAttribute('data-state', 'succeeded', { timeout: 90000 });
  await expect(job.locator('.jp-gpuaas-log')).not.toBeEmpty();
  await panel.screenshot({ path: `${ARTIFACTS}/panel-job.png` });
  await expect(page.locator('.Toastify__toast', { hasText: 'Job train.ipynb finished.' })).toBeVisible();
  // Run again: the same file and parameters in the dialog.
  await job.getByRole('button', { name: /Run job .* again/ }).click();
  await expect(page.locator('.jp-Dialog').getByLabel('Parameters (papermill)')).toHaveValue('lr = 0.5');
  await page.locator('.jp-Dialog').getByRole('button', { name: 'Cancel' }).click();
  await expect(page.locator('.jp-Dialog')).toHaveCount(0);
  await job.getByRole('button', { name: /Open the executed notebook/ }).click();
  const output = page.locator('.jp-NotebookPanel .jp-OutputArea-output', { hasText: 'trained with lr=0.5' });
  await expect(output).toBeVisible({ timeout: 30000 });
  // The notebook toolbar offers the same.
  await expect(page.locator('.jp-NotebookPanel-toolbar').getByText('Run on GPU')).toBeVisible();
});

test('a job that fails: an error notification with links to the executed notebook and the log', async ({ page, tmpPath }) => {
  const panel = await openPanel(page);
  const source = `${tmpPath}/diverge.ipynb`;
  await page.contents.uploadFile(path.resolve(__dirname, 'diverge.ipynb'), source);
  // Not awaited in the page: the command resolves only when its dialog closes.
  await page.evaluate(p => {
    void (window as any).jupyterapp.commands.execute('gpuaas:run-as-job', { path: p });
  }, source);
  await page.locator('.jp-Dialog').getByRole('button', { name: 'Run on GPU' }).click();
  await expect(page.locator('.jp-Dialog')).toHaveCount(0);
  const job = panel.locator('.jp-gpuaas-job', { hasText: 'diverge.ipynb' }).first();
  await expect(job).toHaveAttribute('data-state', 'failed', { timeout: 90000 });
  await expect(job.locator('.jp-gpuaas-badge')).toHaveText('failed'); // in words, not colour alone
  // Its row under My work says so too (the gateway ends the request as "finished").
  const work = panel.locator('.jp-gpuaas-work li', { hasText: 'diverge.ipynb' }).first();
  await expect(work).toHaveAttribute('data-state', 'failed');
  await expect(work.locator('.jp-gpuaas-badge')).toHaveText('failed');
  const toast = page.locator('.Toastify__toast', { hasText: 'Job diverge.ipynb failed' });
  await expect(toast).toHaveCount(1);
  await expect(toast).toHaveClass(/Toastify__toast--error/);
  console.log(`failure told: ${await toast.innerText()}`);
  await panel.screenshot({ path: `${ARTIFACTS}/panel-job-failed.png` });
  await audit(page, 'jobs');

  // The log: it opens in JupyterLab and shows why; the notification stays.
  await toast.getByRole('button', { name: 'Open log' }).click();
  await expect(page.locator('.jp-FileEditor:visible')).toContainText('the loss diverged with lr=10.0', { timeout: 30000 });
  await expect(toast).toHaveCount(1);
  // The executed notebook: the error is in the cell that raised it.
  await toast.getByRole('button', { name: 'Open result' }).click();
  const err = page.locator('.jp-NotebookPanel:visible .jp-OutputArea-output', { hasText: 'the loss diverged with lr=10.0' });
  await expect(err).toBeVisible({ timeout: 30000 });
});

test('the dark theme', async ({ page }) => {
  const panel = await openPanel(page);
  await page.theme.setDarkTheme();
  await expect(page.locator('body')).toHaveAttribute('data-jp-theme-light', 'false');
  const bg = await panel.evaluate(el => getComputedStyle(el).backgroundColor);
  const [r, g, b] = bg.match(/\d+/g)!.map(Number);
  expect(r + g + b).toBeLessThan(3 * 80); // dark, from JupyterLab's own variables
  await panel.screenshot({ path: `${ARTIFACTS}/panel-dark.png` });
  await audit(page, 'dark');
  await page.theme.setLightTheme();
});

test('a gateway that is down: the panel says so, keeps retrying, and recovers when it is back', async ({ page, tmpPath }) => {
  const panel = await openPanel(page);
  await expect(panel.locator('.jp-gpuaas-device')).toHaveCount(2);
  const pid = Number(process.env.GPUAAS_GATEWAY_PID);
  expect(pid).toBeGreaterThan(0);
  process.kill(pid, 'SIGTERM'); // the real gateway process this run started: the last test
  const banner = panel.locator('.jp-gpuaas-banner');
  await expect(banner).toHaveText('GPU service unreachable — retrying.', { timeout: 45000 });
  await expect(panel.getByRole('region', { name: 'Devices' })).toBeVisible(); // not blank
  // (A job's log tail is its own output, a traceback included: not the panel's words.)
  const words = await panel.evaluate(el => {
    const copy = el.cloneNode(true) as HTMLElement;
    copy.querySelectorAll('.jp-gpuaas-log').forEach(n => n.remove());
    return copy.textContent ?? '';
  });
  expect(words).not.toMatch(/[{[]"|Traceback|\bError:/);
  await panel.screenshot({ path: `${ARTIFACTS}/panel-unreachable.png` });

  // The gateway again, on the same port and store (run_galata.py stops it by its PID file).
  const argv: string[] = JSON.parse(process.env.GPUAAS_GATEWAY_ARGV || '[]');
  expect(argv.length).toBeGreaterThan(0);
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !k.startsWith('GPUAAS_') && !k.startsWith('JUPYTERHUB_'))
  );
  const log = fs.openSync(process.env.GPUAAS_GATEWAY_LOG!, 'w');
  const child = spawn(argv[0], argv.slice(1), { cwd: process.env.GPUAAS_GATEWAY_CWD, env, stdio: ['ignore', log, log] });
  fs.writeFileSync(process.env.GPUAAS_GATEWAY_PIDFILE!, String(child.pid));
  // The panel recovers by itself (no reload): live again, the banner gone.
  await expect(banner).toBeHidden({ timeout: 90000 });
  await expect(panel.locator('.jp-gpuaas-device')).toHaveCount(2);
  // Rows are live again: a new GPU kernel shows up and is admitted, from events.
  const kernel = await startSession(page, `${tmpPath}/after.ipynb`, 'gpu1');
  const rid = (await kernelRecord(page.request, kernel)).request_id;
  await expect(row(panel, rid)).toHaveAttribute('data-state', 'admitted');
  await expect(panel.locator('.jp-gpuaas-banner')).toBeHidden();
  await panel.screenshot({ path: `${ARTIFACTS}/panel-reconnected.png` });
});
