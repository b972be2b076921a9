"""What every child process of an engine shares: it exits with its parent, and its death is
told in words (a signal by name)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any


def watch_parent(parent_pid: int) -> None:
    """Exit as soon as the server that started this child is gone (even if killed hard):
    run it on a daemon thread of the child."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)
        time.sleep(0.5)


def exit_text(code: int | None) -> str:
    """A child's exit code as words: `signal SIGILL (illegal instruction)`, `exit code 1`."""
    if code is None:
        return "unknown exit"
    if code < 0:
        try:
            sig = signal.Signals(-code)
        except ValueError:
            return f"signal {-code}"
        text = signal.strsignal(sig)
        return f"signal {sig.name} ({text})" if text else f"signal {sig.name}"
    return f"exit code {code}"


def stop_child(process: Any, conn: Any) -> None:
    """Ask a child to exit over its pipe, wait 10 s, then kill it; close the pipe."""
    with contextlib.suppress(OSError, ValueError):
        conn.send(("exit",))
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join(5)
    conn.close()
