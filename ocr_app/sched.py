"""The one way a thread or process of bulk-job work is put behind interactive work on the CPU."""

from __future__ import annotations

import os


def to_idle_priority() -> str | None:
    """Moves the calling thread to SCHED_IDLE (on Linux `0` is the thread, not the process; threads it
    starts afterwards inherit the policy). None when done, else why not: an older unit's seccomp filter
    refusing sched_setscheduler, or a platform without it. The caller still works, at normal priority."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError) as err:
        return f"{type(err).__name__}: {err}"
    return None
