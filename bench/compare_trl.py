"""rlhf-loop against TRL 0.29.1 on the same settings, fp32 against fp32 and bf16 against bf16, in one run; ends with
ONE JSON line.

    bash bench/trl_env.sh                      # once: TRL in its own venv (.venv-trl), not a project dependency
    python bench/compare_trl.py                # default model, batch 8, 48 new tokens; fp32, bf16
    python bench/compare_trl.py --ppo-steps 2 --rm-pairs 40 --rm-steps 3 --repeats 1   # a quick look
    python bench/compare_trl.py --precision no --skip reward                          # PPO in fp32 only

Each measurement is its own process, so peak memory is that run's alone: our side runs bench/ppo_step.py
and bench/reward_train.py with this interpreter, TRL's side bench/trl_side.py with the TRL venv's.

PPO: batch 8, --max-new-tokens always generated (no stop token), one PPO epoch, one mini-batch, policy and
reference separate copies; TRL's reward and value models are AutoModelForSequenceClassification
(num_labels=1). step_s excludes each run's first step. Reward model: the fixed synthetic preference set of
bench/synthetic_prefs.py, split as rlhf-loop splits it (split_pairs by prompt, same fraction), batch 8 pairs a
step, max length 128; TRL's pairs_per_s is its train_samples_per_second, ours the same count over our
training time.

Like with like: each precision of --precision (default both) runs on both sides, and each pairing has its ratios.
fp32: ours with `--mixed-precision no`, TRL as it comes. bf16: ours with `--mixed-precision bf16` (autocast, fp32
weights), TRL with `bf16=True` (accelerate's autocast, fp32 weights; TRL's PPO autocasts its update's forward only:
its rollout runs the unwrapped models, in fp32). Sides are ours-fp32, trl-fp32, ours-bf16, trl-bf16; `pairings`
holds speedup (TRL's step time over ours, above 1: we are faster; for the reward model our pairs/s over TRL's),
speedup_min and memory_ratio (ours/TRL, below 1: we use less) per precision, and with both precisions also
`ours_bf16_vs_trl_fp32`, the pairing earlier runs reported (the README's 2.61x), for reference only. The two
sides of a pairing run one after the other, their order alternating between repeats, so a change in the
machine's load hits both alike; the figures are medians over the repeats. On a machine shared with other work a
step can take several times its quiet length: step_s_min (the fastest measured step, one per run, then the
median over runs) is the figure least moved by that. bf16 where the hardware would emulate it is refused
unless --allow-emulated-bf16 (bench/machine.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from anywhere: the repository root first

from bench.machine import add_bf16_flag, check_bf16, describe_machine, machine_line

PRECISION_NAMES = {"no": "fp32", "bf16": "bf16"}
"""--precision's values (ours' --mixed-precision) and the names of the sides and pairings."""


def last_json_line(output: str) -> dict:
    """The last line of a bench's output that is a JSON object (each bench ends with one)."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            return json.loads(line)
    raise ValueError("no JSON line in the output")


def run_side(label: str, command: list[str], threads: int | None) -> dict:
    """Run one bench process; its JSON figures, with the wall time of the whole process."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    print(f"[{time.strftime('%H:%M:%S')}] {label}: {' '.join(command)}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{label} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    figures = last_json_line(done.stdout)
    figures["process_s"] = round(time.perf_counter() - started, 1)
    print(f"  {json.dumps(figures)}", file=sys.stderr, flush=True)
    return figures


def write_reward_data(folder: Path, n_pairs: int, heldout_fraction: float, seed: int) -> tuple[Path, Path]:
    """The synthetic pairs split exactly as our trainer splits them, as two JSONL files for TRL."""
    from bench.synthetic_prefs import synthetic_preferences
    from rlhf.reward.data import split_pairs

    train, heldout = split_pairs(synthetic_preferences(n_pairs, seed=seed), heldout_fraction)
    paths = []
    for name, pairs in (("train", train), ("heldout", heldout)):
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n"
                                for p in pairs), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def median_of(runs: list[dict], key: str) -> float | None:
    values = [run[key] for run in runs if run.get(key) is not None]
    return round(statistics.median(values), 3) if values else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 3) if numerator and denominator else None


def ppo_ratios(ours: dict, trl: dict) -> dict:
    """A PPO pairing: step time TRL/ours (above 1: we are faster), peak memory ours/TRL (below 1: we use less)."""
    return {"speedup": ratio(trl["step_s"], ours["step_s"]), "speedup_min": ratio(trl["step_s_min"], ours["step_s_min"]),
            "memory_ratio": ratio(ours["peak_rss_mb"], trl["peak_rss_mb"])}


def reward_ratios(ours: dict, trl: dict) -> dict:
    """A reward-model pairing: pairs/s ours/TRL (above 1: we are faster), peak memory ours/TRL."""
    return {"speedup": ratio(ours["pairs_per_s"], trl["pairs_per_s"]),
            "memory_ratio": ratio(ours["peak_rss_mb"], trl["peak_rss_mb"])}


def pairings(figures: dict, names: list[str], ratios) -> dict:
    """Like with like: `ratios(ours-P, trl-P)` for each precision P, and with both precisions the old pairing of
    our bf16 run against TRL's fp32 run, labelled as such."""
    paired = {name: ratios(figures[f"ours-{name}"], figures[f"trl-{name}"]) for name in names}
    if {"fp32", "bf16"} <= set(names):
        paired["ours_bf16_vs_trl_fp32"] = {**ratios(figures["ours-bf16"], figures["trl-fp32"]),
                                           "note": "earlier runs' pairing (unlike precisions), for reference only"}
    return paired


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default", help="checkpoint both sides load (default: the embedded one)")
    parser.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"),
                        help="interpreter of the TRL venv (default .venv-trl/bin/python; make it with "
                             "bench/trl_env.sh)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side, alternating (default 2)")
    parser.add_argument("--ppo-steps", type=int, default=4, help="PPO steps a run, the first not counted (default 4)")
    parser.add_argument("--batch-size", type=int, default=8, help="PPO prompts a step (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens generated per answer (default 48)")
    parser.add_argument("--rm-pairs", type=int, default=200, help="synthetic pairs, held-out ones included (default 200)")
    parser.add_argument("--rm-heldout-fraction", type=float, default=0.2, help="share held out (default 0.2)")
    parser.add_argument("--rm-steps", type=int, default=None, help="reward steps a run (default: one epoch)")
    parser.add_argument("--rm-batch-size", type=int, default=8, help="pairs a reward step (default 8)")
    parser.add_argument("--rm-max-length", type=int, default=128, help="tokens per sequence (default 128)")
    parser.add_argument("--precision", default="no,bf16",
                        help="comma-separated precisions, each run on both sides: no (fp32) and/or bf16 (autocast, "
                             "fp32 weights; TRL's bf16=True) (default no,bf16)")
    parser.add_argument("--ours-reward-feature", default="last@-1",
                        help="our PPO reward model and critic: last@-1, a whole model as TRL's value model (default), "
                             "or mean@2, the round's own two-layer one")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on both sides (default: torch's)")
    parser.add_argument("--skip", choices=["ppo", "reward"], action="append", default=[],
                        help="leave out one comparison (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    add_bf16_flag(parser)
    args = parser.parse_args(argv)
    if not Path(args.trl_python).is_file():
        parser.error(f"no TRL interpreter at {args.trl_python}: run `bash bench/trl_env.sh` first "
                     "(or pass --trl-python)")
    if args.ppo_steps < 2:
        parser.error("--ppo-steps must be at least 2: the first step is not counted")

    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    if not precisions or any(p not in PRECISION_NAMES for p in precisions):
        parser.error(f"--precision takes no and/or bf16, not {args.precision!r}")
    if args.threads:  # this process only launches; its machine line shows the threads the sides get
        import torch

        torch.set_num_threads(args.threads)
    machine = describe_machine()
    print(machine_line(machine), flush=True)
    check_bf16("bf16" in precisions, args.allow_emulated_bf16, machine, fp32_hint="--precision no")

    from rlhf.models import resolve_model_path

    model_path = str(resolve_model_path(args.model))  # TRL loads the converted folder, not "default"
    ours, trl = sys.executable, args.trl_python
    threads = ["--threads", str(args.threads)] if args.threads else []
    allow = ["--allow-emulated-bf16"] if args.allow_emulated_bf16 else []
    names = [PRECISION_NAMES[p] for p in precisions]
    sides = [f"{who}-{name}" for name in names for who in ("ours", "trl")]
    runs: dict[str, list[dict]] = {f"{side}_{kind}": [] for side in sides for kind in ("ppo", "reward")}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="compare-trl-") as folder:
        train_file, heldout_file = write_reward_data(Path(folder), args.rm_pairs, args.rm_heldout_fraction, args.seed)
        rm_steps = ["--steps", str(args.rm_steps)] if args.rm_steps else []
        base = {
            "ours_ppo": [ours, "bench/ppo_step.py", "--model", args.model, "--steps", str(args.ppo_steps),
                         "--batch-size", str(args.batch_size), "--max-new-tokens", str(args.max_new_tokens),
                         "--full-length", "--seed", str(args.seed), "--reward-feature", args.ours_reward_feature,
                         *threads, *allow],
            "trl_ppo": [trl, "bench/trl_side.py", "ppo", "--model", model_path, "--steps", str(args.ppo_steps),
                        "--batch-size", str(args.batch_size), "--max-new-tokens", str(args.max_new_tokens),
                        "--seed", str(args.seed), *threads],
            "ours_reward": [ours, "bench/reward_train.py", "--model", args.model, "--pairs", str(args.rm_pairs),
                            "--heldout-fraction", str(args.rm_heldout_fraction), "--batch-size",
                            str(args.rm_batch_size), "--max-length", str(args.rm_max_length),
                            "--seed", str(args.seed), *rm_steps, *threads, *allow],
            "trl_reward": [trl, "bench/trl_side.py", "reward", "--model", model_path, "--train", str(train_file),
                           "--heldout", str(heldout_file), "--batch-size", str(args.rm_batch_size),
                           "--max-length", str(args.rm_max_length), "--seed", str(args.seed), *rm_steps, *threads],
        }
        commands = {}
        for precision, name in zip(precisions, names):
            for kind in ("ppo", "reward"):
                commands[f"ours-{name}_{kind}"] = [*base[f"ours_{kind}"], "--mixed-precision", precision]
                commands[f"trl-{name}_{kind}"] = [*base[f"trl_{kind}"], *(["--bf16"] if precision == "bf16" else [])]
        for repeat in range(args.repeats):
            for kind in ("ppo", "reward"):
                if kind in args.skip:
                    continue
                for name in names:  # a pairing's two sides back to back, the first of them alternating
                    for who in (("ours", "trl") if repeat % 2 == 0 else ("trl", "ours")):
                        key = f"{who}-{name}_{kind}"
                        runs[key].append(run_side(f"{key} (repeat {repeat + 1})", commands[key], args.threads))

    summary = {
        "bench": "compare_trl", "model": args.model, "repeats": args.repeats,
        "settings": {"batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens, "ppo_steps": args.ppo_steps,
                     "rm_pairs": args.rm_pairs, "rm_batch_size": args.rm_batch_size,
                     "rm_max_length": args.rm_max_length, "rm_steps": args.rm_steps, "threads": args.threads,
                     "precision": names, "ours_reward_feature": args.ours_reward_feature},
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
    }
    if "ppo" not in args.skip:
        ppo = {side: {key: median_of(runs[f"{side}_ppo"], key) for key in ("step_s", "step_s_min", "peak_rss_mb")}
               for side in sides}
        for side in sides:
            if side.startswith("ours"):
                ppo[side].update({key: median_of(runs[f"{side}_ppo"], key)
                                  for key in ("generate_s", "score_s", "update_s")})
        summary["ppo"] = {**ppo, "pairings": pairings(ppo, names, ppo_ratios)}
    if "reward" not in args.skip:
        reward = {side: {key: median_of(runs[f"{side}_reward"], key)
                         for key in ("pairs_per_s", "peak_rss_mb", "heldout_accuracy", "n_train", "n_heldout", "steps")}
                  for side in sides}
        summary["reward"] = {**reward, "pairings": pairings(reward, names, reward_ratios)}
    summary["machine"] = machine
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
