"""PPO's generation under FSDP2: decoding with the plain copy of the actor against decoding with the sharded actor.

    CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 bench/fsdp2_generation.py
    ... bench/fsdp2_generation.py --model /tmp/tiny/llama --batch 8 --new-tokens 48 --repeats 3

rlhf.ppo.fsdp2 generates with `GatheredCopy`: a plain copy of the actor, refreshed from the shards once per rollout.
The other way is to decode with the sharded actor itself, every process stepping together (one sharded forward per
token on every rank, each all-gathering every decoder layer). Per process (gloo, CPU), the bench measures:
(a) `refreshed_from(sharded)`, full fine-tuning (every weight gathered) and LoRA (`add_lora`: the adapters alone);
(b) B prompts x T new tokens decoded with the copy (rlhf.decode.decode, greedy, no EOS: every row runs T steps);
(c) the same decoding through the sharded model (the lockstep), checked to write the same tokens as (b);
(d) the bytes the copy holds, this process's shard (at rest, and after (c): FSDP2 keeps the root's weights gathered
after a forward), and its VmRSS after (c) and peak RSS (VmHWM) at the end.
Each figure is the median of --repeats calls; each rank decodes its own prompts (bench/bench_prompts.py). Rank 0
prints the machine, a table and ONE JSON line at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere: the repository root first

import torch
import torch.distributed as dist

from bench.bench_prompts import PROMPTS
from bench.machine import describe_machine, machine_line
from rlhf.decode import EndTokens, decode
from rlhf.fsdp2 import device_mesh, shard
from rlhf.generate import encode_prompt, pad_sequences
from rlhf.models import load_causal_lm, load_tokenizer
from rlhf.ppo.config import PPOConfig
from rlhf.ppo.fsdp2 import GatheredCopy
from rlhf.ppo.train import add_lora
from rlhf.sampling import Sampling


def timed(call, repeats: int) -> tuple[float, object]:
    """(median seconds of `repeats` calls of `call()`, the last call's result); every rank starts each call together."""
    seconds, result = [], None
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        result = call()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


def tensor_bytes(tensors) -> int:
    """Bytes of `tensors`, each counted once (a tied LM head is the embedding); a DTensor counts this rank's shard."""
    unique = {id(t): t for t in tensors}.values()
    local = [t.to_local() if hasattr(t, "to_local") else t for t in unique]
    return sum(t.numel() * t.element_size() for t in local)


def rss_mib() -> tuple[float, float]:
    """(VmRSS now, VmHWM: the peak so far) of this process in MiB, from /proc/self/status (in KiB there)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def rank_prompts(tokenizer, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's `batch` prompts (chat template applied), left-padded: (B, P) ids and mask."""
    start = dist.get_rank() * batch
    ids = [encode_prompt(tokenizer, PROMPTS[(start + i) % len(PROMPTS)]) for i in range(batch)]
    return pad_sequences(ids, tokenizer.pad_token_id)


def measure(model, lora: bool, args, prompts, ends: EndTokens) -> dict:
    """Figures (a)-(d) of one actor: the copy taken before sharding, the model then sharded in place."""
    mesh = device_mesh(torch.device("cpu"))
    model.eval()
    gathered = GatheredCopy(model)
    sharded = shard(model, mesh)
    at_rest = tensor_bytes([*sharded.parameters(), *sharded.buffers()])  # 1/N of each unit, before any forward
    trained = {name for name, p in sharded.named_parameters() if p.requires_grad}
    sampling = Sampling(max_new_tokens=args.new_tokens, temperature=0.0, top_p=1.0, repetition_penalty=1.0)
    refresh_s, plain = timed(lambda: gathered.refreshed_from(sharded), args.repeats)
    copy_s, on_copy = timed(lambda: decode(plain, *prompts, sampling, ends).response, args.repeats)
    sharded_s, on_shards = timed(lambda: decode(sharded, *prompts, sampling, ends).response, args.repeats)
    rss_now, _ = rss_mib()
    return {
        "actor": "lora" if lora else "full", "refresh_s": refresh_s, "copy_decode_s": copy_s,
        "sharded_decode_s": sharded_s, "same_tokens": bool(torch.equal(on_copy, on_shards)),
        "tokens": list(on_copy.shape), "copy_bytes": tensor_bytes([*plain.parameters(), *plain.buffers()]),
        "shard_bytes": at_rest,  # after a no-grad forward FSDP2 keeps the root (embeddings, head) gathered:
        "shard_bytes_after_decode": tensor_bytes([*sharded.parameters(), *sharded.buffers()]),
        "gathered_bytes": tensor_bytes([p for name, p in plain.named_parameters() if name in trained]),
        "vmrss_mib": rss_now,
    }


def run_rank(args) -> list[dict]:
    """This rank's figures for the full actor, then (a fresh one) with LoRA adapters."""
    tokenizer = load_tokenizer(args.model)
    prompts = rank_prompts(tokenizer, args.batch)
    ends = EndTokens(eos_ids=(), pad_id=tokenizer.pad_token_id)  # no EOS: T steps on every row and rank
    rows = []
    for lora in (False, True):
        model = load_causal_lm(args.model, torch.float32, tokenizer)
        if lora:
            model = add_lora(model, PPOConfig(), causal_lm=True)
        rows.append({"rank": dist.get_rank(), **measure(model, lora, args, prompts, ends)})
        del model
        gc.collect()
    for row in rows:
        row["peak_rss_mib"] = rss_mib()[1]
    return rows


def summary(rows: list[dict]) -> dict:
    """Per actor kind, the slowest rank's seconds (the ranks step together) and the per-rollout ratio."""
    out = {}
    for kind in ("full", "lora"):
        mine = [r for r in rows if r["actor"] == kind]
        worst = {key: max(r[key] for r in mine) for key in ("refresh_s", "copy_decode_s", "sharded_decode_s")}
        copy_rollout = worst["refresh_s"] + worst["copy_decode_s"]
        mib = {key.replace("bytes", "mib"): mine[0][key] / 2**20
               for key in ("copy_bytes", "shard_bytes", "shard_bytes_after_decode", "gathered_bytes")}
        out[kind] = {**worst, "copy_rollout_s": copy_rollout,
                     "sharded_over_copy": worst["sharded_decode_s"] / copy_rollout,
                     "lockstep_extra_s": worst["sharded_decode_s"] - copy_rollout,
                     "same_tokens": all(r["same_tokens"] for r in mine), **mib}
    return out


def print_table(rows: list[dict], totals: dict) -> None:
    """One line per (actor, rank), then per actor the per-rollout comparison."""
    print(f"{'actor':<5} {'rank':>4} {'(a) refresh s':>13} {'(b) copy s':>10} {'(c) sharded s':>13} {'same':>5} "
          f"{'copy MiB':>8} {'shard MiB':>9} {'(after c)':>9} {'RSS MiB':>8} {'peak MiB':>8}")
    for r in rows:
        print(f"{r['actor']:<5} {r['rank']:>4} {r['refresh_s']:>13.3f} {r['copy_decode_s']:>10.3f} "
              f"{r['sharded_decode_s']:>13.3f} {str(r['same_tokens']):>5} {r['copy_bytes'] / 2**20:>8.1f} "
              f"{r['shard_bytes'] / 2**20:>9.1f} {r['shard_bytes_after_decode'] / 2**20:>9.1f} "
              f"{r['vmrss_mib']:>8.0f} {r['peak_rss_mib']:>8.0f}")
    for kind, t in totals.items():
        print(f"{kind}: a rollout with the copy (a)+(b) = {t['copy_rollout_s']:.3f} s, through the shards (c) = "
              f"{t['sharded_decode_s']:.3f} s: {t['sharded_over_copy']:.1f}x; the copy holds {t['copy_mib']:.1f} MiB "
              f"a process (refresh gathers {t['gathered_mib']:.1f} MiB); same tokens: {t['same_tokens']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help='"default" (SmolLM2-135M) or a model folder')
    parser.add_argument("--batch", type=int, default=8, help="prompts per process")
    parser.add_argument("--new-tokens", type=int, default=48, help="tokens decoded per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="calls per figure; the median is kept")
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    try:
        rows = run_rank(args)
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, rows)
    finally:
        dist.destroy_process_group()
    if int(rows[0]["rank"]) != 0:
        return 0
    rows = sorted((r for mine in everyone for r in mine), key=lambda r: (r["actor"] != "full", r["rank"]))
    machine = describe_machine()
    totals = summary(rows)
    print(machine_line(machine))
    print(f"{args.model}: {len(everyone)} processes, {args.batch} prompts x {args.new_tokens} new tokens each, greedy")
    print_table(rows, totals)
    print(json.dumps({"bench": "fsdp2_generation", "model": args.model, "processes": len(everyone),
                      "batch": args.batch, "new_tokens": args.new_tokens, "repeats": args.repeats,
                      "summary": totals, "ranks": rows, "machine": machine}))
    return 0 if all(t["same_tokens"] for t in totals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
