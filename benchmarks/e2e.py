"""End-to-end RL step throughput: the real ``fit`` at a benchmark shape, against its parts' benchmarks in one run.

The benchmark writes a config and a prompt file, runs ``python -m sc_lightning fit`` on them (the product's own
path: controller, colocated or Ray engine, data plane, Lightning's loop, refit, loggers) and reads the run's
``metrics.csv``. Each answer's length is fixed by the ``fixed_length`` environment
(``sc_lightning/rollout/envs/fixed_length.py``: a seeded lognormal, mean a quarter of ``--max-new-tokens``, clipped
to [max / 64, max], eos ignored); every prompt has ``--prompt-len`` tokens. Steps after the first ``--warmup`` give:

    tokens/s/GPU        NeMo-RL's figure: prompt + response tokens of the step / step wall time / GPUs
                        (``perf/tokens_per_s_per_gpu``, weighted by the steps' wall times)
    generated tok/s     response tokens / step wall time; "engine tok/s" the same over the generation split
    split               ``perf/split_{generation,logprob,train,refit,other}_s``: where each step's wall time went

**Orchestration efficiency** of the last step: the time its parts take in their own benchmarks, measured in this
process after the fit (``benchmarks/e2e_parts.py``), over the very same work, divided by the step's wall time in
the fit:

    generation   ``benchmarks/engine.py``'s ``engine_run``: a ``MegatronEngine`` configured as the fit's (batch
                 rows, context) answering the step's prompts with the step's lengths (the manager's sampling seeds
                 and the environment's draw reproduce them exactly)
    training     ``benchmarks/train_step.py``'s ``median_ms`` of one GRPO step (``PolicyUpdate``, the fit's
                 optimizer recipe and micro-batching) over rows of the step's lengths
    refit        ``benchmarks/refit.py``'s ``refit_s``: the colocated refit of the trainer's live parameters

Colocated, generation and training run one after the other, so efficiency = parts / step is the share of the step
the parts explain (the rest: orchestration). On a GPU it then prints the **generation's memory floor**: the bytes
the step's generation must read at least (the weights once per decode step of the parts' engine, and for every new
token its row's K/V up to its position, in the cache's dtype) over this GPU's copy bandwidth measured in the same run
(``benchmarks/decode_attention.py``'s ``copy_bandwidth``), the fraction of it the generation reached, and the
tokens/s/GPU the step would reach with its generation at that floor. The modes:

    colocated        one process, on-policy (lookahead 0): a step's generation, then its training
    colocated-async  one process, one step of lookahead: the next step's prompts decode beside this step's long tail,
                     stand down paused during the training and go on after the refit on the new weights (per-token
                     versions), so the engine's batch stays full; the figure can pass 100% (the tail it hid)
    async            the engine in a Ray actor, one step of lookahead: generation overlaps training, the figure can
                     pass 100%; at a GPU shape the actor runs on the node's last GPU and is refit over NCCL (split
                     placement: two GPUs at least), on the CPU it is refit by value; the refit benchmarked here is
                     the colocated one. ``--engine-gpus N`` puts a replica on each of the node's last N GPUs and
                     ``--trainer-devices M`` trains on M data-parallel ranks (the first GPUs; with ``--no-parts``):
                     tokens/s/GPU then counts all M + N
    actor-sync       the same actor on-policy (lookahead 0): the split placement's sync baseline, whose split gives
                     async's ideal overlap bound, (generation + training) / max(generation, training)

"engine tok/s" (response tokens over the generation split: the engine's rate while the trainer waits) is a colocated
figure. ``--no-parts`` skips the parts' benchmarks: to compare modes on the same work in less time.
``--profile-train`` profiles the fit's last training step and the parts' training benchmark on the same rows
(``benchmarks/step_profile.py``) and prints where each one's time went: the device's busy and idle time, the kernels,
the host's calls (the fit's figures then carry the profiler's overhead).

    python benchmarks/e2e.py --shape tiny                           # builtin:tiny on the CPU, about a minute
    python benchmarks/e2e.py --shape 1.26b --out /tmp/e2e           # one GPU: 512 completions, 256 + ~1K tokens
    python benchmarks/e2e.py --shape llama1b --mode colocated --steps 3
    python benchmarks/e2e.py --shape llama1b --mode colocated-async --steps 4 --no-parts
    python benchmarks/e2e.py --shape 1.26b --kv-cache-dtype fp8                 # half the K/V bytes
    python benchmarks/e2e.py --shape 1.26b --kv-cache-layout slots --engine-batch 128  # whole-context rows
    python benchmarks/e2e.py --shape 1.26b --steps 2 --profile-train   # why the fit trains slower than its benchmark
    python benchmarks/e2e.py --shape llama1b --mode async --trainer-devices 4 --engine-gpus 4 --no-parts  # 8 GPUs
    python benchmarks/e2e.py --shape 1.26b --mode async --config-only    # the fit's config, validated, nothing run
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from e2e_parts import components, report_efficiency, step_lengths  # benchmarks/*.py: the script's folder is on sys.path
from engine import add_kv_cache_options
from step_profile import format_summary

from sc_lightning.config import ConfigError, load_config
from sc_lightning.config.yaml_io import load_yaml_layers
from sc_lightning.trainer.perf import SPLIT

REPO = Path(__file__).resolve().parents[1]
FIT_PROFILE = "fit_train_profile.json"  # --profile-train: the fit's last training step's summary, in --out


@dataclass(frozen=True)
class Shape:
    """A benchmark shape: the model, the step's work and the settings that fit it on its device."""

    model: str
    prompt_len: int
    new_tokens: int  # the cap of the answer lengths (their mean is a quarter of it)
    completions: int  # per step
    generations: int  # per prompt
    engine_batch: int  # rows the engine decodes at once (with --kv-cache-layout slots, this many full contexts)
    micro_batch: int  # policy.train_micro_batch_size
    micro_batch_tokens: int | None  # policy.train_micro_batch_tokens
    device: str
    precision: str


SHAPES = {
    "tiny": Shape("builtin:tiny", 16, 32, 16, 4, 16, 16, None, "cpu", "fp32"),
    # colocated on one GPU: the paged KV cache takes 64-position blocks as rows grow (98 KB a position in bf16: 24
    # layers x 2 x 8 groups x 128 x 2 bytes), so all 512 rows decode at once in the memory left beside ~25 GB of bf16
    # weights, fp32 masters and AdamW state, and the engine's 2.5 GB replica (a slot row would hold 428 MB)
    "1.26b": Shape("builtin:bench-1.26b", 256, 4096, 512, 16, 512, 64, 16384, "cuda", "bf16"),
    # 32 KB a position (16 layers x 2 x 8 groups x 64 x 2 bytes)
    "llama1b": Shape("builtin:bench-llama1b", 256, 4096, 512, 16, 512, 64, 16384, "cuda", "bf16"),
}
MODES = ("colocated", "colocated-async", "async", "actor-sync")
COLOCATED_MODES = MODES[:2]  # the engine in the trainer's process
PROMPT_ALPHABET = "0123456789+-*="  # the character tokenizer's characters (one token each)


def write_prompts(path: Path, count: int, tokens: int, seed: int) -> None:
    """``count`` seeded JSONL prompts of ``tokens`` tokens each (bos + characters), answer "0"."""
    rng = random.Random(seed)
    with path.open("w") as out:
        for _ in range(count):
            text = "".join(rng.choice(PROMPT_ALPHABET) for _ in range(tokens - 1))
            out.write(json.dumps({"problem": text, "expected_answer": "0"}) + "\n")


def fit_config(shape: Shape, args: argparse.Namespace, prompts_file: Path, root: Path) -> dict[str, Any]:
    """The run's config: ``--steps`` RL steps of ``shape`` in ``--mode`` (module docstring)."""
    groups = shape.completions // shape.generations
    lookahead = 0 if args.mode in ("colocated", "actor-sync") else 1
    colocated = args.mode in COLOCATED_MODES
    placement: dict[str, Any] = {"enabled": colocated}
    if not colocated and shape.device == "cuda":  # an engine replica on each of the node's last --engine-gpus GPUs
        placement["resources"] = {"num_nodes": 1, "gpus_per_node": args.engine_gpus}
    trainer: dict[str, Any] = {
        "accelerator": "gpu" if shape.device == "cuda" else "cpu",
        "devices": args.trainer_devices,
        "log_every_n_steps": 1,
        "default_root_dir": str(root),
        "enable_progress_bar": False,
    }
    if args.profile_train:  # the benchmarks folder is on the fit's PYTHONPATH (run_fit)
        profile = {"path": str(root.parent / FIT_PROFILE), "step": args.steps - 1}
        trainer["callbacks"] = [{"class_path": "step_profile.StepProfile", "init_args": profile}]
    return {
        "trainer": trainer,
        "grpo": {
            "num_prompts_per_step": groups,
            "num_generations_per_prompt": shape.generations,
            "max_num_steps": args.steps,
            "seed": args.seed,
        },
        "policy": {
            "model_name": shape.model,
            "train_global_batch_size": shape.completions,
            "train_micro_batch_size": shape.micro_batch,
            "train_micro_batch_tokens": shape.micro_batch_tokens,
            "max_total_sequence_length": shape.prompt_len + shape.new_tokens,
            "precision": shape.precision,
            "optimizer": {"lr": 1.0e-6, "lr_decay_style": "constant", "weight_decay": 0.0},
            "generation": {
                "backend": "megatron",
                "max_new_tokens": shape.new_tokens,
                "temperature": 1.0,
                "colocated": placement,
                "mcore_generation_config": {
                    "max_batch_size": shape.engine_batch,
                    "kv_cache_dtype": args.kv_cache_dtype,
                    "kv_cache_layout": args.kv_cache_layout,
                },
            },
            "megatron_cfg": {"enabled": True},
        },
        "loss_fn": {"reference_policy_kl_penalty": 0.0, "use_importance_sampling_correction": True},
        "async_rl": {
            "sampler": {"name": "in_order", "max_lookahead_versions": lookahead},
            "max_buffered_rollouts": groups * (lookahead + 1),
            "min_groups_for_streaming_train": groups,
            "max_inflight_prompts": groups * (lookahead + 1),
        },
        "data_plane": {  # several ranks read TransferQueue; one reads the memory plane in its process
            "enabled": True,
            "backend": "memory" if args.trainer_devices == 1 else "simple",
            "storage_capacity": 4 * shape.completions,
        },
        "checkpointing": {"enabled": False},
        "data": {
            "dataset_name": str(prompts_file),
            "max_prompt_length": shape.prompt_len,
            "shuffle": False,
        },
        "env": {"name": "fixed_length"},
    }


def run_fit(config_file: Path, log: Path, timeout_s: float) -> float:
    """Run ``python -m sc_lightning fit`` on ``config_file`` (output to ``log``); its seconds. Exits on failure."""
    command = [sys.executable, "-m", "sc_lightning", "fit", "--config", str(config_file)]
    env = dict(os.environ)
    paths = [str(REPO), str(REPO / "benchmarks"), env.get("PYTHONPATH")]  # this checkout first; step_profile
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    started = time.perf_counter()
    with log.open("w") as out:
        try:
            result = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            sys.exit(f"error: the fit ran past --fit-timeout {timeout_s:.0f} s; its output: {log}")
    if result.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        sys.exit(f"error: the fit exited with {result.returncode}; the end of {log}:\n{tail}")
    return time.perf_counter() - started


def read_steps(root: Path) -> list[dict[str, float]]:
    """The run's per-step rows of ``metrics.csv``, as numbers."""
    (path,) = root.glob("lightning_logs/version_*/metrics.csv")
    with path.open() as handle:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(handle)]


def summarise(rows: list[dict[str, float]]) -> dict[str, float]:
    """Throughput and the mean split over ``rows`` (the measured steps)."""
    wall = sum(r["timing/train/total_step_time"] for r in rows)
    generated = sum(r["perf/step_generated_tokens"] for r in rows)
    summary = {
        "steps": len(rows),
        "step_s": wall / len(rows),
        "tokens_per_s_per_gpu": sum(r["perf/tokens_per_s_per_gpu"] * r["timing/train/total_step_time"] for r in rows)
        / wall,
        "generated_tokens_per_s": generated / wall,
        "engine_tokens_per_s": generated / max(sum(r["perf/split_generation_s"] for r in rows), 1e-9),  # colocated
        "step_tokens": sum(r["perf/step_tokens"] for r in rows) / len(rows),
    }
    summary |= {f"split_{p}_s": sum(r[f"perf/split_{p}_s"] for r in rows) / len(rows) for p in SPLIT}
    if all("perf/mfu" in r for r in rows):
        summary["train_mfu"] = sum(r["perf/mfu"] for r in rows) / len(rows)
    if all("perf/alloc_retries" in r for r in rows):  # on a GPU: the caching allocator ran short of memory
        summary["alloc_retries"] = sum(r["perf/alloc_retries"] for r in rows)
    if all("train/token_mult_prob_error" in r for r in rows):  # the engine's logprobs against the trainer's
        summary["token_mult_prob_error"] = sum(r["train/token_mult_prob_error"] for r in rows) / len(rows)
    steps = sum(r.get("perf/decode_steps", 0.0) for r in rows)  # async: a step's window may hold no decode step
    if steps > 0:  # the engine's batch: rows decoding together, against its KV rows
        summary["decode_rows_mean"] = sum(r["perf/decode_rows_mean"] * r["perf/decode_steps"] for r in rows) / steps
        summary["decode_slots"] = rows[-1]["perf/decode_slots"]
        summary["decode_preemptions"] = sum(r.get("perf/decode_preemptions", 0.0) for r in rows)
        summary["decode_graph_captures"] = sum(r.get("perf/decode_graph_captures", 0.0) for r in rows)
        summary["decode_graph_capture_s"] = sum(r.get("perf/decode_graph_capture_s", 0.0) for r in rows)
    return summary


def report_throughput(args: argparse.Namespace, shape: Shape, summary: dict[str, float]) -> None:
    """Print the measured steps' throughput table and their mean split."""
    wall = summary["step_s"]
    print(
        f"\ne2e {args.shape} ({shape.model}, {shape.precision} on {shape.device}, KV cache {args.kv_cache_dtype} "
        f"{args.kv_cache_layout}), "
        f"mode {args.mode}: "
        f"{shape.completions} completions a step ({shape.completions // shape.generations} prompts x "
        f"{shape.generations}), prompt {shape.prompt_len} + answers of mean ~{shape.new_tokens // 4} "
        f"(max {shape.new_tokens}); {summary['steps']:.0f} measured steps after {args.warmup} warm-up"
    )
    print("| step s | tokens/step | tokens/s/GPU | generated tok/s | engine tok/s | train MFU |")
    print("|---:|---:|---:|---:|---:|---:|")
    mfu = f"{summary['train_mfu']:.1%}" if "train_mfu" in summary else "-"
    engine = f"{summary['engine_tokens_per_s']:,.0f}" if args.mode != "async" else "- (overlapped)"
    print(
        f"| {wall:.2f} | {summary['step_tokens']:,.0f} | {summary['tokens_per_s_per_gpu']:,.0f} "
        f"| {summary['generated_tokens_per_s']:,.0f} | {engine} | {mfu} |"
    )
    print("\nsplit of the mean step (perf/split_*_s):")
    print("| " + " | ".join(SPLIT) + " |\n|" + "---:|" * len(SPLIT))
    cells = [f"{summary[f'split_{p}_s']:.2f} s ({summary[f'split_{p}_s'] / wall:.0%})" for p in SPLIT]
    print("| " + " | ".join(cells) + " |", flush=True)
    if "decode_rows_mean" in summary:
        rows, slots = summary["decode_rows_mean"], summary["decode_slots"]
        fill = f" ({rows / slots:.0%} of its {slots:.0f} KV rows)" if slots else ""
        print(f"the engine decoded {rows:.1f} rows at a time on average{fill} (perf/decode_rows_mean)", flush=True)
        if args.kv_cache_layout == "paged":
            print(
                f"{summary['decode_preemptions']:.0f} rows preempted for want of KV blocks in the measured steps "
                "(perf/decode_preemptions)",
                flush=True,
            )
        if summary["decode_graph_captures"]:  # on a GPU: a stand-down frees the graphs, a wake captures them again
            steps = summary["steps"]
            print(
                f"the engine captured {summary['decode_graph_captures'] / steps:.0f} decode shapes as CUDA graphs a "
                f"step, {summary['decode_graph_capture_s'] / steps:.2f} s of host time a step "
                "(perf/decode_graph_captures, perf/decode_graph_capture_s)",
                flush=True,
            )
    if "alloc_retries" in summary:
        print(
            f"the allocator retried {summary['alloc_retries']:.0f} times in the measured training steps (0: memory "
            "never ran short; perf/alloc_retries)",
            flush=True,
        )
    if "token_mult_prob_error" in summary:
        error = summary["token_mult_prob_error"]
        print(f"engine vs trainer logprobs: train/token_mult_prob_error {error:.4f} (1 = the same)", flush=True)


def main() -> None:
    """Command line: run the fit, read its metrics, time the last step's parts, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="tiny")
    parser.add_argument("--mode", choices=MODES, default="colocated")
    parser.add_argument(
        "--parts", action=argparse.BooleanOptionalAction, default=True, help="time the parts (orchestration efficiency)"
    )
    parser.add_argument("--steps", type=int, default=3, help="RL steps, warm-up included")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the figures")
    parser.add_argument("--completions", type=int, help="completions a step (default: the shape's)")
    parser.add_argument("--generations", type=int, help="completions a prompt (default: the shape's)")
    parser.add_argument("--prompt-len", type=int, help="tokens of every prompt (default: the shape's)")
    parser.add_argument("--max-new-tokens", type=int, help="the answer lengths' cap; their mean is a quarter")
    parser.add_argument("--engine-batch", type=int, help="rows the engine decodes at once (default: the shape's)")
    parser.add_argument("--device", help="cpu or cuda (default: the shape's)")
    parser.add_argument("--trainer-devices", type=int, default=1, help="the trainer's ranks (data-parallel)")
    parser.add_argument(
        "--engine-gpus", type=int, default=1, help="async / actor-sync on a GPU: engine replicas, one GPU each"
    )
    add_kv_cache_options(parser)
    parser.add_argument(
        "--profile-train", action="store_true", help="profile the fit's last training step and the parts' one"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--config-only", action="store_true", help="validate and print the fit's config; run nothing")
    parser.add_argument("--fit-timeout", type=float, default=480.0, help="seconds the fit may take")
    parser.add_argument("--out", type=Path, help="keep the run, its log and results.json here (default: a temp dir)")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup}): no step would be measured")
    if args.parts and (args.trainer_devices > 1 or args.engine_gpus > 1):
        parser.error("--trainer-devices / --engine-gpus above 1 need --no-parts: the parts' benchmarks are one GPU's")
    warnings.filterwarnings("ignore")
    shape = SHAPES[args.shape]
    overrides = {
        "completions": args.completions,
        "generations": args.generations,
        "prompt_len": args.prompt_len,
        "new_tokens": args.max_new_tokens,
        "engine_batch": args.engine_batch,
        "device": args.device,
    }
    shape = replace(shape, **{k: v for k, v in overrides.items() if v is not None})
    if shape.completions % shape.generations:
        parser.error(f"--completions ({shape.completions}) must be a multiple of --generations ({shape.generations})")
    out = args.out or Path(tempfile.mkdtemp(prefix="sc-e2e-"))
    out.mkdir(parents=True, exist_ok=True)
    prompts_file = out / "prompts.jsonl"
    write_prompts(prompts_file, shape.completions // shape.generations * (args.steps + 2), shape.prompt_len, args.seed)
    shutil.rmtree(out / "run", ignore_errors=True)  # a fresh run directory: one metrics.csv to read
    config_file = out / "e2e.yaml"
    config_file.write_text(yaml.safe_dump(fit_config(shape, args, prompts_file, out / "run"), sort_keys=False))
    try:  # before anything starts: a shape or option the product refuses is named now, not minutes into a fit
        config = load_config(load_yaml_layers([config_file]), extra_top_level=("trainer", "seed_everything"))
    except ConfigError as err:
        sys.exit(f"error: the fit's config ({config_file}) is invalid: {err}")
    if args.config_only:
        print(config_file.read_text(), end="")
        return
    print(f"fit: {config_file} (log {out / 'fit.log'})", flush=True)
    fit_s = run_fit(config_file, out / "fit.log", args.fit_timeout)
    rows = read_steps(out / "run")
    print(f"fit: {len(rows)} steps in {fit_s:.0f} s (start-up included)", flush=True)
    last, summary = rows[-1], summarise(rows[args.warmup :])
    report_throughput(args, shape, summary)  # first: the fit's figures stand even if the parts' benchmarks fail
    results: dict[str, Any] = {"summary": summary, "last_step": last}
    if args.profile_train:
        results["fit_train_profile"] = json.loads((out / FIT_PROFILE).read_text())
        print(format_summary(f"the fit's training step {last['step']:.0f}, profiled", results["fit_train_profile"]))
    (out / "results.json").write_text(json.dumps(results, indent=2))
    if not args.parts:
        return
    lengths = step_lengths(config, int(last["step"]))
    parts = components(config, shape.device, lengths, profile_train=args.profile_train)
    if "train_profile" in parts:
        print(format_summary("the parts' training step on the same rows, profiled", parts["train_profile"]))
    results |= {"components": parts, "efficiency": report_efficiency(last, parts), "answer_lengths": lengths}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
