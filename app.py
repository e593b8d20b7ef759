"""rlhf-loop: people rank pairs in a browser, a reward model learns their votes, PPO moves the policy.

This file only parses the command line, builds the one configuration (loop.config_files) and dispatches to a
command of the `commands/` layer.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Each command: (flag, metavar or None (a tuple: that many values), one-line help, "module:function" taking
# (args, config)).
COMMANDS = [
    ("--serve", None, "start the annotation app in the browser (the default when no command is given)",
     "commands.serve:serve"),
    ("--import-prompts", "FILE", "import prompts from JSONL, CSV, plain text or a Hugging Face dataset folder",
     "commands.data:import_prompts"),
    ("--generate-pairs", "N", "generate N pairs from the current policy for annotation",
     "commands.pairs:generate_pairs"),
    ("--export", "FILE", "export preferences (prompt, chosen, rejected) to .jsonl or .parquet",
     "commands.data:export"),
    ("--simulate", "ANNOTATOR", "vote on waiting pairs with a simulated annotator (rule or module:function), or "
     "'team' with --team SPEC", "commands.data:simulate"),
    ("--sft", "FILE", "supervised fine-tuning on a JSONL of prompt/response, or on annotators' demonstrations",
     "commands.train:sft"),
    ("--train-reward", None, "train the reward model on the votes (or --data FILE) and print held-out accuracy",
     "commands.train:train_reward"),
    ("--train-ppo", None, "run PPO alone with a given reward model and prompts, and save the actor",
     "commands.train:train_ppo"),
    ("--train-round", None, "run one full round: reward model, PPO, new policy, next pairs",
     "commands.round:train_round"),
    ("--demo-loop", None, "simulate votes and run rounds R times headless, printing progress per round",
     "commands.round:demo_loop"),
    ("--report", "ROUND", "write the report of round ROUND as one HTML file: before/after answers, scores, votes, "
     "settings, seconds", "commands.report:report"),
    ("--prune", None, "delete the checkpoint folders round.keep_policies does not keep, listing each with its size "
     "and why it is kept (--dry-run: list only)", "commands.prune:prune"),
    ("--backup", "DIR", "copy the database (--db) and every checkpoint folder it names into the new folder DIR, "
     "with a manifest; safe while the app and a round run", "commands.backup:backup"),
    ("--restore", "DIR", "put a --backup DIR back at --db (which must not exist), its checkpoints under "
     "round.checkpoints_dir, the recorded paths rewritten; refused while the app or a round runs there",
     "commands.backup:restore"),
    ("--annotators", None, "the people table in the terminal: votes, left picks, agreement, median seconds, "
     "Dawid-Skene accuracy, who is excluded", "commands.annotators:annotators"),
    ("--exclude", "NAME", "leave NAME's votes out of the next rounds and of promotion (they stay in the database)",
     "commands.annotators:exclude"),
    ("--include", "NAME", "count NAME's votes again after --exclude", "commands.annotators:include"),
    ("--gold", ("PAIR", "SIDE"), "mark pair PAIR's right answer (SIDE a or b; none: an ordinary pair again): gold "
     "pairs measure each annotator's gold accuracy ([app] gold_share mixes them into the queues)",
     "commands.annotators:gold"),
    ("--policies", None, "list the policies of --db: round, parent, promoted or a candidate and why (the current "
     "one starred)", "commands.promotion:list_policies"),
    ("--promotion", ("POLICY", "ACTION"), "an admin's decision on policy POLICY: promote or reject it whatever the "
     "evidence, or auto to let the evidence decide again", "commands.promotion:promotion"),
    ("--plan", None, "the memory per GPU of a round's PPO under DDP, LoRA and FSDP2, from the model's config alone "
     "(no weights load), with the engine to run and the largest ppo.batch_size that fits (--gpus, --gpu-memory, "
     "--json)", "commands.plan:plan"),
    ("--merge", ("SOURCE", "OUT"), "merge a LoRA round's policy (SOURCE: its folder of adapters, or a policy id of "
     "--db) into its base model, saved as a whole model in the new folder OUT (safetensors, tokenizer, "
     "generation_config.json) that transformers loads alone, to publish it", "commands.merge:merge"),
    ("--show-config", None, "print the configuration every command would use here, as TOML",
     "commands.data:show_config"),
    ("--add-user", "NAME", "set NAME's password in the auth file (--auth FILE, default data/auth.txt) as a scrypt "
     "hash; asks for it twice, or reads a line from stdin", "commands.users:add_user"),
    ("--upgrade-auth", "FILE", "rewrite the plain-text passwords of an auth file as scrypt hashes (keeps FILE.bak)",
     "commands.users:upgrade_auth"),
]


def build_parser() -> argparse.ArgumentParser:
    from commands.flags import add_config_flags

    parser = argparse.ArgumentParser(
        prog="app.py",
        description="rlhf-loop: close the RLHF loop on one machine. With no command, starts the annotation app.\n"
                    "Settings: built-in defaults < rlhf-loop.toml < --config FILE < --set SECTION.KEY=VALUE < flags.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n"
               "  python app.py                          # annotation app on http://127.0.0.1:7860\n"
               "  python app.py --import-prompts my.jsonl\n"
               "  python app.py --train-round            # one round headless (cron, a GPU box)\n"
               "  python app.py --show-config            # every setting, as TOML\n"
               "  python app.py --merge data/checkpoints/loop/round-3/policy merged  # a LoRA policy, whole\n"
               "  python app.py --add-user ann --role admin  # a password for ann (then serve with --auth)\n"
               "  accelerate launch app.py --train-round # the same on several GPUs",
    )
    commands = parser.add_argument_group("commands (pick one)").add_mutually_exclusive_group()
    for flag, metavar, help_text, _target in COMMANDS:
        if metavar is None:
            commands.add_argument(flag, action="store_true", help=help_text)
        elif isinstance(metavar, tuple):
            commands.add_argument(flag, nargs=len(metavar), metavar=metavar, help=help_text)
        elif flag == "--sft":
            commands.add_argument(flag, nargs="?", const="", metavar=metavar, help=help_text)
        else:
            commands.add_argument(flag, metavar=metavar, help=help_text)

    settings = parser.add_argument_group("configuration")
    settings.add_argument("--config", metavar="FILE",
                          help="a TOML file of settings, read after rlhf-loop.toml (which is read when it exists)")
    settings.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                          help="override one setting, e.g. --set ppo.kl_ctl=0.05 (repeatable; --show-config lists "
                               "them all)")
    _add_input_flags(parser.add_argument_group("what a command works on"))
    add_config_flags(parser)
    return parser


def _add_input_flags(inputs) -> None:
    """The flags that say what a command works on (files, folders, the plan's machine)."""
    inputs.add_argument("--out", metavar="PATH",
                        help="where a training command saves its model (default data/checkpoints/<kind>-<timestamp>); "
                             "for --report, the HTML file (default <round.checkpoints_dir>/<db name>/round-N/"
                             "report.html)")
    inputs.add_argument("--data", metavar="FILE",
                        help="--train-reward on this file instead of the votes: JSONL, Parquet or a Hugging Face "
                             "dataset folder with columns prompt, chosen, rejected (TRL's format)")
    inputs.add_argument("--reward-model", metavar="DIR", help="--train-ppo: the reward model folder (required)")
    inputs.add_argument("--prompts", metavar="FILE",
                        help="--train-ppo: prompts from this file (JSONL with a prompt or text field, CSV, txt) "
                             "instead of the database")
    inputs.add_argument("--reference", metavar="DIR", help="--train-ppo: frozen reference policy (default: --model)")
    inputs.add_argument("--versus-share", type=float, default=0.0, metavar="F",
                        help="--generate-pairs: share of versus pairs, the current policy against the previous one "
                             "(default 0)")
    inputs.add_argument("--role", choices=["annotator", "admin"],
                        help="--add-user: also give NAME this role in the database (--db); --admin NAME instead "
                             "makes NAME admin each time the app starts")
    inputs.add_argument("--dry-run", action="store_true",
                        help="--prune: list what would be deleted and kept, and delete nothing")
    inputs.add_argument("--gpus", type=int, metavar="N",
                        help="--plan: processes (GPUs) to plan for (default: the launcher's WORLD_SIZE or the visible "
                             "GPUs, at least 1)")
    inputs.add_argument("--gpu-memory", type=float, metavar="GB",
                        help="--plan: memory of each GPU in GB (default: the first GPU's, or this machine's without "
                             "one)")
    inputs.add_argument("--json", action="store_true", help="--plan: print the plan as one JSON line")
    inputs.add_argument("--progress-lines", action="store_true",
                        help="--generate-pairs: print 'pairs-progress DONE TOTAL' lines (what the app reads)")


def dispatch(args: argparse.Namespace, config) -> int:
    chosen = [(flag, target) for flag, _metavar, _help, target in COMMANDS
              if getattr(args, flag.lstrip("-").replace("-", "_")) not in (None, False)]
    flag, target = chosen[0] if chosen else (COMMANDS[0][0], COMMANDS[0][3])  # no command: serve the app
    module_name, function_name = target.split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    return int(function(args, config) or 0)


def main(argv: list[str] | None = None) -> int:
    from loop.config_files import ConfigError
    from commands.flags import config_from_args

    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as error:
        print(f"app.py: {error}", file=sys.stderr)
        return 2
    from annotate.store import StoreOpenError
    from rlhf.distributed import join_launched_processes
    from rlhf.finite import NotFinite

    join_launched_processes()  # under torchrun on CPU: one gloo group, not N lone trainers (a no-op elsewhere)
    try:
        return dispatch(args, config)
    except StoreOpenError as error:  # every command's database: missing, not one, damaged, read-only, disk full
        print(f"app.py: {error}", file=sys.stderr)
        return 2
    except NotFinite as error:  # --train-ppo, --train-reward, --sft (a round says more: commands.round)
        print(f"app.py: training stopped: {error}", file=sys.stderr)
        return 5


if __name__ == "__main__":
    sys.exit(main())
