"""The wheel's build hook (hatchling's `custom` hook, [tool.hatch.build.hooks.custom] in
pyproject.toml): what a wheel holds beyond the package's own files.

- `hub_config/` (the demo's JupyterHub config, the quota file, the production snippets and
  the example scenarios) lives at the repository's root, where the README and the docs
  point, and ships inside the package as `jupyter_gpuaas/hub_config/`, where
  `jupyter-gpuaas demo` finds it (jupyter_gpuaas/hub/demo.py). Copied here, not linked:
  an sdist drops symbolic links, and a wheel built from it had no config at all.
- The admission core and the simulator's hot modules compiled with mypyc, by the same
  `ensure()` as `make core` (scripts/build_core.py: one mechanism, one place). With a C
  compiler the wheel is a platform wheel holding the compiled modules beside their .py
  sources; without one (or with GPUAAS_PURE=1, or when mypyc fails) it is a pure-Python
  wheel and the build says so in a warning: the same decisions, several times slower.

Only the standard wheel: an editable install imports the checkout, where `make core`
compiles in place and the demo reads the checkout's hub_config/.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version != "standard":
            return
        root = Path(self.root)
        build_data["force_include"][str(root / "hub_config")] = "jupyter_gpuaas/hub_config"

        build_core = _load(root / "scripts" / "build_core.py")
        why_pure = build_core.ensure()
        if why_pure is not None:
            self.app.display_warning(
                f"jupyter-gpuaas: {why_pure}: this wheel's admission core is pure Python "
                "(the same decisions, several times slower; install a C compiler and the "
                "Python headers and build again for the compiled core)"
            )
            return
        for path in build_core.compiled_files():
            build_data["force_include"][str(path)] = path.relative_to(root).as_posix()
        # Compiled modules are for this Python and platform: cp311-cp311-linux_x86_64, say.
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        self.app.display_info(
            f"jupyter-gpuaas: the wheel holds the compiled core "
            f"({len(build_core.compiled_files())} modules)"
        )


def _load(script: Path) -> Any:
    """scripts/build_core.py as a module (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("_gpuaas_build_core", script)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {script}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
