"""systemd notify protocol: READY=1 once the engine passed its self-test, WATCHDOG=1 while healthy."""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send one sd_notify datagram; False when not run by systemd (no NOTIFY_SOCKET)."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):  # abstract namespace
        addr = "\0" + addr[1:]
    # Non-blocking: this runs on the event loop, and a reader that falls behind must not stall it.
    with socket.socket(
        socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
    ) as sock:
        try:
            sock.sendto(state.encode(), addr)
        except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
            return False
    return True


def watchdog_interval_s() -> float | None:
    """Half the watchdog timeout systemd asked for (its own advice), or None when not asked."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2_000_000
