"""Features of answers kept on disk between rounds: a frozen model's pooled hidden state of a (prompt, answer) never
changes, so a round computes it only for the answers no earlier round has seen, and the reward stage's feature pass
costs what the new votes cost instead of every vote again (issue #33).

One file per model, feature and max_length (`<fingerprint>-<feature>-<max_length>.pt` in the cache folder), holding
the texts' keys and an (N, D) float32 tensor. A model's fingerprint is its folder and its weight files' names, sizes
and modification times, so a re-converted or retrained model at the same path starts a new file rather than reading
stale features.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Sequence

import torch


def text_key(prompt: str, answer: str) -> str:
    """The cache's name for one (prompt, answer): a hash of both texts."""
    return hashlib.sha256(f"{prompt}\x00{answer}".encode("utf-8")).hexdigest()[:32]


def model_fingerprint(model_path: str | Path) -> str:
    """A short hash of the model folder and of its weight files' names, sizes and modification times."""
    folder = Path(model_path).resolve()
    parts = [str(folder)]
    for weights in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        stat = weights.stat()
        parts.append(f"{weights.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()[:16]


class FeatureFile:
    """The cached features of one model, feature and max_length: read once, appended to as new texts are computed."""

    def __init__(self, folder: str | Path, model_path: str | Path, feature: str, max_length: int):
        name = f"{model_fingerprint(model_path)}-{feature.replace('@', '_')}-{max_length}.pt"
        self.path = Path(folder) / name
        self._rows: dict[str, torch.Tensor] | None = None

    def _load(self) -> dict[str, torch.Tensor]:
        if self._rows is None:
            self._rows = {}
            if self.path.is_file():
                saved = torch.load(self.path, weights_only=True)
                self._rows = dict(zip(saved["keys"], saved["features"]))
        return self._rows

    def __len__(self) -> int:
        return len(self._load())

    def get(self, keys: Sequence[str]) -> dict[str, torch.Tensor]:
        """The cached features among `keys` (D,) each; keys never computed are left out."""
        rows = self._load()
        return {key: rows[key] for key in keys if key in rows}

    def add(self, features: dict[str, torch.Tensor]) -> None:
        """Keep `features` (key -> (D,)) with the rest and write the whole file again, atomically (a temporary file
        renamed into place: a crash leaves the old file, never half of one)."""
        rows = self._load()
        rows.update({key: value.detach().float().cpu() for key, value in features.items()})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = list(rows)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{self.path.name}-", dir=self.path.parent)
        os.close(descriptor)
        try:
            torch.save({"keys": keys, "features": torch.stack([rows[key] for key in keys])}, temporary)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
