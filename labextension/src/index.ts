/**
 * jupyter-gpuaas: the JupyterLab sidebar "GPUs" (my work, my team's quota, the devices and
 * my jobs, live), a status-bar item for the current notebook's GPU kernel, notifications,
 * and "Run on GPU as a job…" from the file browser and the notebook toolbar.
 */

import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Notification, ToolbarButton } from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { GpuApi } from './api';
import { Actions } from './components/actions';
import { GpuPanel } from './components/panel';
import { runOnGpuDialog } from './components/rundialog';
import { NotebookPreemptLine } from './components/notebookline';
import { GpuStatus } from './components/statusbar';
import { GpuController } from './controller';
import { GpuModel, Notice } from './model';
import { formatParameters, RunSpec } from './params';
import { saveUnsaved } from './save';
import type { Job } from './types';
import gpuSvg from '../style/gpu.svg';

export const gpuIcon = new LabIcon({ name: 'jupyter-gpuaas:gpu', svgstr: gpuSvg });

const CMD_RUN = 'gpuaas:run-as-job';
const CMD_OPEN = 'gpuaas:open-panel';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpuaas:plugin',
  description: 'The GPUs sidebar: my GPU work, team quota, devices and jobs, live.',
  autoStart: true,
  optional: [
    ILayoutRestorer,
    IStatusBar,
    INotebookTracker,
    IDefaultFileBrowser,
    ILabShell,
    IDocumentManager
  ],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null,
    notebooks: INotebookTracker | null,
    fileBrowser: IDefaultFileBrowser | null,
    _labShell: ILabShell | null,
    docManager: IDocumentManager | null
  ) => {
    const api = new GpuApi(app.serviceManager.serverSettings);
    const model = new GpuModel();
    const sessions = app.serviceManager.sessions;
    const notebookPaths = (): Map<string, string> => {
      const out = new Map<string, string>();
      for (const s of sessions.running()) {
        if (s.kernel) {
          out.set(s.kernel.id, s.path);
        }
      }
      return out;
    };

    /** The cull-warning notification of each request: gone once kept, from either place. */
    const cullToasts = new Map<string, string>();
    /** The preemption-warning notification of each request: gone once it was stopped. */
    const preemptToasts = new Map<string, string>();
    const notify = (n: Notice): void => {
      switch (n.kind) {
        case 'admitted':
          Notification.success(n.message, { autoClose: 8000 });
          break;
        case 'cull_warning':
          cullToasts.set(
            n.requestId,
            Notification.warning(n.message, {
            autoClose: false,
            actions: [
              {
                label: 'Keep',
                caption: 'Report it busy once: its idle clock starts again',
                callback: () => void actions.keep(n.requestId).catch(e => Notification.error((e as Error).message))
              }
            ]
            })
          );
          break;
        case 'preempt_warning':
          // Once per warning (the model tells it once), and until dismissed: the work
          // in the notebook is lost at that time.
          preemptToasts.set(n.requestId, Notification.warning(n.message, { autoClose: false }));
          // Save the open notebooks and files with unsaved changes now (issue 42 item 4):
          // a preempted server takes them with it, and a data scientist expects all of
          // their work kept, not only the stopped kernel's notebook. Only dirty ones: a
          // clean file is not rewritten, so a repeated warning writes nothing.
          if (docManager) {
            const open = Array.from(app.shell.widgets('main'), w => docManager.contextForWidget(w));
            void saveUnsaved(open).then(({ failed }) => {
              for (const f of failed) {
                Notification.error(`Could not save ${f.path} before the GPU is reclaimed: ${f.error}`, {
                  autoClose: false
                });
              }
            });
          }
          break;
        case 'preempt_withdrawn':
          Notification.info(n.message, { autoClose: 8000 });
          break;
        case 'preempted': {
          // "will be stopped in 29 s" is past now: "was stopped: …" takes its place.
          const warned = preemptToasts.get(n.requestId);
          if (warned) {
            preemptToasts.delete(n.requestId);
            Notification.dismiss(warned);
          }
          Notification.info(n.message, { autoClose: 8000 });
          break;
        }
        case 'job_done':
        case 'job_failed': {
          // Links: the executed notebook, and the log (a failure's traceback is there).
          // Opening the log keeps the notification, so the result is still one click away.
          const job = model.jobs.get(n.requestId);
          const links: Notification.IAction[] = [];
          if (job?.output_path) {
            const result = job.output_path;
            links.push({
              label: 'Open result',
              caption: `Open the executed notebook ${result}`,
              callback: () => actions.openPath(result)
            });
          }
          if (job?.log_path && n.kind === 'job_failed') {
            const log = job.log_path;
            links.push({
              label: 'Open log',
              caption: `Open the job's log ${log}`,
              callback: (event: MouseEvent) => {
                event.preventDefault();
                actions.openPath(log);
              }
            });
          }
          const options = {
            autoClose: (n.kind === 'job_failed' ? false : 10000) as number | false,
            actions: links
          };
          if (n.kind === 'job_done') {
            Notification.success(n.message, options);
          } else {
            Notification.error(n.message, options);
          }
          break;
        }
        default:
          Notification.info(n.message, { autoClose: 8000 });
      }
    };

    const controller = new GpuController({ api, model, notebooks: notebookPaths, notify });

    const refreshJob = async (id: string): Promise<void> => {
      const result = model.setJob(await api.job(id));
      controller.emit(result.changes);
    };

    const submit = async (spec: RunSpec): Promise<Job> => {
      const job = await api.submitJob(spec as unknown as Record<string, unknown>);
      controller.emit(model.setJob(job).changes); // in the Jobs section at once
      return job;
    };

    const runDialog = async (path: string, job?: Job): Promise<void> => {
      if (!model.me) {
        await controller.reload().catch(() => undefined);
      }
      const initial = job
        ? {
            tenant: job.tenant,
            flavor: job.flavor ?? '',
            gpus: String(job.gpus),
            priority: String(job.priority),
            parameters: formatParameters(job.parameters || {})
          }
        : undefined;
      const created = await runOnGpuDialog(path, model.me, model.tenants, submit, initial);
      if (created) {
        app.shell.activateById(panel.id);
      }
    };

    const actions: Actions = {
      cancel: async req => {
        const kernel = model.kernelOf(req.id);
        if (kernel && kernel.ended === null) {
          await app.serviceManager.kernels.shutdown(kernel.kernel_id); // cancels its request
        } else if (model.jobs.has(req.id)) {
          await api.cancelJob(req.id);
          await refreshJob(req.id);
        } else {
          await api.cancelRequest(req.id);
        }
      },
      release: async kernelId => {
        await app.serviceManager.kernels.shutdown(kernelId);
        await controller.refreshLocal();
      },
      keep: async requestId => {
        await api.keep(requestId);
        controller.emit(model.markKept(requestId));
        const toast = cullToasts.get(requestId);
        if (toast) {
          cullToasts.delete(requestId);
          Notification.dismiss(toast);
        }
      },
      openPath: path => {
        void app.commands.execute('docmanager:open', { path });
      },
      cancelJob: async job => {
        await api.cancelJob(job.id);
        await refreshJob(job.id);
      },
      runAgain: async job => {
        if (job.source_path) {
          await runDialog(job.source_path, job);
        }
      }
    };

    const panel = new GpuPanel(model, actions, visible => controller.setPanelVisible(visible));
    panel.title.icon = gpuIcon;
    panel.title.caption = 'GPUs: my work, team quota, devices and jobs';
    panel.title.label = '';
    app.shell.add(panel, 'left', { rank: 150 });
    if (restorer) {
      restorer.add(panel, 'jupyter-gpuaas');
    }
    sessions.runningChanged.connect(() => controller.emit(model.setNotebooks(notebookPaths())));

    // Run on GPU as a job…: from the file browser (a .ipynb or .py) or a notebook.
    app.commands.addCommand(CMD_RUN, {
      label: 'Run on GPU as a job…',
      caption: 'Run this notebook or script as a batch job on its own GPUs',
      icon: gpuIcon,
      execute: async args => {
        let path = typeof args.path === 'string' ? args.path : '';
        if (!path && fileBrowser) {
          const item = fileBrowser.selectedItems().next();
          path = item && !item.done ? item.value.path : '';
        }
        if (!path && notebooks?.currentWidget) {
          path = notebooks.currentWidget.context.path;
        }
        if (!path.endsWith('.ipynb') && !path.endsWith('.py')) {
          Notification.error('Run on GPU takes a notebook (.ipynb) or a Python script (.py).');
          return;
        }
        await runDialog(path);
      }
    });
    app.commands.addCommand(CMD_OPEN, {
      label: 'Show the GPUs panel',
      execute: () => app.shell.activateById(panel.id)
    });
    for (const type of ['notebook', 'python']) {
      app.contextMenu.addItem({
        command: CMD_RUN,
        selector: `.jp-DirListing-item[data-file-type="${type}"]`,
        rank: 3
      });
    }
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (nb: NotebookPanel) => {
        const btn = new ToolbarButton({
          icon: gpuIcon,
          label: 'Run on GPU',
          tooltip: 'Run this notebook on GPU as a job…',
          onClick: () => void app.commands.execute(CMD_RUN, { path: nb.context.path })
        });
        nb.toolbar.insertAfter('cellType', 'gpuaas-run', btn);
        // A warned preemption victim's notebook says so above its cells.
        const line = new NotebookPreemptLine(model, () => nb.sessionContext.session?.kernel?.id ?? null);
        nb.contentHeader.addWidget(line);
        nb.sessionContext.kernelChanged.connect(() => line.refresh());
        btn.disposed.connect(() => line.dispose());
        return btn;
      }
    });

    // The status-bar item follows the current notebook's kernel.
    if (statusBar) {
      const status = new GpuStatus(model);
      status.node.addEventListener('click', () => app.shell.activateById(panel.id));
      const asked = new Set<string>();
      const follow = (): void => {
        const ctx = notebooks?.currentWidget?.sessionContext;
        const id = ctx?.session?.kernel?.id ?? null;
        status.setKernel(id);
        // A kernel this page has not read yet: a notebook's GPU kernel waiting for its
        // first run makes no gateway event, so ask the server once (then the poll
        // follows it; a CPU kernel is asked about once, not at each of its runs).
        if (id && !model.kernelById(id) && !asked.has(id)) {
          asked.add(id);
          void controller.refreshLocal().catch(() => undefined);
        }
      };
      if (notebooks) {
        const followed = new WeakSet<NotebookPanel>();
        notebooks.currentChanged.connect((_, nb) => {
          follow();
          if (nb && !followed.has(nb)) {
            followed.add(nb);
            nb.sessionContext.kernelChanged.connect(follow);
            nb.sessionContext.statusChanged.connect(follow);
          }
        });
        void app.restored.then(follow);
      }
      statusBar.registerStatusItem('jupyter-gpuaas:status', {
        item: status,
        align: 'left',
        rank: 5,
        isActive: () => true
      });
    }

    void app.restored.then(() => controller.start());
  }
};

export default plugin;
