"""`check_schema`: a loaded scenario or quota file held to the published JSON Schema
(admission/schema.py), with the refused field named as the parsers name it.

Here, not in admission/: the core imports nothing but itself and the pure standard library
(tests/test_layout.py), and this needs jsonschema. The simulator's loader and the
gateway's quota loader both call it.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpuaas.admission.schema import SCHEMA
from jupyter_gpuaas.admission.values import SpecError


def _where(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def _jsonschema() -> Any:
    """jsonschema, imported without `rfc3987_syntax` where nothing has imported it yet.

    jsonschema's format checkers import that package when it is installed (jupyter-events
    installs it, through `jsonschema[format-nongpl]`), and it builds a grammar at import:
    1.2 s of CPU at every start of a gateway or a `simulate`, for the `iri` formats, which
    our schema does not use. Marked absent for the import only, so that a later import of
    the package itself, by another library of the process, still gets it.
    """
    import sys

    if "jsonschema" in sys.modules or "rfc3987_syntax" in sys.modules:
        import jsonschema  # type: ignore[import-untyped]

        return jsonschema
    sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]  # import: ImportError
    try:
        import jsonschema

        return jsonschema
    finally:
        if sys.modules.get("rfc3987_syntax", "") is None:
            del sys.modules["rfc3987_syntax"]


def check_schema(data: Any, schema: dict[str, Any] = SCHEMA, prefix: str = "") -> None:
    """Raise SpecError naming the field of `data` that the schema refuses (the deepest
    first), if any. Called after the parsers, whose own messages come first."""
    jsonschema = _jsonschema()
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        key = _where(error.absolute_path)
        if prefix:
            key = f"{prefix}.{key}" if key else prefix
        raise SpecError(key, f"{error.message} (scenario.schema.json)")
