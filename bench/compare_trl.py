"""rlhf-loop against TRL 0.29.1 on the same settings, in one run, alternating; ends with ONE JSON line.

    bash bench/trl_env.sh                      # once: TRL in its own venv (.venv-trl), not a project dependency
    python bench/compare_trl.py                # issue 7's settings: default model, fp32, batch 8, 48 new tokens
    python bench/compare_trl.py --ppo-steps 2 --rm-pairs 40 --rm-steps 3 --repeats 1   # a quick look

Each measurement is its own process, so peak memory is that run's alone: our side runs bench/ppo_step.py
and bench/reward_train.py with this interpreter, TRL's side bench/trl_side.py with the TRL venv's. The
order alternates between repeats (ours first, then TRL first, ...) so a change in the machine's load hits
both sides alike; the figures are medians over the repeats.

PPO: batch 8, --max-new-tokens always generated (no stop token), one PPO epoch, one mini-batch, policy and
reference separate copies, fp32; TRL's reward and value models are AutoModelForSequenceClassification
(num_labels=1). step_s excludes each run's first step. Reward model: the fixed synthetic preference set of
bench/synthetic_prefs.py, split as rlhf-loop splits it (split_pairs by prompt, same fraction), batch 8 pairs a
step, max length 128; TRL's pairs_per_s is its train_samples_per_second, ours the same count over our
training time. Ratios: step time TRL/ours (above 1: we are faster), memory ours/TRL (below 1: we use less),
pairs/s ours/TRL. `--ours-precision no,bf16` runs our side in both precisions (keys ours, ours-bf16; ratios
speedup, speedup-bf16, ...). On a machine shared with other work a step can take several times its quiet length:
step_s_min (the fastest measured step, one per run, then the median over runs) is the figure least moved by that.
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
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
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
    parser.add_argument("--ours-precision", default="no",
                        help="comma-separated precisions of our side, each run and reported: no (fp32, the issue's "
                             "setting) and/or bf16 (autocast; weights fp32). TRL stays fp32 (default no)")
    parser.add_argument("--ours-reward-feature", default="last@-1",
                        help="our PPO reward model and critic: last@-1, a whole model as TRL's value model (default), "
                             "or mean@2, the round's own two-layer one")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on both sides (default: torch's)")
    parser.add_argument("--skip", choices=["ppo", "reward"], action="append", default=[],
                        help="leave out one comparison (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not Path(args.trl_python).is_file():
        parser.error(f"no TRL interpreter at {args.trl_python}: run `bash bench/trl_env.sh` first "
                     "(or pass --trl-python)")
    if args.ppo_steps < 2:
        parser.error("--ppo-steps must be at least 2: the first step is not counted")

    from rlhf.models import resolve_model_path

    model_path = str(resolve_model_path(args.model))  # TRL loads the converted folder, not "default"
    ours, trl = sys.executable, args.trl_python
    threads = ["--threads", str(args.threads)] if args.threads else []
    precisions = [p.strip() for p in args.ours_precision.split(",") if p.strip()]
    if not precisions or any(p not in ("no", "bf16") for p in precisions):
        parser.error(f"--ours-precision takes no and/or bf16, not {args.ours_precision!r}")
    ours_sides = [f"ours-{p}" if p != "no" else "ours" for p in precisions]  # "ours" is fp32, as before
    runs: dict[str, list[dict]] = {f"{side}_{kind}": [] for side in [*ours_sides, "trl"] for kind in ("ppo", "reward")}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="compare-trl-") as folder:
        train_file, heldout_file = write_reward_data(Path(folder), args.rm_pairs, args.rm_heldout_fraction, args.seed)
        rm_steps = ["--steps", str(args.rm_steps)] if args.rm_steps else []
        commands = {
            "ours_ppo": [ours, "bench/ppo_step.py", "--model", args.model, "--steps", str(args.ppo_steps),
                         "--batch-size", str(args.batch_size), "--max-new-tokens", str(args.max_new_tokens),
                         "--full-length", "--seed", str(args.seed), "--reward-feature", args.ours_reward_feature,
                         *threads],
            "trl_ppo": [trl, "bench/trl_side.py", "ppo", "--model", model_path, "--steps", str(args.ppo_steps),
                        "--batch-size", str(args.batch_size), "--max-new-tokens", str(args.max_new_tokens),
                        "--seed", str(args.seed), *threads],
            "ours_reward": [ours, "bench/reward_train.py", "--model", args.model, "--pairs", str(args.rm_pairs),
                            "--heldout-fraction", str(args.rm_heldout_fraction), "--batch-size",
                            str(args.rm_batch_size), "--max-length", str(args.rm_max_length),
                            "--seed", str(args.seed), *rm_steps, *threads],
            "trl_reward": [trl, "bench/trl_side.py", "reward", "--model", model_path, "--train", str(train_file),
                           "--heldout", str(heldout_file), "--batch-size", str(args.rm_batch_size),
                           "--max-length", str(args.rm_max_length), "--seed", str(args.seed), *rm_steps, *threads],
        }
        for precision, side in zip(precisions, ours_sides):
            for kind in ("ppo", "reward"):
                commands[f"{side}_{kind}"] = [*commands[f"ours_{kind}"], "--mixed-precision", precision]
        for repeat in range(args.repeats):
            for kind in ("ppo", "reward"):
                if kind in args.skip:
                    continue
                order = (*ours_sides, "trl") if repeat % 2 == 0 else ("trl", *ours_sides[::-1])
                for side in order:
                    key = f"{side}_{kind}"
                    runs[key].append(run_side(f"{key} (repeat {repeat + 1})", commands[key], args.threads))

    summary = {
        "bench": "compare_trl", "model": args.model, "repeats": args.repeats,
        "settings": {"batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens, "ppo_steps": args.ppo_steps,
                     "rm_pairs": args.rm_pairs, "rm_batch_size": args.rm_batch_size,
                     "rm_max_length": args.rm_max_length, "rm_steps": args.rm_steps, "threads": args.threads,
                     "ours_precision": precisions, "ours_reward_feature": args.ours_reward_feature},
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
    }
    if runs["trl_ppo"]:
        ppo = {side: {"step_s": median_of(runs[f"{side}_ppo"], "step_s"),
                      "step_s_min": median_of(runs[f"{side}_ppo"], "step_s_min"),
                      "peak_rss_mb": median_of(runs[f"{side}_ppo"], "peak_rss_mb")} for side in (*ours_sides, "trl")}
        for side in ours_sides:
            for key in ("generate_s", "score_s", "update_s"):
                ppo[side][key] = median_of(runs[f"{side}_ppo"], key)
            suffix = side.removeprefix("ours")
            ppo[f"speedup{suffix}"] = ratio(ppo["trl"]["step_s"], ppo[side]["step_s"])
            ppo[f"speedup_min{suffix}"] = ratio(ppo["trl"]["step_s_min"], ppo[side]["step_s_min"])
            ppo[f"memory_ratio{suffix}"] = ratio(ppo[side]["peak_rss_mb"], ppo["trl"]["peak_rss_mb"])
        summary["ppo"] = ppo
    if runs["trl_reward"]:
        reward = {side: {key: median_of(runs[f"{side}_reward"], key)
                         for key in ("pairs_per_s", "peak_rss_mb", "heldout_accuracy", "n_train", "n_heldout", "steps")}
                  for side in (*ours_sides, "trl")}
        for side in ours_sides:
            suffix = side.removeprefix("ours")
            reward[f"speedup{suffix}"] = ratio(reward[side]["pairs_per_s"], reward["trl"]["pairs_per_s"])
            reward[f"memory_ratio{suffix}"] = ratio(reward[side]["peak_rss_mb"], reward["trl"]["peak_rss_mb"])
        summary["reward"] = reward
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
