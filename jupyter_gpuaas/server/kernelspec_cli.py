"""`jupyter-gpuaas kernelspec install`: a GPU kernelspec for this Python.

    jupyter-gpuaas kernelspec install --gpus 1 [--flavor a100] [--tenant vision]
        [--name NAME] [--display-name "Python 3 (1 GPU)"] [--user | --sys-prefix | --prefix P]
        [--kubernetes [--image IMAGE]]

It writes ipykernel's spec for the running interpreter (argv, logos, metadata) with
`metadata.kernel_provisioner = {"provisioner_name": "gpuaas", "config": {...}}`, so the
kernel starts through the gpuaas provisioner: queued, then launched on granted devices.
With `--kubernetes` the spec names `gpuaas-kubernetes` instead (kubernetes/kernels.py): the
kernel runs in a pod of its own on the granted node, and its argv is what that pod runs,
gateway_provisioners' kernel launcher.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

NAME_RE = re.compile(r"^[a-zA-Z0-9._-]+$")


#: The argv of a `--kubernetes` spec: the command of the kernel's pod. The provisioner fills
#: in gateway_provisioners' launch parameters.
POD_ARGV = [
    "python",
    "-m",
    "jupyter_gpuaas.kubernetes.kernel_launcher",
    "--kernel-id",
    "{kernel_id}",
    "--port-range",
    "{port_range}",
    "--response-address",
    "{response_address}",
    "--public-key",
    "{public_key}",
]


def default_name(gpus: int, flavor: str | None, kubernetes: bool = False) -> str:
    return f"python3-{gpus}gpu" + (f"-{flavor}" if flavor else "") + ("-pod" if kubernetes else "")


def default_display_name(gpus: int, flavor: str | None, kubernetes: bool = False) -> str:
    what = f"{gpus} {flavor.upper() if flavor else 'GPU'}"
    plural = "s" if gpus != 1 and not flavor else ""
    return f"Python 3 ({what}{plural}{', own pod' if kubernetes else ''})"


def provisioner_metadata(
    gpus: int,
    flavor: str | None,
    tenant: str | None,
    kubernetes: bool = False,
    image: str | None = None,
) -> dict[str, Any]:
    config: dict[str, Any] = {"gpus": gpus}
    if flavor:
        config["flavor"] = flavor
    if tenant:
        config["tenant"] = tenant
    if kubernetes and image:
        config["image_name"] = image
    name = "gpuaas-kubernetes" if kubernetes else "gpuaas"
    return {"provisioner_name": name, "config": config}


def write_spec(
    path: Path | str,
    gpus: int,
    flavor: str | None = None,
    tenant: str | None = None,
    display_name: str | None = None,
    kubernetes: bool = False,
    image: str | None = None,
) -> Path:
    """Write kernel.json (and ipykernel's logos) for this Python into `path`."""
    from ipykernel.kernelspec import get_kernel_dict, write_kernel_spec

    metadata = dict(get_kernel_dict().get("metadata") or {})
    metadata["kernel_provisioner"] = provisioner_metadata(gpus, flavor, tenant, kubernetes, image)
    overrides: dict[str, Any] = {
        "display_name": display_name or default_display_name(gpus, flavor, kubernetes),
        "metadata": metadata,
    }
    if kubernetes:
        overrides["argv"] = list(POD_ARGV)
    return Path(write_kernel_spec(path, overrides=overrides))


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("kernelspec", help="install a GPU kernelspec (queued GPU kernels)")
    sub = p.add_subparsers(dest="kernelspec_command", metavar="ACTION")
    inst = sub.add_parser("install", help="install a GPU kernelspec for this Python")
    inst.add_argument("--gpus", type=int, required=True, help="GPUs the kernel needs (>= 1)")
    inst.add_argument("--flavor", help="GPU flavor (a100, t4, ...); default: any of the tenant's")
    inst.add_argument("--tenant", help="tenant (team) charged; default: the user's first")
    inst.add_argument("--name", help="kernelspec name (default: python3-<N>gpu[-<flavor>])")
    inst.add_argument("--display-name", help='shown in the launcher, e.g. "Python 3 (1 GPU)"')
    inst.add_argument(
        "--kubernetes",
        action="store_true",
        help="run the kernel in a pod of its own on the granted node (provisioner "
        "gpuaas-kubernetes); the server's pod stays CPU-only",
    )
    inst.add_argument(
        "--image", help="the kernel pod's image (--kubernetes; default: the server's own)"
    )
    where = inst.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for this user only")
    where.add_argument(
        "--sys-prefix", action="store_true", help="install into sys.prefix (this environment)"
    )
    where.add_argument("--prefix", help="install into PREFIX/share/jupyter/kernels")
    inst.set_defaults(run=run)
    p.set_defaults(run=lambda args: (p.print_help(), 2)[1])


def run(args: argparse.Namespace) -> int:
    if args.gpus < 1:
        print("jupyter-gpuaas kernelspec: --gpus must be at least 1", file=sys.stderr)
        return 2
    if args.image and not args.kubernetes:
        print("jupyter-gpuaas kernelspec: --image needs --kubernetes", file=sys.stderr)
        return 2
    name = args.name or default_name(args.gpus, args.flavor, args.kubernetes)
    if not NAME_RE.match(name):
        print(
            f"jupyter-gpuaas kernelspec: bad --name {name!r}: use letters, digits, . _ -",
            file=sys.stderr,
        )
        return 2
    import tempfile

    from jupyter_client.kernelspec import KernelSpecManager

    prefix = sys.prefix if args.sys_prefix else args.prefix
    with tempfile.TemporaryDirectory() as tmp:
        src = write_spec(
            Path(tmp) / name,
            args.gpus,
            args.flavor,
            args.tenant,
            args.display_name,
            kubernetes=args.kubernetes,
            image=args.image,
        )
        try:
            dest = KernelSpecManager().install_kernel_spec(
                str(src), name, user=bool(args.user), prefix=prefix
            )
        except OSError as e:
            print(f"jupyter-gpuaas kernelspec: cannot install: {e}", file=sys.stderr)
            return 1
    print(f"Installed GPU kernelspec {name} in {dest}")
    return 0
