"""The checkpoints a database's rounds left on disk, as the store names them, and how much disk the loop uses: the
Dashboard's Disk line and `--prune`'s listing (loop.retention decides what is kept).

Pure standard library: annotate does not know where rounds save, so the caller names the database's checkpoint folder
(`<round.checkpoints_dir>/<db name>`, loop.round_plan.database_checkpoint_dir).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from annotate.metrics import ROUND_CEILING_POLICY_PATH, ROUND_POLICY_ID, ROUND_REWARD_MODEL_PATH
from annotate.records import Policy, Round

POLICY, REWARD_MODEL, CEILING_POLICY = "policy", "reward model", "ceiling policy"
"""The kinds of checkpoint: a policy of the loop (a row of `policies`), a round's reward model, the demo's oracle
ceiling (a folder beside a round's policy, never a row)."""


@dataclass(frozen=True)
class Checkpoint:
    """A folder under the database's checkpoint folder that the store names: a policy's, or a round's reward model or
    ceiling policy."""

    path: str
    """The folder, absolute and normalised (folder_key)."""
    kind: str
    """POLICY, REWARD_MODEL or CEILING_POLICY."""
    rounds: tuple[int, ...]
    """The rounds whose metrics name it, oldest first (a round resumed from a crashed one names the crashed one's)."""
    policies: frozenset[int]
    """For a policy, its own id; else the policies saved by the rounds that name it (what it was made with)."""

    @property
    def label(self) -> str:
        """"policy 4 (round-3/policy)", "reward model of round 3 (round-3/reward)"."""
        where = "/".join(Path(self.path).parts[-2:])
        if self.kind == POLICY:
            return f"policy {min(self.policies)} ({where})"
        rounds = ", ".join(map(str, self.rounds))
        return f"{self.kind} of round{'s' if len(self.rounds) > 1 else ''} {rounds} ({where})"


def folder_key(path: str | Path) -> str:
    """`path` absolute and normalised, so that two spellings of one folder compare equal (no link is followed)."""
    return os.path.normpath(os.path.abspath(str(path)))


def is_inside(path: str | Path, root: str | Path) -> bool:
    """Whether `path` lies strictly inside the folder `root` (by their names: nothing on disk is read)."""
    path, root = folder_key(path), folder_key(root)
    return path != root and os.path.commonpath([path, root]) == root


def named_checkpoints(policies: list[Policy], rounds: list[Round], root: str | Path) -> list[Checkpoint]:
    """Every folder inside `root` that the store names, each once: the policies past round 0 (whether pruned or not),
    then each round's reward model and ceiling policy. Nothing outside `root` (the base model, an SFT folder, a
    model named by its hub id) is ever a checkpoint here."""
    saved_by: dict[int, list[int]] = {}
    others: dict[str, tuple[str, list[int], set[int]]] = {}
    for round_ in rounds:
        policy_id = round_.metrics.get(ROUND_POLICY_ID.name)
        if policy_id is not None:
            saved_by.setdefault(int(policy_id), []).append(round_.id)
        for key, kind in ((ROUND_REWARD_MODEL_PATH, REWARD_MODEL), (ROUND_CEILING_POLICY_PATH, CEILING_POLICY)):
            path = round_.metrics.get(key)
            if path and is_inside(path, root):
                _kind, named_in, made_with = others.setdefault(folder_key(path), (kind, [], set()))
                named_in.append(round_.id)
                made_with.update({int(policy_id)} if policy_id is not None else set())
    checkpoints = [Checkpoint(folder_key(p.path), POLICY, tuple(saved_by.get(p.id, ())), frozenset({p.id}))
                   for p in policies if p.round > 0 and is_inside(p.path, root)]
    policy_paths = {c.path for c in checkpoints}
    checkpoints += [Checkpoint(path, kind, tuple(named_in), frozenset(made_with))
                    for path, (kind, named_in, made_with) in others.items() if path not in policy_paths]
    return checkpoints


def folder_bytes(path: str | Path) -> int:
    """Bytes of the files under `path` (0 when it is absent); links are counted as themselves, never followed."""
    total = 0
    for folder, _folders, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:  # deleted while counted
                pass
    return total


def database_bytes(db_path: str | Path) -> int:
    """Bytes of the SQLite database with its write-ahead log and shared-memory files (0 for ":memory:")."""
    if str(db_path) == ":memory:":
        return 0
    files = [Path(f"{db_path}{suffix}") for suffix in ("", "-wal", "-shm")]
    return sum(file.stat().st_size for file in files if file.is_file())


def size_text(n_bytes: int) -> str:
    """A size in decimal units, as disks are sold: 512 B, 12 MB, 1.3 GB."""
    value, unit = float(n_bytes), "B"
    for bigger in ("kB", "MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.0f} {unit}" if unit == "B" or value >= 10 else f"{value:.1f} {unit}"


def disk_line(root: str | Path | None, db_path: str | Path, checkpoints: list[Checkpoint]) -> str:
    """"Disk: checkpoints 1.3 GB (4 policies, 3 reward models) in data/checkpoints/loop, database 12 MB": the whole
    checkpoint folder (caches and leftovers included), the named checkpoints still on disk by kind, the database;
    the database alone when `root` is None."""
    if root is None:
        return f"Disk: database {size_text(database_bytes(db_path))}"
    present = [c for c in checkpoints if Path(c.path).is_dir()]
    policies = sum(c.kind == POLICY for c in present)
    rewards = sum(c.kind == REWARD_MODEL for c in present)
    counts = f"{policies} polic{'y' if policies == 1 else 'ies'}, {rewards} reward model{'' if rewards == 1 else 's'}"
    return (f"Disk: checkpoints {size_text(folder_bytes(root))} ({counts}) in {root}, "
            f"database {size_text(database_bytes(db_path))}")
