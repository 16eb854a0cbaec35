"""A job refused or failed at the server: what `/gpuaas/jobs` answers (its status, a
sentence, and the field it is about)."""

from __future__ import annotations

from jupyter_gpuaas.words import about_field


class JobError(Exception):
    """A submit or cancel refused: HTTP status, message, and the offending field."""

    def __init__(self, status: int, error: str, field: str | None = None) -> None:
        error = about_field(field, error)  # "gpus must be ...": one sentence with its field
        super().__init__(error)
        self.status = status
        self.error = error
        self.field = field
