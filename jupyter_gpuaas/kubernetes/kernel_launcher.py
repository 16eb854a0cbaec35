"""What a GPU kernel pod runs: gateway_provisioners' own Python kernel launcher.

    python -m jupyter_gpuaas.kubernetes.kernel_launcher --kernel-id ID \\
        --response-address IP:PORT --public-key KEY [--port-range 0..0]

It runs `kernel-launchers/python/scripts/launch_ipykernel.py` from the installed
gateway_provisioners package, unchanged: the launcher starts an IPython kernel, and its
server listener sends the kernel's connection info (encrypted with the public key) to the
server's response address and then takes interrupt and shutdown requests on its
communication port. The image needs only `jupyter-gpuaas[kubernetes]` installed, not
gateway_provisioners' `jupyter-image-bootstrap` copies; this module plays the part of that
bootstrap (its shared `server_listener.py` goes first on the path, as the bootstrap
installs it beside the launcher).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def launcher_dir() -> Path:
    import gateway_provisioners

    return Path(gateway_provisioners.__file__).parent / "kernel-launchers"


def main(argv: list[str] | None = None) -> None:
    root = launcher_dir()
    script = root / "python" / "scripts" / "launch_ipykernel.py"
    sys.path.insert(0, str(root / "shared" / "scripts"))
    sys.argv = [str(script), *(sys.argv[1:] if argv is None else argv)]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
