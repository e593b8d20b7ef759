"""How many CPU threads decoding uses while other programs share the cores.

A decoding step of a small model is hundreds of short parallel sections, each waiting for its slowest thread. With a
thread on every core, any other busy program (the annotation app's web server answering a vote, a browser, another
job) deschedules one of them and every section waits for it: on this 2-core CPU, the default model in batches of 4
decoded 0.5 steps/s with 2 threads beside one busy process, against 14 with 1 thread; with the cores to itself it
decoded 18-20 steps/s with 2 threads and 14 with 1 (10.7 against 7.2 in batches of 16). So `ThreadGovernor` looks,
about once a second, at how much CPU the other processes used (Linux's /proc/stat less this process's own time):
when they kept about a third of a core or more busy, decoding leaves them a core; when they are quiet, it takes
every core back. Where /proc is missing, it leaves a core to the others all along.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

BUSY_OTHERS = 0.3
"""Cores the other processes must keep busy, on average over the last look, for decoding to leave them one."""


def _busy_and_own_seconds() -> tuple[float, float] | None:
    """(CPU seconds every process spent busy, CPU seconds this process spent) since boot; None without /proc."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    values = [int(value) for value in fields] + [0] * 8
    busy = sum(values[0:3]) + sum(values[5:8])  # user, nice, system, irq, softirq, steal (another VM's turn)
    # fields of /proc/self/stat after the command name: state is 3rd, utime 14th, stime 15th (1-based, overall)
    return busy / ticks, (int(own[11]) + int(own[12])) / ticks


class ThreadGovernor:
    """Call it between decoding steps (cheap; it acts at most once every `every_s`): it sets torch's thread count to
    `most` while other processes are quiet and to `most - 1` while they are busy (see the module's docstring)."""

    def __init__(self, most: int | None = None, every_s: float = 1.0, busy_others: float = BUSY_OTHERS,
                 sample: Callable[[], tuple[float, float] | None] = _busy_and_own_seconds,
                 set_threads: Callable[[int], None] | None = None, clock: Callable[[], float] = time.monotonic):
        import torch

        self.most = most if most is not None else torch.get_num_threads()
        self.fewer = max(1, self.most - 1)
        self.every_s, self.busy_others, self.sample, self.clock = every_s, busy_others, sample, clock
        self.set_threads = set_threads or torch.set_num_threads
        self.last: tuple[float, float, float] | None = None  # clock, busy, own
        self.threads = self.most
        first = sample()
        if first is None:  # no way to see the others: leave them a core all along
            self._use(self.fewer)
        else:
            self.last = (clock(), *first)

    def _use(self, threads: int) -> None:
        if threads != self.threads:
            self.threads = threads
            self.set_threads(threads)

    def __call__(self, *_ignored) -> None:
        if self.last is None or self.most == self.fewer:
            return
        now = self.clock()
        if now - self.last[0] < self.every_s:
            return
        sample = self.sample()
        if sample is None:
            return
        busy, own = sample
        others = max(0.0, (busy - self.last[1]) - (own - self.last[2])) / (now - self.last[0])  # cores in use
        self.last = (now, busy, own)
        self._use(self.fewer if others >= self.busy_others else self.most)
