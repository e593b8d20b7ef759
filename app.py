"""rlhf-loop: people rank pairs in a browser, a reward model learns their votes, PPO moves the policy.

This file only parses the command line and dispatches; the work lives in `annotate/` and `rlhf/`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

DEFAULT_DB = "data/rlhf-loop.db"

# Each command: (flag, metavar or None, one-line help, "module:function" or None while it is not built yet).
COMMANDS = [
    ("--serve", None, "start the annotation app in the browser (the default when no command is given)",
     "annotate.serve:main"),
    ("--import-prompts", "FILE", "import prompts from JSONL, CSV, plain text or a Hugging Face dataset folder",
     "annotate.cli:import_prompts"),
    ("--generate-pairs", "N", "generate N pairs from the current policy for annotation",
     "annotate.pairs:command_generate_pairs"),
    ("--export", "FILE", "export preferences (prompt, chosen, rejected) to .jsonl or .parquet",
     "annotate.cli:export"),
    ("--simulate", "ANNOTATOR", "vote on waiting pairs with a simulated annotator (rule or module:function)",
     "annotate.cli:simulate"),
    ("--sft", "FILE", "supervised fine-tuning on a JSONL of prompt/response, or on annotators' demonstrations",
     "rlhf.sft:command_sft"),
    ("--train-reward", None, "train the reward model on the votes (or --data FILE) and print held-out accuracy",
     "rlhf.reward_train:command_train_reward"),
    ("--train-ppo", None, "run PPO alone with a given reward model and prompts, and save the actor",
     "rlhf.ppo_train:command_train_ppo"),
    ("--train-round", None, "run one full round: reward model, PPO, new policy, next pairs",
     "rlhf.round_cli:command_train_round"),
    ("--demo-loop", None, "simulate votes and run rounds R times headless, printing progress per round",
     "rlhf.round_cli:command_demo_loop"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="app.py",
        description="rlhf-loop: close the RLHF loop on one machine. With no command, starts the annotation app.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n"
               "  python app.py                          # annotation app on http://127.0.0.1:7860\n"
               "  python app.py --import-prompts my.jsonl\n"
               "  python app.py --train-round            # one round headless (cron, a GPU box)\n"
               "  accelerate launch app.py --train-round # the same on several GPUs",
    )
    commands = parser.add_argument_group("commands (pick one)").add_mutually_exclusive_group()
    for flag, metavar, help_text, target in COMMANDS:
        suffix = "" if target else " [not available yet]"
        if metavar is None:
            commands.add_argument(flag, action="store_true", help=help_text + suffix)
        elif flag == "--sft":
            commands.add_argument(flag, nargs="?", const="", metavar=metavar, help=help_text + suffix)
        else:
            commands.add_argument(flag, metavar=metavar, help=help_text + suffix)

    common = parser.add_argument_group("common options")
    common.add_argument("--db", default=DEFAULT_DB, metavar="PATH", help=f"SQLite database (default {DEFAULT_DB})")
    common.add_argument("--model", default="default", metavar="NAME_OR_PATH",
                        help="base model: 'default' (embedded SmolLM2-135M-Instruct), a Hugging Face id or a folder")
    common.add_argument("--config", metavar="FILE",
                        help="loop configuration (TOML); default rlhf-loop.toml when it exists, else built-in defaults")
    common.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one configuration value, e.g. --set ppo.kl_ctl=0.05 (repeatable)")
    common.add_argument("--out", metavar="DIR",
                        help="where a training command saves its model (default data/checkpoints/<kind>-<timestamp>)")

    serve = parser.add_argument_group("annotation app")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    serve.add_argument("--share", action="store_true", help="create a public Gradio link (needs --auth)")
    serve.add_argument("--auth", metavar="FILE", help="file of name:password lines; required off localhost")
    serve.add_argument("--admin", action="append", default=[], metavar="NAME",
                       help="make NAME an admin (repeatable); the first person to sign in is admin otherwise")
    serve.add_argument("--first-batch", type=int, default=32, metavar="N",
                       help="pairs generated in the background on a first start with no pairs (default 32; 0: none)")
    serve.add_argument("--auto-round-every", type=int, default=0, metavar="N",
                       help="start a training round after every N new votes (default 0: off; also set in Admin)")
    simulated = parser.add_argument_group("simulated annotators (--simulate, --demo-loop)")
    simulated.add_argument("--rounds", type=int, default=3, metavar="R", help="rounds of --demo-loop (default 3)")
    simulated.add_argument("--annotator", default="polite", metavar="ANNOTATOR",
                           help="--demo-loop's simulated annotator and judge (default polite)")
    simulated.add_argument("--eval-prompts", type=int, default=32, metavar="N",
                           help="prompts kept out of training on which --demo-loop judges each policy (default 32)")
    simulated.add_argument("--eval-answers", type=int, default=1, metavar="K",
                           help="answers per evaluation prompt, each judged against the first policy's (default 1; "
                                "more narrow the win rate when the judge ties often)")
    simulated.add_argument("--votes", type=int, default=50, metavar="N", help="votes to cast (default 50)")
    simulated.add_argument("--noise", type=float, default=0.0, metavar="RATE",
                           help="share of a/b votes flipped, like disagreeing people (default 0)")
    simulated.add_argument("--annotator-name", metavar="NAME", help="name the votes are cast under (default sim:RULE)")
    simulated.add_argument("--overlap", type=int, default=1, metavar="K", help="annotators per pair (default 1)")
    simulated.add_argument("--seed", type=int, default=0, help="random seed (default 0)")

    reward = parser.add_argument_group("reward model (--train-reward)")
    reward.add_argument("--data", metavar="FILE",
                        help="train on this file instead of the votes: JSONL, Parquet or a Hugging Face dataset folder "
                             "with columns prompt, chosen, rejected (TRL's format)")
    reward.add_argument("--rm-warm-start", metavar="DIR",
                        help="continue from this saved reward model instead of starting from --model")
    reward.add_argument("--rm-epochs", type=int, metavar="N", help="passes over the training pairs (default 1)")
    reward.add_argument("--rm-lr", type=float, metavar="LR", help="peak learning rate (default 2e-5)")
    reward.add_argument("--rm-batch-size", type=int, metavar="N", help="pairs per forward pass (default 8)")
    reward.add_argument("--rm-grad-accum", type=int, metavar="N",
                        help="forward passes per optimizer step (default 1)")
    reward.add_argument("--rm-max-length", type=int, metavar="N",
                        help="tokens per prompt + answer; the prompt's start is cut first (default 512)")
    reward.add_argument("--rm-loss", choices=["divergence", "last_token"],
                        help="pairwise loss over the diverging positions (DeepSpeed-Chat, default) or on the "
                             "last token only (TRL)")
    reward.add_argument("--rm-margin", type=float, metavar="M", help="margin in the pairwise loss (default 0)")
    reward.add_argument("--rm-center-coef", type=float, metavar="C",
                        help="reward centering coefficient (default 0)")
    reward.add_argument("--rm-heldout-fraction", type=float, metavar="F",
                        help="share of pairs held out to measure accuracy (default 0.1)")
    reward.add_argument("--rm-seed", type=int, metavar="N", help="seed of the split, head and shuffling (default 0)")
    ppo = parser.add_argument_group("PPO (--train-ppo; the actor and reference are --model)")
    ppo.add_argument("--reward-model", metavar="DIR", help="reward model folder saved by --train-reward (required)")
    ppo.add_argument("--prompts", metavar="FILE",
                     help="prompts from this file (JSONL with a prompt or text field, CSV, txt) instead of the store")
    ppo.add_argument("--steps", type=int, metavar="N", help="PPO steps (default: one pass over the prompts)")
    ppo.add_argument("--lora", action="store_true",
                     help="train LoRA adapters; the reference is the actor with adapters disabled (one copy)")
    ppo.add_argument("--reference", metavar="DIR", help="frozen reference policy (default: --model)")
    ppo.add_argument("--ppo-batch-size", type=int, metavar="N", help="prompts per PPO step (default 8)")
    ppo.add_argument("--ppo-max-new-tokens", type=int, metavar="N", help="longest sampled answer (default 48)")
    pairs = parser.add_argument_group("generating pairs (--generate-pairs)")
    pairs.add_argument("--versus-share", type=float, default=0.0, metavar="F",
                       help="share of versus pairs: the current policy against the previous one (default 0)")
    pairs.add_argument("--max-new-tokens", type=int, metavar="N", help="longest answer in tokens (default 512)")
    pairs.add_argument("--temperature", type=float, metavar="T", help="sampling temperature (default 0.7)")
    sft = parser.add_argument_group("supervised fine-tuning (--sft)")
    sft.add_argument("--sft-epochs", type=int, metavar="N", help="passes over the examples (default 2)")
    sft.add_argument("--sft-lr", type=float, metavar="LR", help="peak learning rate (default 5e-5)")
    sft.add_argument("--sft-batch-size", type=int, metavar="N", help="examples per step (default 8)")
    return parser


def dispatch(args: argparse.Namespace) -> int:
    for flag, _metavar, _help, target in COMMANDS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is None or value is False:
            continue
        if target is None:
            print(f"app.py {flag}: this command is not available yet in this version of rlhf-loop.", file=sys.stderr)
            return 2
        return run_target(flag, target, args)
    flag, _metavar, _help, target = COMMANDS[0]  # no command: serve the app
    if target is None:
        print("app.py: the annotation app is not available yet in this version of rlhf-loop.", file=sys.stderr)
        return 2
    return run_target(flag, target, args)


def run_target(flag: str, target: str, args: argparse.Namespace) -> int:
    module_name, function_name = target.split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    return int(function(args) or 0)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rlhf.distributed import join_launched_processes

    join_launched_processes()  # under torchrun on CPU: one gloo group, not N lone trainers
    return dispatch(args)


if __name__ == "__main__":
    sys.exit(main())
