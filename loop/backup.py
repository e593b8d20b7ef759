"""`--backup DIR`: a database with every checkpoint folder it names, copied so that a restore (loop.restore) into
another folder, or onto another machine, gives back a database whose folders are all there.

A backup may run while the app and a round write. The database is copied first, by SQLite's online backup
(annotate.store.backup), and the folders copied are those the copy names, read from the copy itself: the backup never
names a folder it lacks. A round renames a whole staging folder into place (rlhf.folders) before it records the name,
so every folder the copy names is whole; hidden names inside one (staging folders, leftovers) are not copied. A folder
named but gone (pruned, removed), or removed while it was being copied, is said and marked MISSING.

DIR holds the database file under its own name, `checkpoints/<path inside round.checkpoints_dir>` for the folders
there, `elsewhere/<n>-<name>` for the others (a base model's folder, an SFT --out), and MANIFEST. Not copied: a model
named rather than a folder ("default", a Hugging Face id) and the embedded model's converted folder (data/models/...),
which the default model's first use converts again; their names are kept.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from annotate.disk import folder_bytes, folder_key, is_inside, size_text
from annotate.metrics import ROUND_CEILING_POLICY_PATH, ROUND_POLICY_PATH, ROUND_REFERENCE, ROUND_REWARD_MODEL_PATH
from annotate.records import Policy, Round
from annotate.store import now
from annotate.store.backup import copy_database, named_rows
from rlhf.model_names import DEFAULT_CACHE_DIR, names_a_folder

Log = Callable[[str], None]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
"""The manifest's layout version: a restore refuses a newer one."""
PATH_METRICS = (ROUND_REWARD_MODEL_PATH, ROUND_POLICY_PATH, ROUND_CEILING_POLICY_PATH, ROUND_REFERENCE)
"""The round metrics that name a folder (the reference is the first policy's path: the base model or an SFT folder)."""
INSIDE, ELSEWHERE = "checkpoints", "elsewhere"
"""DIR's folders for the folders inside round.checkpoints_dir and for those outside it."""
COPIED, MODEL_NAME, EMBEDDED, MISSING = "copied", "model name", "embedded model", "missing"
"""What the backup did with a named folder: copied it; nothing, for a model named rather than a folder, and for the
embedded model's converted folder (re-created on use); nothing, for one that was not there."""


class BackupRefused(Exception):
    """A backup or a restore that cannot go ahead, in a sentence that says what to do; nothing was written."""


@dataclass
class NamedFolder:
    """A folder name the database records (exactly as recorded), what records it, and what the backup did with it:
    one entry of the manifest's "folders"."""

    original: str
    named_by: list[str]
    """"policy 2", "round 1 round/reward_model_path"..."""
    status: str = ""
    """COPIED, MODEL_NAME, EMBEDDED or MISSING."""
    backup: str | None = None
    """Its place inside DIR, "/"-separated (checkpoints/loop/round-1/policy), for a COPIED one."""
    bytes: int = 0
    note: str = ""
    """Why it was not copied, or the other spelling of the same folder that was."""
    pruned_at: str | None = None
    """When retention deleted it (a policy's pruned_at), for a pruned policy."""


def named_folders(policies: list[Policy], rounds: list[Round]) -> list[NamedFolder]:
    """Every folder name the policies and the rounds' metrics (PATH_METRICS) record, each spelling once, in the order
    first met (policies by id, then rounds by id), with what records it."""
    named: dict[str, NamedFolder] = {}
    for policy in policies:
        entry = named.setdefault(policy.path, NamedFolder(policy.path, []))
        entry.named_by.append(f"policy {policy.id}")
        entry.pruned_at = entry.pruned_at or getattr(policy, "pruned_at", None)
    for round_ in rounds:
        for key in PATH_METRICS:
            if isinstance(path := round_.metrics.get(key), str) and path:
                named.setdefault(path, NamedFolder(path, [])).named_by.append(f"round {round_.id} {key}")
    return list(named.values())


def status_on_disk(path: str) -> str:
    """What a backup does with the name `path`, by what is on disk now: COPIED for a folder, EMBEDDED for a folder
    inside the embedded model's (rlhf.model_names.DEFAULT_CACHE_DIR), MODEL_NAME for a name that is not a folder and
    need not be one ("default", "org/model"), MISSING for one that can only be a folder and is not there."""
    if Path(path).expanduser().is_dir():
        return EMBEDDED if is_inside(Path(path).expanduser(), DEFAULT_CACHE_DIR) else COPIED
    return MISSING if names_a_folder(path) else MODEL_NAME


def backup_place(path: str, checkpoints_dir: str | Path, number: int) -> str:
    """Where the folder `path` goes inside DIR: checkpoints/<its path inside checkpoints_dir>, or for one outside it
    elsewhere/<number>-<its name> (the number keeps two folders of one name apart)."""
    if is_inside(path, checkpoints_dir):
        inside = Path(os.path.relpath(folder_key(path), folder_key(checkpoints_dir)))
        return PurePosixPath(INSIDE, *inside.parts).as_posix()
    return f"{ELSEWHERE}/{number}-{Path(folder_key(path)).name}"


def _not_copied_note(folder: NamedFolder) -> str:
    if folder.status == MODEL_NAME:
        return "a model named, not a folder: loaded by its name after a restore"
    if folder.status == EMBEDDED:
        return "the embedded model's converted folder: not kept, the default model's first use converts it again"
    if folder.pruned_at:
        return f"pruned at {folder.pruned_at} (round.keep_policies)"
    return "not on disk when the backup ran (pruned or removed)"


def _copy_in(folder: NamedFolder, directory: Path, place: str) -> None:
    """Copy the folder into DIR at `place`, hidden names left out, through a hidden staging folder renamed at the end;
    a folder removed while it was copied becomes MISSING. OSError for any other failure (DIR's disk full...)."""
    source = Path(folder.original).expanduser()
    staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=directory))
    try:
        shutil.copytree(source, staging, ignore=shutil.ignore_patterns(".*"), dirs_exist_ok=True)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if source.is_dir():
            raise
        folder.status, folder.note = MISSING, "removed while the backup copied it (pruned?)"
        return
    target = directory / place
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, target)
    folder.status, folder.backup, folder.bytes = COPIED, place, folder_bytes(target)


def copy_named_folders(folders: list[NamedFolder], directory: Path, checkpoints_dir: str | Path, log: Log) -> None:
    """Fill in each folder's status, copying the folders there are into DIR, each once (a second spelling of one
    folder shares the first's copy); a line for each folder copied and for each named folder that is not there."""
    copied: dict[str, NamedFolder] = {}
    for number, folder in enumerate(folders, start=1):
        folder.status = status_on_disk(folder.original)
        first = copied.get(folder_key(folder.original)) if folder.status == COPIED else None
        if first is not None:
            folder.backup, folder.bytes, folder.note = first.backup, first.bytes, f"the same folder as {first.original}"
            continue
        if folder.status == COPIED:
            log(f"[{number}/{len(folders)}] {folder.original} ({', '.join(folder.named_by)})")
            _copy_in(folder, directory, backup_place(folder.original, checkpoints_dir, number))
        if folder.status == COPIED:
            copied[folder_key(folder.original)] = folder
        else:
            folder.note = folder.note or _not_copied_note(folder)
            log(f"[{number}/{len(folders)}] not copied: {folder.original} ({', '.join(folder.named_by)}): "
                f"{folder.note}")


def copies(entries: list[dict]) -> dict[str, int]:
    """The folders a backup holds, each once: its place inside DIR -> its bytes (from the manifest's "folders")."""
    return {entry["backup"]: entry["bytes"] for entry in entries if entry["status"] == COPIED}


@dataclass
class BackupResult:
    """A finished backup: where, and its manifest (MANIFEST, as written)."""

    directory: Path
    manifest: dict

    def summary(self) -> str:
        """The backup in one line: what, how big, how long, and the named folders it lacks."""
        database, folders = self.manifest["database"], self.manifest["folders"]
        copied, missing = len(copies(folders)), sum(f["status"] == MISSING for f in folders)
        lacks = f"; {missing} named folder{'s' if missing != 1 else ''} not in it (missing, listed above)" \
            if missing else ""
        return (f"Backed up {database['original']} (schema {self.manifest['schema_version']}, "
                f"{size_text(database['bytes'])}) and {copied} checkpoint folder{'s' if copied != 1 else ''} "
                f"({size_text(self.manifest['bytes'] - database['bytes'])}) to {self.directory} in "
                f"{self.manifest['seconds']:.1f} s{lacks}.")


def _refuse_unless_empty(directory: Path) -> None:
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        what = "a file" if not directory.is_dir() else "a folder that is not empty"
        raise BackupRefused(f"{directory} is {what}: a backup goes into a new or empty folder, so that it never "
                            "mixes with another; name another --backup DIR")


def back_up(db: str | Path, directory: str | Path, checkpoints_dir: str | Path, log: Log = print) -> BackupResult:
    """Back up the database `db` and the folders it names into the new or empty folder `directory` (the module's
    docstring says how); BackupRefused for a `directory` that exists and is not empty, OSError when writing fails."""
    started, directory = time.perf_counter(), Path(directory)
    _refuse_unless_empty(directory)
    directory.mkdir(parents=True, exist_ok=True)
    db_copy = directory / Path(db).name
    schema = copy_database(db, db_copy)
    log(f"Copied the database {db} ({size_text(db_copy.stat().st_size)}, schema {schema}) to {db_copy}.")
    folders = named_folders(*named_rows(db_copy))
    copy_named_folders(folders, directory, checkpoints_dir, log)
    database = {"file": db_copy.name, "original": folder_key(db), "bytes": db_copy.stat().st_size}
    entries = [dataclasses.asdict(folder) for folder in folders]
    manifest = {
        "format": MANIFEST_FORMAT, "created_at": now(), "schema_version": schema, "database": database,
        "checkpoints_dir": folder_key(checkpoints_dir), "folders": entries,
        "bytes": database["bytes"] + sum(copies(entries).values()), "seconds": round(time.perf_counter() - started, 3),
    }
    written = directory / f".{MANIFEST}-partial"
    written.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(written, directory / MANIFEST)  # last: a folder with a manifest holds a whole backup
    return BackupResult(directory, manifest)
