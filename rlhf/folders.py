"""Writing a folder atomically: models, tokenizers and checkpoints are written beside their real name and renamed
into place, so a crash (a killed process, a full disk, an exception while saving) never leaves a half-written
folder under the real name, where the next load would take it for a whole one."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def replace_folder(staging: Path, target: Path) -> Path:
    """Rename the finished folder `staging` to `target` (on the same file system), replacing an old `target`.

    The old folder is first moved aside under a hidden name and removed only once the new one is in place, so at
    every moment the real name holds a whole folder or, for an instant between the two renames, none; should the
    second rename fail, the old folder is moved back.
    """
    staging, target = Path(staging), Path(target)
    if not target.exists():
        os.replace(staging, target)
        return target
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
    old = aside / target.name
    os.replace(target, old)
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(old, target)
        aside.rmdir()
        raise
    shutil.rmtree(aside, ignore_errors=True)
    return target


@contextmanager
def written_atomically(target: str | os.PathLike, keep_existing: bool = False) -> Iterator[Path]:
    """Yield an empty staging folder beside `target` to write into; when the block ends without error it becomes
    `target` (`replace_folder`: an old `target` is replaced), and on any error it is removed, the old `target`
    left untouched.

    The staging folder is a hidden sibling (".<name>-" and random letters) so the final rename stays on one file
    system. With `keep_existing`, a `target` that exists when the block ends (another process finished first) is kept
    and the staging folder dropped.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield staging
        if keep_existing and target.exists():
            shutil.rmtree(staging)
        else:
            replace_folder(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
