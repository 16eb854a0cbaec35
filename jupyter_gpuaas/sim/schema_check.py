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


def check_schema(data: Any, schema: dict[str, Any] = SCHEMA, prefix: str = "") -> None:
    """Raise SpecError naming the field of `data` that the schema refuses (the deepest
    first), if any. Called after the parsers, whose own messages come first."""
    import jsonschema  # type: ignore[import-untyped]

    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        key = _where(error.absolute_path)
        if prefix:
            key = f"{prefix}.{key}" if key else prefix
        raise SpecError(key, f"{error.message} (scenario.schema.json)")
