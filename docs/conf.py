"""Sphinx configuration of the documentation site (`make docs`).

MyST Markdown with the pydata theme, as JupyterHub's site. The reference pages are written
from the code at each build by _ext/gpuaas_reference.py into reference/generated/
(git-ignored). ARCHITECTURE.md, SCENARIO.md, KUEUE.md and INTERFACES.md stay at the top of
docs/ (other tools read them by path); explanation/index.md takes them into the site.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))  # this checkout's package, not an installed one

from jupyter_gpuaas._version import __version__  # noqa: E402

project = "jupyter-gpuaas"
author = "The jupyter-gpuaas developers"
copyright = "The jupyter-gpuaas developers"
version = release = __version__

extensions = ["myst_parser", "gpuaas_reference"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "**/node_modules"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
# The explanation pages link to one another by file name (KUEUE.md, SCENARIO.md).
myst_ref_domains = ["std", "doc"]

html_theme = "pydata_sphinx_theme"
html_title = "jupyter-gpuaas"
html_static_path: list[str] = []
html_theme_options = {
    "github_url": "https://github.com/jupyter-gpuaas/jupyter-gpuaas",
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "use_edit_page_button": False,
}
html_context = {"default_mode": "light"}

# A page another change adds under docs/ joins its section's table of contents without an
# edit here: a new file in tutorials/, how-to/ or reference/ goes to the end of that
# section, any other (a new design note at the top of docs/, say) to the explanation.
# (A toctree glob would do the same, but warns, and -W fails, while it matches nothing.)
SECTIONS = ("tutorials", "how-to", "reference")


def _section(docname: str) -> str:
    top = docname.split("/", 1)[0] if "/" in docname else ""
    return top if top in SECTIONS else "explanation"


def _add_new_pages(app, docname: str, source: list[str]) -> None:  # type: ignore[no-untyped-def]
    if docname not in {f"{s}/index" for s in (*SECTIONS, "explanation")}:
        return
    section = docname.split("/")[0]
    text = source[0]
    start = text.index("```{toctree}")
    end = text.index("\n```", start)
    listed = {
        line.strip().lstrip("/") if line.strip().startswith("/") else f"{section}/{line.strip()}"
        for line in text[start:end].splitlines()[1:]
        if line.strip() and not line.strip().startswith(":")
    }
    new = sorted(
        d
        for d in app.env.found_docs
        if _section(d) == section and d not in listed and d != "index" and not d.endswith("/index")
    )
    extra = "".join(f"\n/{d}" for d in new)
    source[0] = text[:end] + extra + text[end:]


def _reread_indexes(app, env, added, changed, removed):  # type: ignore[no-untyped-def]
    # An incremental build reads only changed files: read the section indexes again too,
    # so that a page added or removed since the last build is listed or unlisted.
    return [f"{s}/index" for s in (*SECTIONS, "explanation")]


def setup(app):  # type: ignore[no-untyped-def]
    app.connect("source-read", _add_new_pages)
    app.connect("env-get-outdated", _reread_indexes)
