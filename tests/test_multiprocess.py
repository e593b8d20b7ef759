"""Every trainer under two real processes: reward model, SFT, PPO and a round, launched with torchrun.

`accelerate launch --num_processes 2 --cpu` starts a single process on these machines (accelerate's
multi-CPU path wants mpirun), so the test launches `torchrun --nproc_per_node 2`: two processes on gloo,
which the trainers' Accelerator joins as MULTI_CPU, exactly as under `accelerate launch` on GPUs.

Run as a script (by torchrun), this file is the driver: it records, per process, a digest of the weights
every optimizer trained, every model folder saved and every database opened, calls `app.main` with the
command line it was given, and writes what it saw to DIGEST_DIR/rank-N.json. The tests then check that
the two replicas hold bit-identical weights that differ from where they started (they trained, in step),
and that only rank 0 saved models and touched the database.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [f"Tell me something about the number {i}." for i in range(24)]

pytestmark = pytest.mark.slow  # each case starts two interpreters that load torch: ~20-60 s on 2 cores


# ----- the driver (runs inside each torchrun process) -----


def _weights_digest(parameters) -> str:
    """sha256 over the bytes of the parameters, in order: equal only when every weight is bit-identical."""
    import torch

    digest = hashlib.sha256()
    for parameter in parameters:
        parameter = parameter.detach()
        parameter = parameter.to_local() if hasattr(parameter, "to_local") else parameter  # FSDP2: this rank's shard
        digest.update(parameter.cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def _drive(digest_dir: Path, app_argv: list[str]) -> int:
    """Run `app.main(app_argv)` in this process, recording what it trained, saved and opened."""
    import torch
    from transformers import PreTrainedModel

    import app
    from annotate.store import Store
    from rlhf.reward.model import RewardModel

    optimizers: list[tuple[list, str]] = []  # (trained parameters, digest when the optimizer was made)
    saved: list[str] = []
    stores: list[str] = []

    original_optimizer_init = torch.optim.Optimizer.__init__

    def optimizer_init(self, params, *args, **kwargs):
        params = list(params)
        original_optimizer_init(self, params, *args, **kwargs)
        trained = [p for group in self.param_groups for p in group["params"]]
        optimizers.append((trained, _weights_digest(trained)))

    def recording(method, log):
        def wrapper(self, path, *args, **kwargs):
            log.append(str(path))
            return method(self, path, *args, **kwargs)
        return wrapper

    torch.optim.Optimizer.__init__ = optimizer_init
    histories: list[list[dict]] = []
    from rlhf.ppo import trainer as ppo_trainer

    original_train = ppo_trainer.PPOTrainer.train

    def train(self, *args, **kwargs):
        histories.append(original_train(self, *args, **kwargs))
        return histories[-1]

    ppo_trainer.PPOTrainer.train = train
    if os.environ.get("SAME_SEED_ON_EVERY_RANK"):  # every rank samples as rank 0 does (accelerate offsets the seed)
        from accelerate.utils import set_seed

        ppo_trainer.set_seed = lambda seed, device_specific=False: set_seed(seed)
    PreTrainedModel.save_pretrained = recording(PreTrainedModel.save_pretrained, saved)
    RewardModel.save_pretrained = recording(RewardModel.save_pretrained, saved)
    from peft import PeftModel

    PeftModel.save_pretrained = recording(PeftModel.save_pretrained, saved)  # a LoRA actor's adapters
    Store.__init__ = recording(Store.__init__, stores)

    code = app.main(app_argv)

    from accelerate.state import PartialState

    rank = PartialState().process_index
    report = {
        "rank": rank, "world_size": PartialState().num_processes, "exit_code": code,
        "trained": [{"before": before, "after": _weights_digest(params)} for params, before in optimizers],
        "saved": saved, "stores": stores,
        "history": [[{k: v for k, v in step.items() if isinstance(v, (int, float))} for step in h] for h in histories],
    }
    (digest_dir / f"rank-{rank}.json").write_text(json.dumps(report), encoding="utf-8")
    return code


# ----- helpers for the tests -----


def _torchrun(tmp_path: Path, app_argv: list[str], timeout: int = 600, processes: int = 2,
              env: dict | None = None) -> tuple[list[dict], str]:
    """Launch the driver on `processes` processes (1: a plain interpreter, no launcher); each rank's report (rank
    order) and what they printed (stdout + stderr)."""
    digest_dir = tmp_path / "digests"
    digest_dir.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT),
           "CUDA_VISIBLE_DEVICES": "", **(env or {})}  # CPU processes on gloo even on a GPU machine
    launcher = [] if processes == 1 else ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                          str(processes)]
    command = [sys.executable, *launcher, __file__, str(digest_dir), *app_argv]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    reports = [json.loads((digest_dir / f"rank-{rank}.json").read_text()) for rank in range(processes)]
    assert [r["world_size"] for r in reports] == [processes] * processes
    assert [r["exit_code"] for r in reports] == [0] * processes
    return reports, done.stdout + done.stderr


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def _assert_replicas_trained_in_step(reports: list[dict], n_trained: int) -> None:
    """Both ranks trained the same number of models, each moved from its start, to bit-identical weights."""
    first, second = reports
    assert len(first["trained"]) == len(second["trained"]) == n_trained
    for mine, theirs in zip(first["trained"], second["trained"]):
        assert mine["before"] == theirs["before"]  # same initialisation (seeded) on both
        assert mine["after"] != mine["before"]  # it trained
        assert mine["after"] == theirs["after"]  # ... and the gradients were averaged across the processes


def _assert_only_rank_zero_wrote(reports: list[dict]) -> None:
    assert reports[0]["saved"], "rank 0 saved nothing"
    assert reports[1]["saved"] == [] and reports[1]["stores"] == []


def _preference_file(path: Path, n_pairs: int) -> Path:
    sys.path.insert(0, str(ROOT))
    from bench.synthetic_prefs import synthetic_preferences

    pairs = synthetic_preferences(n_pairs, seed=0)
    path.write_text("".join(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n"
                            for p in pairs), encoding="utf-8")
    return path


# ----- the tests -----


def _saved_weights(folder: Path) -> dict:
    """Every safetensors file's tensors in `folder`, keyed file/name."""
    from safetensors.torch import load_file

    return {f"{file.name}/{key}": tensor for file in sorted(folder.glob("*.safetensors"))
            for key, tensor in load_file(str(file)).items()}


def _assert_same_weights(mine: dict, theirs: dict, start: dict | None = None) -> None:
    """`mine` equals `theirs` to 1e-5 (fp32), and moved from `start` where given (it trained)."""
    import torch

    assert mine.keys() == theirs.keys()
    assert [k for k in mine if not torch.allclose(mine[k], theirs[k], atol=1e-5)] == []
    if start is not None:
        assert any(not torch.equal(mine[k], start[k]) for k in mine if k in start)


def _engine_runs(tmp_path: Path, argv: Callable[[Path], list[str]], section: str) -> dict[str, tuple]:
    """`argv(folder)` on two processes under `{section}.engine` ddp and then fsdp2, in fp32 where the section has
    a precision: {engine: (folder, reports, printed)}."""
    runs = {}
    for engine in ("ddp", "fsdp2"):
        folder = tmp_path / engine
        folder.mkdir()
        settings = [f"{section}.engine={engine}"] + ([f"{section}.mixed_precision=no"] if section == "reward" else [])
        runs[engine] = (folder, *_torchrun(folder, [*argv(folder), *[a for s in settings for a in ("--set", s)]]))
    return runs


def test_reward_model_training_under_two_processes_ddp_and_fsdp2(tmp_path, tiny_model_dir):
    """DDP: replicas in step, rank 0 alone writes. FSDP2 (reward.engine = fsdp2): each rank trains its own half, and
    the saved model and its training metrics equal DDP's on the same batches (1e-5, fp32)."""
    data = _preference_file(tmp_path / "prefs.jsonl", 24)
    runs = _engine_runs(tmp_path, lambda folder: [
        "--train-reward", "--data", str(data), "--model", str(tiny_model_dir), "--out", str(folder / "rm"),
        "--rm-batch-size", "4", "--rm-max-length", "64", "--rm-heldout-fraction", "0.25", "--rm-lr", "1e-3"],
        "reward")
    (ddp_folder, ddp, printed), (fsdp2_folder, fsdp2, fsdp2_printed) = runs["ddp"], runs["fsdp2"]
    _assert_replicas_trained_in_step(ddp, n_trained=1)
    _assert_only_rank_zero_wrote(ddp)
    _assert_only_rank_zero_wrote(fsdp2)
    for text in (printed, fsdp2_printed):
        assert text.count("Training the reward model on 24") == text.count("Reward model saved to") == 1
    assert fsdp2[0]["trained"][0]["after"] != fsdp2[1]["trained"][0]["after"]  # shards, not replicas
    _assert_same_weights(_saved_weights(fsdp2_folder / "rm"), _saved_weights(ddp_folder / "rm"))  # DDP's trained
    metrics = {engine: json.loads((folder / "rm" / "reward_model.json").read_text())["info"]["training"]["metrics"]
               for engine, (folder, _, _) in runs.items()}
    for key in ("rm/loss", "rm/accuracy", "rm/heldout_loss", "rm/heldout_accuracy", "rm/steps"):
        assert metrics["fsdp2"][key] == pytest.approx(metrics["ddp"][key], abs=1e-5), key


def test_sft_under_two_processes_ddp_and_fsdp2_records_one_policy(tmp_path, tiny_model_dir):
    """DDP: replicas in step; under either engine one policy recorded, rank 0 alone saves, and FSDP2's saved model (a
    plain causal LM folder) equals DDP's to 1e-5."""
    from annotate.store import Store

    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps({"prompt": p, "response": f"The number is {i}."}) + "\n"
                             for i, p in enumerate(PROMPTS[:8])), encoding="utf-8")

    def argv(folder: Path) -> list[str]:
        Store(folder / "loop.db").close()  # an existing database, as after the app's first start
        return ["--sft", str(demos), "--model", str(tiny_model_dir), "--db", str(folder / "loop.db"),
                "--out", str(folder / "sft"), "--sft-batch-size", "4"]

    runs = _engine_runs(tmp_path, argv, "sft")
    _assert_replicas_trained_in_step(runs["ddp"][1], n_trained=1)
    for folder, reports, printed in runs.values():
        assert reports[1]["saved"] == []  # (rank 1 opens the store too, to read demonstrations when there is no file)
        with Store(folder / "loop.db") as store:
            assert [(p.round, p.path) for p in store.policies()][1:] == [(0, str(folder / "sft"))]
        assert printed.count("SFT of ") == printed.count("SFT done") == 1
        config = json.loads((folder / "sft" / "config.json").read_text())
        assert config["architectures"] == json.loads((tiny_model_dir / "config.json").read_text())["architectures"]
    _assert_same_weights(_saved_weights(runs["fsdp2"][0] / "sft"), _saved_weights(runs["ddp"][0] / "sft"),
                         _saved_weights(tiny_model_dir))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_ppo_under_two_processes(tmp_path, tiny_model_dir, lora):
    """Full PPO and LoRA PPO (the adapters alone trained, saved in peft's format) train in step on two processes."""
    import torch

    from rlhf.models import load_tokenizer
    from rlhf.reward.model import RewardModel

    torch.manual_seed(0)
    reward_dir = RewardModel.from_causal_lm(tiny_model_dir).save_pretrained(
        tmp_path / "rm", tokenizer=load_tokenizer(tiny_model_dir))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:8]), encoding="utf-8")
    reports, _ = _torchrun(tmp_path, [
        "--train-ppo", "--model", str(tiny_model_dir), "--reward-model", str(reward_dir), "--prompts", str(prompts),
        "--steps", "1", "--out", str(tmp_path / "actor"), "--db", str(tmp_path / "none.db"),
        *(["--set", "ppo.use_lora=true"] if lora else [])])
    _assert_replicas_trained_in_step(reports, n_trained=2)  # the actor and the critic
    _assert_only_rank_zero_wrote(reports)
    saved = "adapter_model.safetensors" if lora else "model.safetensors"
    assert (tmp_path / "actor" / saved).is_file()
    assert (tmp_path / "actor" / "model.safetensors").exists() != lora  # a LoRA run saves no whole model
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_an_fsdp2_ppo_step_equals_the_single_process_step(tmp_path, tiny_model_dir, lora):
    """ppo.engine = fsdp2 on two processes that get the same prompt and sample alike: the gradients FSDP2 averages are
    the one process's, so the saved actor (LoRA: its adapters) and the step's losses equal a single process's step
    (1e-5, fp32)."""
    import torch

    from rlhf.models import load_tokenizer
    from rlhf.reward.model import RewardModel

    torch.manual_seed(0)
    reward_dir = RewardModel.from_causal_lm(tiny_model_dir).save_pretrained(
        tmp_path / "rm", tokenizer=load_tokenizer(tiny_model_dir))
    runs = {}
    for name, processes, engine in (("single", 1, "ddp"), ("fsdp2", 2, "fsdp2")):
        folder = tmp_path / name
        folder.mkdir()
        prompts = folder / "prompts.jsonl"
        prompts.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n", encoding="utf-8")  # one per process
        if processes == 2:
            prompts.write_text((json.dumps({"prompt": PROMPTS[0]}) + "\n") * 2, encoding="utf-8")
        reports, _ = _torchrun(folder, [
            "--train-ppo", "--model", str(tiny_model_dir), "--reward-model", str(reward_dir), "--prompts",
            str(prompts), "--steps", "1", "--out", str(folder / "actor"), "--db", str(folder / "none.db"),
            *[arg for s in ("ppo.batch_size=1", "ppo.mini_batch_size=1", "ppo.mixed_precision=no",
                            f"ppo.engine={engine}", f"ppo.use_lora={str(lora).lower()}") for arg in ("--set", s)]],
            processes=processes, env={"SAME_SEED_ON_EVERY_RANK": "1"})
        runs[name] = reports
    single, sharded = runs["single"][0], runs["fsdp2"]
    assert sharded[1]["saved"] == [] and sharded[1]["stores"] == []  # rank 0 alone saves
    assert len(sharded[0]["trained"]) == 2  # actor and critic, each rank holding its own half (not DDP's replicas)
    assert all(a["after"] != b["after"] for a, b in zip(sharded[0]["trained"], sharded[1]["trained"]))
    for key in ("ppo/policy_loss", "ppo/value_loss", "ppo/kl", "ppo/score", "ppo/response_len"):
        assert sharded[0]["history"][0][0][key] == pytest.approx(single["history"][0][0][key], abs=1e-5), key
    assert all(trained["after"] != trained["before"] for trained in single["trained"])  # the step moved them
    assert (tmp_path / "fsdp2" / "actor" / "adapter_model.safetensors").is_file() == lora
    _assert_same_weights(_saved_weights(tmp_path / "fsdp2" / "actor"), _saved_weights(tmp_path / "single" / "actor"))


@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
def test_a_round_under_two_processes_records_one_round_and_one_policy(tmp_path, tiny_model_dir, engine):
    from annotate.store import Store
    from test_round import seed_votes, tiny_settings

    db = tmp_path / "loop.db"
    seed_votes(db, tiny_model_dir)
    # mean@1: the reward model and the critic PPO starts from keep 1 of the tiny model's 2 layers, so the
    # truncated decoder (final norm as pass-through buffers) is what DDP wraps and keeps in step
    settings = [arg for setting in [*tiny_settings(tmp_path), "votes.feature=mean@1", f"ppo.engine={engine}"]
                for arg in ("--set", setting)]
    reports, printed = _torchrun(tmp_path, ["--train-round", "--db", str(db), "--model", str(tiny_model_dir), *settings])
    if engine == "ddp":
        _assert_replicas_trained_in_step(reports, n_trained=2)  # actor and critic; the few-votes head needs no optimizer
    else:  # each rank trained its own shard of actor and critic
        assert [len(r["trained"]) for r in reports] == [2, 2]
        assert all(a["before"] != a["after"] != b["after"] for a, b in zip(*(r["trained"] for r in reports)))
    _assert_only_rank_zero_wrote(reports)
    with Store(db) as store:
        assert [p.round for p in store.policies()] == [0, 1]
        assert [r.status for r in store.rounds()] == ["done"]
        round_dir = tmp_path / "checkpoints" / db.stem / f"round-{store.rounds()[0].id}"
    assert sorted(path.name for path in round_dir.iterdir()) == ["policy", "reward"]
    saved = json.loads((round_dir / "reward" / "reward_model.json").read_text())
    assert (saved["pooling"], saved["layer"]) == ("mean", 1)
    assert printed.count("training the reward model (") == printed.count("generating 6 pairs") == 1



def test_a_killed_fsdp2_round_leaves_the_database_consistent_and_the_next_one_resumes(tmp_path, tiny_model_dir):
    """Both processes of an FSDP2 round killed in the middle of PPO: the round is left running in the store, and the
    next FSDP2 round marks it failed, reuses the reward model it had saved and records one policy."""
    import signal
    import time

    from annotate.store import Store
    from test_round import seed_votes, tiny_settings

    db = tmp_path / "crash.db"
    seed_votes(db, tiny_model_dir)

    def argv(ppo_steps: int) -> list[str]:
        settings = [*tiny_settings(tmp_path, ppo_steps=ppo_steps), "votes.feature=mean@1", "ppo.engine=fsdp2"]
        return ["--train-round", "--db", str(db), "--model", str(tiny_model_dir),
                *[arg for setting in settings for arg in ("--set", setting)]]

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT),
           "CUDA_VISIBLE_DEVICES": ""}
    launched = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                 "2", str(ROOT / "app.py"), *argv(400)], cwd=tmp_path, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    store = Store(db)
    try:
        deadline = time.time() + 300
        while not ((running := store.running_round()) and running.metrics.get("history")):  # in PPO, RM saved
            assert launched.poll() is None, "the round ended before it could be killed"
            assert time.time() < deadline, "the round never reached PPO"
            time.sleep(0.2)
    finally:  # the ranks first (torchrun starts each in its own session), then the launcher
        for pid in [*_children(launched.pid), launched.pid]:
            os.kill(pid, signal.SIGKILL)
        launched.wait()
    assert store.running_round() is not None  # what a crash leaves behind
    reports, _ = _torchrun(tmp_path, argv(1))
    _assert_only_rank_zero_wrote(reports)
    rounds = store.rounds()
    assert [r.status for r in rounds] == ["failed", "done"]
    assert rounds[1].metrics["round/reward_model_path"] == rounds[0].metrics["round/reward_model_path"]
    assert [p.round for p in store.policies()] == [0, 1]
    store.close()

if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(_drive(Path(sys.argv[1]), sys.argv[2:]))
