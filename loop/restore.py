"""`--restore DIR`: a backup made by loop.backup put back, at any database path and checkpoint folder, on any machine.

Nothing is written until everything is checked: the manifest, that neither the app nor a round runs on the target
database (their locks, held then for the whole restore), that no database is at the target and no checkpoint folder
at the places the backup's folders go (a restore replaces nothing). The folders land under the target's
round.checkpoints_dir (loop.backup's layout, checkpoints/ dropped); the names the database records are rewritten
where they moved (Store.rewrite_paths); rounds the backup caught running are marked failed, since none runs now, and
the next round goes on from what they finished. Then every folder the database names is looked for, and
PRAGMA integrity_check run.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterator

from annotate.disk import folder_bytes, size_text
from annotate.store import Store
from annotate.store.backup import integrity_problems
from annotate.store.sql import MIGRATIONS
from loop.backup import (COPIED, ELSEWHERE, EMBEDDED, INSIDE, MANIFEST, MANIFEST_FORMAT, MISSING, MODEL_NAME,
                         BackupRefused, Log, named_folders, status_on_disk)
from loop.file_lock import AppLock, LockHeld
from loop.round_lock import RoundBusy, RoundLock
from rlhf.folders import written_atomically


class RestoreBusy(BackupRefused):
    """The annotation app serves the target database, or a round runs on it."""


def restored_place(backup: str, checkpoints_dir: str | Path) -> Path:
    """Where a restore puts the folder DIR keeps at `backup` (backup_place): under checkpoints_dir, with checkpoints/
    dropped and elsewhere/ kept. BackupRefused for a place that would leave checkpoints_dir (a doctored manifest)."""
    parts = PurePosixPath(backup).parts
    if not parts or PurePosixPath(backup).is_absolute() or ".." in parts or parts[0] not in (INSIDE, ELSEWHERE):
        raise BackupRefused(f"the manifest names the folder {backup!r}, which no backup of rlhf-loop writes")
    return Path(checkpoints_dir).joinpath(*(parts[1:] if parts[0] == INSIDE else parts))


def read_manifest(directory: Path) -> dict:
    """DIR's manifest, checked to be one this code reads; BackupRefused, in words, when it is not."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise BackupRefused(f"{directory} holds no readable {MANIFEST}: it is not a whole backup made by "
                            "python app.py --backup DIR (one cut short has none)") from None
    if not isinstance(manifest, dict) or manifest.get("format", 0) > MANIFEST_FORMAT:
        raise BackupRefused(f"{directory / MANIFEST} was written by a newer rlhf-loop: upgrade rlhf-loop to restore it")
    if manifest.get("schema_version", 0) > len(MIGRATIONS):
        raise BackupRefused(f"the database in {directory} has schema {manifest['schema_version']}, newer than this "
                            f"rlhf-loop knows ({len(MIGRATIONS)}): upgrade rlhf-loop to restore it")
    if not (directory / manifest["database"]["file"]).is_file():
        raise BackupRefused(f"{directory} lacks its database file {manifest['database']['file']}: the backup is "
                            "incomplete")
    return manifest


@dataclass
class RestorePlan:
    """What a restore will copy, decided before anything is written."""

    folders: list[tuple[Path, Path]] = field(default_factory=list)
    """(the folder inside DIR, where it goes), each once."""
    moved: dict[str, str] = field(default_factory=dict)
    """Each folder name the database records -> its name after the restore, where the two differ."""


def plan_restore(manifest: dict, directory: Path, db: Path, checkpoints_dir: str | Path) -> RestorePlan:
    """The folders to copy back and the names to rewrite; BackupRefused when the database or one of the folders
    exists already at its place (a restore replaces nothing), or the backup lacks a folder its manifest lists."""
    if db.exists():
        raise BackupRefused(f"{db} exists already, and a restore never replaces a database: move it aside (keep it "
                            "until the restored one is checked), or restore to another --db PATH")
    plan, taken = RestorePlan(), []
    for entry in manifest["folders"]:
        if entry["status"] != COPIED:
            continue
        source, target = directory / entry["backup"], restored_place(entry["backup"], checkpoints_dir)
        if not source.is_dir():
            raise BackupRefused(f"the backup lacks {source}, which its manifest lists: it is incomplete")
        if (source, target) not in plan.folders:
            plan.folders.append((source, target))
            taken += [str(target)] if target.exists() else []
        if str(target) != entry["original"]:
            plan.moved[entry["original"]] = str(target)
    if taken:
        raise BackupRefused(f"checkpoint folders exist already where the restore would put them: {', '.join(taken)}; "
                            "move them aside, or restore with --set round.checkpoints_dir=AN_EMPTY_FOLDER")
    return plan


def _app_busy(db: Path, lock: AppLock) -> RestoreBusy:
    return RestoreBusy(f"the annotation app serves {db} (it holds {lock.path}): stop it, then restore")


def _round_busy(db: Path, lock: RoundLock) -> RestoreBusy:
    return RestoreBusy(f"a round is running on {db} (process {lock.holder() or '?'} holds {lock.path}): wait for it "
                       "to end, then restore")


def refuse_while_busy(db: Path) -> None:
    """RestoreBusy while the app or a round holds its lock beside `db` (probed: no lock file is made)."""
    app, round_lock = AppLock(db), RoundLock(db)
    if app.is_held():
        raise _app_busy(db, app)
    if round_lock.is_held():
        raise _round_busy(db, round_lock)


@contextmanager
def restore_locks(db: Path) -> Iterator[None]:
    """Hold the database's app and round locks for the whole restore, so neither starts on a half-restored database;
    RestoreBusy when either was taken meanwhile."""
    app, round_lock = AppLock(db), RoundLock(db)
    try:
        app.acquire(json.dumps({"pid": os.getpid(), "command": "--restore"}))
    except LockHeld:
        raise _app_busy(db, app) from None
    try:
        round_lock.acquire()
    except RoundBusy:
        app.release()
        raise _round_busy(db, round_lock) from None
    try:
        yield
    finally:
        round_lock.release()
        app.release()


def place_database(copy: Path, db: Path, log: Log) -> None:
    """Put the backup's database file at `db` (copied beside it, then renamed), first removing a -wal or -shm left
    there by a database that is gone: SQLite would read a stale write-ahead log into the restored file."""
    for stale in (Path(f"{db}-wal"), Path(f"{db}-shm")):
        if stale.exists():
            stale.unlink()
            log(f"Removed {stale}, left by a database no longer there.")
    db.parent.mkdir(parents=True, exist_ok=True)
    partial = db.with_name(f".{db.name}.restoring")
    shutil.copyfile(copy, partial)
    os.replace(partial, db)


def restored_problems(store: Store, manifest: dict, moved: dict[str, str]) -> tuple[list[str], list[str]]:
    """(missing, notes) of the restored database: each folder it names that is not there now, except those the
    backup already lacked (the notes: pruned or removed before it) and models named rather than folders."""
    before = {new: old for old, new in moved.items()}
    by_original = {entry["original"]: entry for entry in manifest["folders"]}
    problems, notes = [], []
    for folder in named_folders(store.policies(), store.rounds()):
        entry = by_original.get(before.get(folder.original, folder.original), {})
        status = entry.get("status") or status_on_disk(folder.original)
        where = f"{folder.original} ({', '.join(folder.named_by)})"
        if status == MISSING:
            notes.append(f"{where}: not in the backup, {entry.get('note') or 'missing'}")
        elif status != MODEL_NAME and not Path(folder.original).expanduser().is_dir():
            hint = " (the embedded model: not kept in backups, run a command with --model default to convert it " \
                "again, or put the folder back)" if status == EMBEDDED else ""
            problems.append(f"{where} is not there{hint}")
    return problems, notes


@dataclass
class RestoreResult:
    """A finished restore: what landed where, what was changed, and what the checks found."""

    db: Path
    checkpoints_dir: str
    folders: int
    bytes: int
    moved: int
    """Names the database records that were rewritten (rows changed)."""
    failed_rounds: list[int]
    """Rounds the backup caught running, marked failed: the next round goes on from what they finished."""
    missing: list[str]
    """Folders the restored database names that are not there (what names them): it cannot load them."""
    integrity: list[str]
    """What PRAGMA integrity_check found wrong ([] for "ok")."""
    notes: list[str]
    """Folders the database names that the backup already lacked (pruned or removed before it)."""
    seconds: float

    def summary(self) -> str:
        """The restore in one line: what, where, how big, how long, and the integrity check."""
        return (f"Restored {self.db} and {self.folders} checkpoint folder{'s' if self.folders != 1 else ''} "
                f"({size_text(self.bytes)}) under {self.checkpoints_dir} in {self.seconds:.1f} s; folder names "
                f"rewritten in {self.moved} row{'s' if self.moved != 1 else ''}; integrity check "
                f"{'FAILED' if self.integrity else 'ok'}.")


LINKED_NAMES = (("adapter_config.json", "base_model_name_or_path"), ("preference_strategy.json", "base_model"))
"""Files in a checkpoint folder that name another folder: the base of a policy's LoRA adapters, the base model of a
reward model's features."""


def relink_moved_folders(folders: list[Path], moved: dict[str, str]) -> None:
    """In each restored folder, a LINKED_NAMES entry naming a folder that moved (`moved`: original -> restored)
    names the restored one, so adapters load on their restored base."""
    for folder in folders:
        for name, key in LINKED_NAMES:
            path = folder / name
            if not path.is_file():
                continue
            content = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(content, dict) and content.get(key) in moved:
                content[key] = moved[content[key]]
                path.write_text(json.dumps(content, indent=2), encoding="utf-8")


def restore(directory: str | Path, db: str | Path, checkpoints_dir: str | Path, log: Log = print) -> RestoreResult:
    """Restore the backup in `directory` (made by back_up) to the database `db`, its folders under `checkpoints_dir`;
    then mark the rounds it caught running failed, and check. BackupRefused (RestoreBusy while the app or a round
    runs on `db`) before anything is written; OSError when copying fails."""
    started, directory, db = time.perf_counter(), Path(directory), Path(db)
    if str(db) == ":memory:":
        raise BackupRefused("a restore needs a database file: name it with --db PATH")
    manifest = read_manifest(directory)
    refuse_while_busy(db)
    plan = plan_restore(manifest, directory, db, checkpoints_dir)
    with restore_locks(db):
        for number, (source, target) in enumerate(plan.folders, start=1):
            log(f"[{number}/{len(plan.folders)}] {source.relative_to(directory).as_posix()} -> {target}")
            with written_atomically(target) as staging:
                shutil.copytree(source, staging, dirs_exist_ok=True)
        relink_moved_folders([target for _source, target in plan.folders], plan.moved)
        place_database(directory / manifest["database"]["file"], db, log)
        with Store(db) as store:
            moved = store.rewrite_paths(plan.moved)
            failed = store.mark_stale_rounds_failed(lambda pid: False)  # we hold the round lock: none runs
            missing, notes = restored_problems(store, manifest, plan.moved)
        integrity = integrity_problems(db)
    for round_id in failed:
        log(f"Round {round_id} was running when the backup was taken: marked failed; the next round goes on from "
            "what it finished.")
    return RestoreResult(db, str(checkpoints_dir), len(plan.folders), sum(folder_bytes(t) for _s, t in plan.folders),
                         moved, failed, missing, integrity, notes, time.perf_counter() - started)
