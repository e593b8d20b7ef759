"""Bounded disk: which checkpoint folders of a database to keep (round.keep_policies), and deleting the others.

`retention_plan` decides, from the store's tables alone, each folder with its reason; `delete_checkpoint` deletes one
(a policy is marked pruned in the store first, so nothing loads it again); `prune_checkpoints` joins them, at the end
of every finished round (`prune_after_round`) and for `python app.py --prune`. Nothing outside the database's
checkpoint folder (`<round.checkpoints_dir>/<db name>`) is ever deleted, nor the base or SFT model (round 0).

The rule, K = round.keep_policies (0 keeps everything). A policy past round 0 is kept when it is:
- the current policy (the last promoted: the next round and the app's pairs start from it) or its parent (the
  current policy's versus pairs are set against it), and the newest policy when it is a candidate not promoted (its
  versus pairs may still promote it: annotate.promotion);
- one of the last K policies (by round, then id);
- the best by people's votes (`best_win_rate`; under votes.weighting = "reliability" each versus vote weighed as
  promotion weighs it: annotate.promotion.store_win_rates);
- named by the last finished round (the policy it saved and the one it started from);
- named by a round after the last finished one (running, or failed and resumable: loop.round_plan.crashed_work reads
  its actor, policy and reward model).
A reward model or ceiling policy is kept when a round above names it (the last finished round's reward model is the
next round's warm start and the judge of the next pairs) or when it was made with a kept policy. A policy folder that
a kept policy's LoRA adapters sit on (the policy LoRA was turned on after) is kept: they load on it. Every other named
folder is deleted. report.html files, caches and leftovers of crashed rounds are never touched.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from annotate.disk import (POLICY, Checkpoint, disk_line, folder_bytes, folder_key, is_inside, named_checkpoints,
                           size_text)
from annotate.metrics import (ROUND_ACTOR_POLICY_ID, ROUND_CEILING_POLICY_PATH, ROUND_POLICY_ID, ROUND_POLICY_PATH,
                              ROUND_REFERENCE, ROUND_REWARD_MODEL_PATH)
from annotate.promotion import store_win_rates
from annotate.records import Policy, Round, WinRate, current_policy_of, newest_policy
from annotate.store import Store
from loop.config import LoopConfig
from loop.round_lock import RoundBusy, RoundLock
from loop.round_plan import Log, database_checkpoint_dir
from rlhf.model_names import adapter_base

BEST_MIN_JUDGED = 10
"""Judged versus votes (wins, losses, ties) a policy needs before its win rate can make it the best one."""


class PolicyPruned(ValueError):
    """A policy whose folder retention deleted was asked for; the message says which, and what to do instead."""


def loadable_path(policy: Policy) -> str:
    """The folder to load `policy` from; PolicyPruned, with a sentence, when its folder was pruned."""
    if policy.pruned:
        raise PolicyPruned(policy.pruned_sentence())
    return policy.path


@dataclass(frozen=True)
class Decision:
    """One checkpoint folder, kept or deleted, and why."""

    checkpoint: Checkpoint
    keep: bool
    reason: str


def best_win_rate(win_rates: list[WinRate], policies: list[Policy]) -> WinRate | None:
    """The best policy by people's votes: among the versus tallies of policies past round 0 whose folders are not
    pruned, with at least BEST_MIN_JUDGED judged votes and a 95% Wilson lower bound above one half (people preferred
    it to the policy it was set against, beyond chance), the one whose lower bound is highest (the newer on a tie).
    None without such a tally.

    A versus win rate measures a policy against the earlier one its pairs named (usually its parent), not against a
    fixed yardstick: the best is the clearest step forward people confirmed, kept in case later rounds undo it.
    """
    trained = {p.id for p in policies if p.round > 0 and not p.pruned}
    eligible = [w for w in win_rates if w.policy_id in trained and w.judged >= BEST_MIN_JUDGED
                and w.interval()[0] > 0.5]
    return max(eligible, key=lambda w: (w.interval()[0], w.policy_id)) if eligible else None


def _add(reasons: dict, key, reason: str) -> None:
    """`reason` for `key` (a policy id or a folder key); nothing for a key a round did not record."""
    if key is not None and key != "":
        reasons.setdefault(int(key) if isinstance(key, (int, float)) else key, []).append(reason)


def _round_reasons(rounds: list[Round], kept_ids: dict, kept_paths: dict) -> None:
    """What the last finished round and any round after it name."""
    done = [r for r in rounds if r.status == "done"]
    last_done = done[-1] if done else None
    if last_done is not None:
        metrics = last_done.metrics
        _add(kept_ids, metrics.get(ROUND_POLICY_ID.name), f"saved by the last finished round ({last_done.id})")
        _add(kept_ids, metrics.get(ROUND_ACTOR_POLICY_ID), f"the last finished round ({last_done.id}) started from it")
        path = metrics.get(ROUND_REWARD_MODEL_PATH)
        _add(kept_paths, path and folder_key(path), f"the last finished round's ({last_done.id}) reward model: the "
             "next round starts from it and picks the next pairs with it")
    for later in (r for r in rounds if last_done is None or r.id > last_done.id):
        why = f"round {later.id} ({later.status}, after the last finished one) names it: a resumed round reads it"
        for key in (ROUND_POLICY_ID.name, ROUND_ACTOR_POLICY_ID):
            _add(kept_ids, later.metrics.get(key), why)
        for key in (ROUND_REWARD_MODEL_PATH, ROUND_CEILING_POLICY_PATH, ROUND_POLICY_PATH, ROUND_REFERENCE):
            path = later.metrics.get(key)
            _add(kept_paths, path and folder_key(path), why)


def kept_reasons(policies: list[Policy], rounds: list[Round], win_rates: list[WinRate],
                 keep_policies: int) -> tuple[dict[int, list[str]], dict[str, list[str]]]:
    """(policy id -> why it is kept, folder -> why it is kept): every rule of the module's docstring but "made with a
    kept policy", which `retention_plan` applies."""
    kept_ids: dict[int, list[str]] = {}
    kept_paths: dict[str, list[str]] = {}
    if policies:
        current, newest = current_policy_of(policies), newest_policy(policies)
        _add(kept_ids, current.id, "the current policy: the next round and the app's pairs start from it")
        _add(kept_ids, current.parent_id, "the current policy's parent: its versus pairs are set against it")
        if newest.id != current.id:
            _add(kept_ids, newest.id, "the newest policy, a candidate: its versus pairs may still promote it")
    trained = sorted((p for p in policies if p.round > 0), key=lambda p: (p.round, p.id))
    for policy in trained[-keep_policies:] if keep_policies > 0 else []:
        _add(kept_ids, policy.id, f"one of the last {keep_policies} policies (round.keep_policies)")
    best = best_win_rate(win_rates, policies)
    if best is not None:
        _add(kept_ids, best.policy_id, f"the best by people's votes: {best.win_rate:.0%} against policy "
             f"{best.opponent_id} over {best.judged_text()} (95% lower bound {best.interval()[0]:.0%})")
    _round_reasons(rounds, kept_ids, kept_paths)
    return kept_ids, kept_paths


def retention_plan(checkpoints: list[Checkpoint], policies: list[Policy], rounds: list[Round],
                   win_rates: list[WinRate], keep_policies: int,
                   bases: dict[str, str] | None = None) -> list[Decision]:
    """Each checkpoint kept or deleted, with its reason, by the rule of the module's docstring (K = `keep_policies`;
    0 keeps every one). A pruned policy whose folder is still there is deleted again. `bases`: a policy folder of
    LoRA adapters -> the folder they sit on (`adapter_bases`)."""
    if keep_policies <= 0:
        return [Decision(c, True, "round.keep_policies is 0: every checkpoint is kept") for c in checkpoints]
    kept_ids, kept_paths = kept_reasons(policies, rounds, win_rates, keep_policies)
    pruned = {p.id for p in policies if p.pruned}
    decisions = []
    for checkpoint in checkpoints:
        reasons = list(kept_paths.get(checkpoint.path, []))
        for policy_id in sorted(checkpoint.policies):
            if checkpoint.kind == POLICY:
                reasons += kept_ids.get(policy_id, [])
            elif policy_id in kept_ids:
                reasons.append(f"made with policy {policy_id}, which is kept")
        if checkpoint.kind == POLICY and checkpoint.policies & pruned:
            decisions.append(Decision(checkpoint, False, "pruned before: its folder was left behind"))
        elif reasons:
            decisions.append(Decision(checkpoint, True, "; ".join(dict.fromkeys(reasons))))
        elif checkpoint.kind == POLICY:
            decisions.append(Decision(checkpoint, False, f"neither current nor its parent, not one of the last "
                                      f"{keep_policies}, not the best by votes, and no round that needs it names it"))
        else:
            decisions.append(Decision(checkpoint, False, "made with no kept policy, and no round that needs it names "
                                      "it"))
    return _keep_adapter_bases(decisions, bases or {})


def _keep_adapter_bases(decisions: list[Decision], bases: dict[str, str]) -> list[Decision]:
    """`decisions` with every folder that a kept policy's adapters sit on kept."""
    needed: dict[str, list[int]] = {}
    for decision in decisions:
        if decision.keep and decision.checkpoint.path in bases:
            needed.setdefault(bases[decision.checkpoint.path], []).extend(decision.checkpoint.policies)
    kept = []
    for decision in decisions:
        users = sorted(set(needed.get(decision.checkpoint.path, ())))
        if users and not decision.keep:
            which = f"polic{'ies' if len(users) > 1 else 'y'} {', '.join(map(str, users))}"
            decision = Decision(decision.checkpoint, True, f"the LoRA adapters of kept {which} sit on it: they load "
                                "on it")
        kept.append(decision)
    return kept


def adapter_bases(checkpoints: list[Checkpoint]) -> dict[str, str]:
    """Each policy folder of LoRA adapters among `checkpoints` -> the folder its adapters sit on, as folder_key writes
    it (read from its adapter_config.json)."""
    bases = {}
    for checkpoint in checkpoints:
        base = adapter_base(checkpoint.path) if checkpoint.kind == POLICY else None
        if base is not None:
            bases[checkpoint.path] = folder_key(base)
    return bases


@dataclass
class PruneReport:
    """What `prune_checkpoints` decided and did."""

    decisions: list[Decision]
    sizes: dict[str, int] = field(default_factory=dict)
    """Each checkpoint's folder -> its bytes, measured before anything was deleted."""
    freed: int = 0
    """Bytes deleted (0 on a dry run)."""
    dry_run: bool = False
    keep_policies: int = 0
    """The setting it followed."""

    @property
    def deleted(self) -> list[Decision]:
        return [d for d in self.decisions if not d.keep]

    @property
    def kept(self) -> list[Decision]:
        return [d for d in self.decisions if d.keep]

    def summary(self) -> str:
        """One sentence: what was (or would be) freed and kept."""
        def total(decisions: list[Decision]) -> int:
            return sum(self.sizes.get(d.checkpoint.path, 0) for d in decisions)

        freed = f"would free {size_text(total(self.deleted))}" if self.dry_run else f"freed {size_text(self.freed)}"
        return (f"Pruning {freed} in {len(self.deleted)} folder(s); {len(self.kept)} kept "
                f"({size_text(total(self.kept))}, round.keep_policies = {self.keep_policies}).")

    def lines(self) -> list[str]:
        """A line a checkpoint: deleted or kept, its size, what it is and why."""
        verb = "would delete" if self.dry_run else "deleted"
        return [f"  {'kept' if d.keep else verb:<12} {size_text(self.sizes.get(d.checkpoint.path, 0)):>8}  "
                f"{d.checkpoint.label}: {d.reason}" for d in self.decisions]


def checkpoint_root(store: Store, config: LoopConfig) -> Path:
    """The database's checkpoint folder: the only one pruning deletes in."""
    return database_checkpoint_dir(config.round.checkpoints_dir, store.path)


def present_checkpoints(store: Store, config: LoopConfig) -> list[Checkpoint]:
    """The checkpoints the store names (annotate.disk.named_checkpoints) whose folders are on disk."""
    named = named_checkpoints(store.policies(), store.rounds(), checkpoint_root(store, config))
    return [c for c in named if Path(c.path).is_dir() and not Path(c.path).is_symlink()]


def delete_checkpoint(store: Store, decision: Decision, root: Path) -> int:
    """Delete one checkpoint that `decision` does not keep, a policy marked pruned first (a crash between the two leaves
    a marked policy with its folder, which the next pruning deletes; never a row that names a missing folder); returns
    the bytes freed. Refuses, as ValueError, a kept checkpoint or a folder outside `root`."""
    checkpoint = decision.checkpoint
    if decision.keep or not is_inside(checkpoint.path, root):
        raise ValueError(f"not deleting {checkpoint.path}: {'kept' if decision.keep else f'outside {root}'}")
    size = folder_bytes(checkpoint.path)
    if checkpoint.kind == POLICY:
        store.mark_policy_pruned(min(checkpoint.policies))
    shutil.rmtree(checkpoint.path)
    return size


def prune_checkpoints(store: Store, config: LoopConfig, dry_run: bool = False) -> PruneReport:
    """Decide (retention_plan) over the checkpoints on disk and, unless `dry_run`, delete those not kept. The caller
    holds the round lock (a round in progress is what this must never race)."""
    checkpoints = present_checkpoints(store, config)
    win_rates = store_win_rates(store, config.votes.weighting)  # people's verdicts as promotion reads them
    decisions = retention_plan(checkpoints, store.policies(), store.rounds(), win_rates,
                               config.round.keep_policies, adapter_bases(checkpoints))
    report = PruneReport(decisions, {c.path: folder_bytes(c.path) for c in checkpoints}, dry_run=dry_run,
                         keep_policies=config.round.keep_policies)
    if not dry_run:
        root = checkpoint_root(store, config)
        report.freed = sum(delete_checkpoint(store, decision, root) for decision in report.deleted)
    return report


def prune_database(store: Store, config: LoopConfig, dry_run: bool = False) -> tuple[PruneReport, str]:
    """`--prune`: prune_checkpoints holding the database's round lock, so no round starts meanwhile, then the Disk line
    (annotate.disk.disk_line). RoundBusy while a round holds it; a dry run takes no lock (a round waiting to start is
    not turned away by a listing) but is refused the same way."""
    lock = RoundLock(config.app.db)
    if dry_run and lock.is_held():
        raise RoundBusy(f"A round is running on this database (lock {lock.path}); list again once it has finished.")
    if not dry_run:
        lock.acquire("prune")
    try:
        report = prune_checkpoints(store, config, dry_run)
    finally:
        lock.release()
    root = checkpoint_root(store, config)
    return report, disk_line(root, store.path, present_checkpoints(store, config))


def prune_after_round(store: Store, config: LoopConfig, round_id: int, log: Log) -> None:
    """The end of a finished round (loop.round, main process, the round lock held): prune and say what was freed. The
    round is done by then: a pruning that fails is said, and the round stays finished."""
    if config.round.keep_policies <= 0:
        return
    try:
        report = prune_checkpoints(store, config)
    except Exception as error:  # the round's work stands; --prune can try again
        log(f"Round {round_id}: old checkpoints were not all deleted ({type(error).__name__}: {error}); "
            "python app.py --prune tries again.")
        return
    if report.deleted:
        log(f"Round {round_id}: {report.summary()}")
