/** What the sections can ask for; the plugin implements it with JupyterLab's services. */

import type { GpuRequest, Job } from '../types';

export interface Actions {
  /** Cancel a queued request (a waiting kernel: shut it down; a job: cancel the job). */
  cancel(req: GpuRequest): Promise<void>;
  /** Release a GPU kernel of this server: shut it down. */
  release(kernelId: string): Promise<void>;
  /** Keep my GPU on a cull warning. */
  keep(requestId: string): Promise<void>;
  openPath(path: string): void;
  cancelJob(job: Job): Promise<void>;
  runAgain(job: Job): Promise<void>;
}

/** Run an action from a button: disabled while it runs, its error shown beside it. */
export async function runAction(
  btn: HTMLButtonElement,
  errorEl: HTMLElement,
  action: () => Promise<void>
): Promise<void> {
  btn.disabled = true;
  errorEl.textContent = '';
  try {
    await action();
  } catch (e) {
    errorEl.textContent = (e as Error).message;
    btn.disabled = false;
  }
}
