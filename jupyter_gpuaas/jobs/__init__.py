"""Batch jobs through the gateway's queue: a notebook (papermill) or a cell (a Python
script) that runs on admitted GPUs, in the user's Jupyter server, not in the kernel that
submitted it (so a job outlives its notebook's kernel).

- `model`: the job record (persisted as `gpu-jobs/<id>/job.json` beside the source);
- `runner`: how a job runs once admitted (`JobRunner`; `LocalProcessRunner` first);
- `manager`: the server side: submit, wait for admission, start, heartbeat, finish;
- `handlers`: the `/gpuaas/jobs` routes of the server extension;
- `server_client`: the kernel's and the shell's way to those routes (urllib, no tornado);
- `cli`: `jupyter-gpuaas submit NOTEBOOK | jobs | logs`.

Kept import-free: `import jupyter_gpuaas.jobs` must not pull tornado into a kernel.
"""
