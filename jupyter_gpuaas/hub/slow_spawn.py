"""A spawn waiting in the GPU queue is queued, not "slow to start".

JupyterHub warns "User bob is slow to start (timeout=10)" for every spawn that takes longer
than its `slow_spawn_timeout`. A spawn of a queued spawner (spawner.py) that is waiting for
GPUs in the gateway's queue is not slow: its place and reason are logged when it queues
("gpuaas request … for bob: queued") and shown on its page, and a demo's log filled with
the warning for every queued spawn read as a fault. So the warning is dropped while that
spawner's status board says "queued", and kept for any other spawn (one that is slow
after its GPUs were granted, or one of another spawner).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

_SLOW_TO_START = "User %s is slow to start (timeout=%s)"  # JupyterHub's BaseHandler

#: The queued spawners that have waited in the gateway's queue (weakly: a deleted
#: spawner leaves by itself).
_WATCHED: weakref.WeakSet[Any] = weakref.WeakSet()


def hub_name(spawner: Any) -> str:
    """The name JupyterHub's handlers log a server by: "bob", or "bob:lab"."""
    name = str(spawner.user.name)
    return f"{name}:{spawner.name}" if spawner.name else name


def waiting_in_queue(name: str) -> bool:
    for spawner in list(_WATCHED):
        if hub_name(spawner) == name and spawner._board.phase == "queued":
            return True
    return False


class QueuedIsNotSlow(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.msg == _SLOW_TO_START and isinstance(args, tuple) and args:
            return not waiting_in_queue(str(args[0]))
        return True


def hear_as_queued(spawner: Any) -> None:
    """Watch `spawner`, and put the filter on the Hub's logger (which spawners log
    through too) once."""
    _WATCHED.add(spawner)
    logger = getattr(spawner.log, "logger", spawner.log)  # a LoggerAdapter's logger
    if isinstance(logger, logging.Logger) and not any(
        isinstance(f, QueuedIsNotSlow) for f in logger.filters
    ):
        logger.addFilter(QueuedIsNotSlow())
