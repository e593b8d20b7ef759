"""Incremental LP-FT: a round's reward model continues from the last round's on the votes it has not trained on,
with a replay share of earlier ones, so a round costs what its new votes cost (issue #33).

The last round's folder names the pairs it trained on (TRAINED_PAIRS_FILE, keys of prompt, chosen and rejected),
so a pair whose majority flipped since counts as new. The held-out split follows the prompts
(rlhf.reward.data.split_pairs): a pair held out once is held out in every later round, so a warm start never
trained on a pair that measures it. docs/few-votes.md ("Incremental rounds") has the measurements behind the
defaults.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from rlhf.reward.data import PairLike

TRAINED_PAIRS_FILE = "trained_pairs.json"
"""In a saved reward model folder: the keys of the pairs its fine-tuned layers (or head) were trained on."""


def pair_key(pair: PairLike) -> str:
    """A vote's name across rounds: a hash of its prompt, chosen and rejected answer (a flipped majority differs)."""
    text = f"{pair.prompt}\x00{pair.chosen}\x00{pair.rejected}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def write_trained_pairs(folder: str | Path, keys: Sequence[str]) -> None:
    (Path(folder) / TRAINED_PAIRS_FILE).write_text(json.dumps(sorted(keys)), encoding="utf-8")


def read_trained_pairs(folder: str | Path) -> set[str] | None:
    """The keys a saved reward model trained on; None for a folder saved before they were written."""
    path = Path(folder) / TRAINED_PAIRS_FILE
    if not path.is_file():
        return None
    return set(json.loads(path.read_text(encoding="utf-8")))


@dataclass(frozen=True)
class ReplayBatch:
    """What an incremental round trains on: positions into the round's training pairs."""

    new: list[int]
    """Pairs the warm start did not train on, all of them."""
    replay: list[int]
    """Earlier pairs drawn at random: round(replay_share x len(new)), at most every earlier one."""

    @property
    def positions(self) -> list[int]:
        return self.new + self.replay


def replay_batch(train: Sequence[PairLike], trained_before: set[str], replay_share: float, seed: int) -> ReplayBatch:
    """The new pairs of `train` (keys not in `trained_before`) and a seeded sample of the others, replay_share as
    many as the new ones (kept in the order of `train`)."""
    keys = [pair_key(pair) for pair in train]
    new = [i for i, key in enumerate(keys) if key not in trained_before]
    earlier = [i for i, key in enumerate(keys) if key in trained_before]
    n_replay = min(len(earlier), round(replay_share * len(new)))
    replay = sorted(random.Random(seed).sample(earlier, n_replay))
    return ReplayBatch(new=new, replay=replay)
