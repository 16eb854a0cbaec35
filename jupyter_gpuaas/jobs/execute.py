"""`python -m jupyter_gpuaas.jobs.execute SRC OUT --parameters JSON`: one notebook job.

The process the local runner starts for a notebook: papermill executes SRC into OUT with
the parameters, cell outputs go to stdout (the job's log) as they come, and the exit
status says how it went (0 ran through, 1 a cell raised, 2 bad arguments).

Why not `papermill` itself: a notebook saved with a GPU kernelspec (the `gpuaas`
provisioner) would queue for GPUs a second time from inside a job that already holds
them, so such a notebook runs on `--fallback-kernel` (python3) instead.

The job's kernel talks to papermill over local IPC sockets (in a private temporary
directory), not TCP: nothing else on the machine can reach it, and the kernel has no
reason to print its "Kernel is running over TCP without encryption" warning into the
job's log, where it read as the job's first words. The kernel's own stderr (a crash, a
native library's message) still goes to the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from typing import Any


def choose_kernel(nb_path: str, override: str | None, fallback: str) -> str:
    if override:
        return override
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    nb = nbformat.read(nb_path, as_version=4)  # type: ignore[no-untyped-call]
    name = (nb.metadata.get("kernelspec") or {}).get("name")
    if not name:
        return fallback
    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        return str(name)  # papermill says which kernel is missing
    provisioner = (spec.metadata or {}).get("kernel_provisioner") or {}
    if provisioner.get("provisioner_name") == "gpuaas":
        return fallback
    return str(name)


def kernel_config(socket_dir: str) -> Any:
    """nbclient's configuration for the job's kernel manager: IPC sockets under
    `socket_dir` where the platform has them (a short path: a socket's path is limited to
    about 100 bytes), else jupyter_client's TCP default."""
    from traitlets.config import Config

    if os.name != "posix":
        return Config()
    return Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(socket_dir, "k")}})


def kernel_arguments(name: str) -> list[str]:
    """Extra command-line arguments for the job's kernel. jupyter_client interrupts a kernel
    before every shutdown, and an idle ipykernel then logs "KeyboardInterrupt caught in
    kernel" at ERROR into the job's log after the last cell, where it reads as a failure of
    a job that succeeded: ipykernel's own log is kept to CRITICAL (what the cells print,
    and a crash's traceback, still reach the log). Other kernels get nothing extra."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        argv = KernelSpecManager().get_kernel_spec(name).argv
    except NoSuchKernel:
        return []
    if any("ipykernel" in part for part in argv):
        return ["--IPKernelApp.log_level=CRITICAL"]
    return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jupyter_gpuaas.jobs.execute")
    p.add_argument("source")
    p.add_argument("output")
    p.add_argument("--cwd", default=None)
    p.add_argument("--parameters", default="{}", help="a JSON object")
    p.add_argument("--kernel", default=None)
    p.add_argument("--fallback-kernel", default="python3")
    args = p.parse_args(argv)
    parameters: dict[str, Any] = json.loads(args.parameters)

    import papermill  # type: ignore[import-untyped]
    from papermill.exceptions import PapermillExecutionError  # type: ignore[import-untyped]

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    kernel = choose_kernel(args.source, args.kernel, args.fallback_kernel)
    print(f"[gpuaas] executing {args.source} on kernel {kernel} -> {args.output}", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="gpuaas-kernel-") as sockets:
            papermill.execute_notebook(
                args.source,
                args.output,
                parameters=parameters,
                cwd=args.cwd,
                kernel_name=kernel,
                log_output=True,
                progress_bar=False,
                config=kernel_config(sockets),  # to nbclient, which makes the kernel manager
                extra_arguments=kernel_arguments(kernel),  # to nbclient, onto the kernel's argv
            )
    except PapermillExecutionError as e:
        print(f"[gpuaas] cell {e.exec_count} raised {e.ename}: {e.evalue}", flush=True)
        return 1
    except Exception as e:
        print(f"[gpuaas] the notebook could not run: {type(e).__name__}: {e}", flush=True)
        return 1
    print("[gpuaas] done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
