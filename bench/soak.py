"""Weeks of rounds in one run: the demo loop for many rounds on one database, and what each round costs and leaves.

Per round: seconds by stage (reward model, PPO, next pairs), the reward stage's work (texts whose features were
computed and read from the cache; LP-FT's pairs x passes, incremental after round 1), the checkpoint folder's size and
policy folders, the database's size, and the win rate against the first policy with its 95% interval. Ends with one
JSON line holding `reward_seconds` (one number per round), `finetune_pairs` (the same), `checkpoint_mb` (after the
last round) and `win_rate` (per round). Settings come as --set section.key=value, as in app.py; the database and
checkpoints go to a fresh folder (--out).

    python bench/soak.py --rounds 10 --model default --set simulate.annotator=formal --set simulate.noise=0.25 \\
        --set simulate.votes=300
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from annotate.disk import database_bytes, folder_bytes
from annotate.metrics import stage_seconds
from annotate.store import Store
from bench.machine import describe_machine, machine_line
from loop.config_files import load_config
from loop.demo import run_demo_loop

MB = 1024 * 1024


def round_figures(db: Path, checkpoints: Path, row: dict) -> dict:
    """The store's and the disk's figures after the round of `row`."""
    with Store(db) as store:
        metrics = store.round(row["round"]).metrics
        policies = sum(1 for p in store.policies() if p.round > 0 and not p.pruned)
    return {"round": row["round"], **{f"{stage}_seconds": stage_seconds(stage).of(metrics)
                                      for stage in ("reward", "ppo", "pairs")},
            "features_computed": metrics.get("rm/features_computed"),
            "features_reused": metrics.get("rm/features_reused"), "policies_kept": policies,
            "finetune_pairs": metrics.get("rm/finetune_pairs"), "new_votes": metrics.get("rm/n_new"),
            "replayed_votes": metrics.get("rm/n_replay"), "preference_pairs": metrics.get("rm/n_train"),
            "heldout_accuracy": metrics.get("rm/heldout_accuracy"),
            "checkpoint_mb": folder_bytes(checkpoints) / MB, "database_mb": database_bytes(db) / MB,
            "win_rate": row["win_rate"], "win_rate_low": row["win_rate_low"], "win_rate_high": row["win_rate_high"]}


def print_figures(figures: dict) -> None:
    seconds = " / ".join(f"{figures[f'{stage}_seconds'] or 0:.0f}" for stage in ("reward", "ppo", "pairs"))
    print(f"soak round {figures['round']}: seconds reward/PPO/pairs {seconds}; features computed "
          f"{figures['features_computed']}, reused {figures['features_reused']}; LP-FT pairs x passes "
          f"{figures['finetune_pairs']} (new {figures['new_votes']}, replayed {figures['replayed_votes']}, of "
          f"{figures['preference_pairs']}); checkpoints "
          f"{figures['checkpoint_mb']:.0f} MB ({figures['policies_kept']} policies), database "
          f"{figures['database_mb']:.1f} MB; win rate vs first {figures['win_rate']:.1%} "
          f"({figures['win_rate_low']:.1%}-{figures['win_rate_high']:.1%})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--model", default="default")
    parser.add_argument("--out", default="data/soak", help="a fresh folder for the database and its checkpoints")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args()
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"{out} is not empty: give a fresh --out (the soak starts from no votes).", file=sys.stderr)
        return 2
    db, checkpoints = out / "soak.db", out / "checkpoints"
    config = load_config(None, [f"app.db={db}", f"app.model={args.model}", f"simulate.rounds={args.rounds}",
                                f"round.checkpoints_dir={checkpoints}", *args.set], default_file=None)
    machine = describe_machine()
    print(machine_line(machine), flush=True)
    rows: list[dict] = []

    def measure(row: dict) -> None:
        rows.append(round_figures(db, checkpoints, row))
        print_figures(rows[-1])

    code = run_demo_loop(config, on_round=measure)
    print(json.dumps({"bench": "soak", "model": args.model, "rounds": rows,
                      "reward_seconds": [r["reward_seconds"] for r in rows],
                      "finetune_pairs": [r["finetune_pairs"] for r in rows],
                      "checkpoint_mb": rows[-1]["checkpoint_mb"] if rows else None,
                      "win_rate": [r["win_rate"] for r in rows], "keep_policies": config.round.keep_policies,
                      "machine": machine}))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
