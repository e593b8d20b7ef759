"""Whether the process a `running` round recorded still lives: what tells a crashed round from one in progress."""

from __future__ import annotations

import os
from pathlib import Path


def process_is_alive(pid: int | None) -> bool:
    """True when a process with this id runs on this machine (a zombie, dead but not yet reaped, counts as gone)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
