"""The one way a thread or process of bulk-job work is put behind interactive work on the CPU: nice 19.

Not SCHED_IDLE, which this used before: measured side by side (`make bench` item 8, three pairs of runs),
job pages at nice 19 read 2-10 % more pages/s than at SCHED_IDLE, and `/v1/ocr` latency beside them was the
same. A nice-19 thread weighs 15 against a normal thread's 1024 in the kernel's fair share, so it still gets
next to no CPU while an interactive page wants it."""

from __future__ import annotations

import os

JOB_NICE = 19  # the lowest priority an unprivileged thread can give itself (RLIMIT_NICE 0 allows only lower)
JOB_PRIORITY = f"nice {JOB_NICE}"  # how the app names it where it says what priority job work got


def to_job_priority() -> str | None:
    """Moves the calling thread to nice JOB_NICE. On Linux the nice value is a thread's (PRIO_PROCESS with
    `0` is the calling thread), and threads it starts afterwards inherit it. None when done, else why not:
    an older unit's seccomp filter refusing setpriority, or a platform without it. The caller still works,
    at normal priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, JOB_NICE)
    except (OSError, AttributeError) as err:
        return f"{type(err).__name__}: {err}"
    return None
