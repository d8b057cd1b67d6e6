"""builtin:tiny builds fast, trains (forward/backward), is seeded, and the process-global parallel state is guarded."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from sc_lightning.models.logprobs import token_logprobs
from sc_lightning.models.megatron import build_gpt_model, init_model_parallel, load_policy
from sc_lightning.models.spec import BUILTIN_SPECS, ModelSpec, builtin_spec
from sc_lightning.tokenizer import CharTokenizer, load_tokenizer
from tests.helpers.cli import user_environment
from tests.helpers.configs import REPO
from tests.helpers.models import random_ids

pytestmark = pytest.mark.usefixtures("model_parallel")


def test_builtin_tiny_builds_and_trains() -> None:
    """builtin:tiny builds with its character tokenizer, and three AdamW steps reach every parameter.

    Its speed is not a wall-clock assertion here (a loaded 2-core box took 1.05 s for a 20 ms step):
    benchmarks/ measures speed."""
    model, spec, tokenizer = load_policy("builtin:tiny", precision="fp32", seed=0)
    assert isinstance(tokenizer, CharTokenizer) and spec.vocab_size == tokenizer.vocab_size == 18
    ids = random_ids(16, 32, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        optimizer.zero_grad()
        loss = -token_logprobs(model, ids).mean()
        loss.backward()
        optimizer.step()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_seed_fixes_the_weights() -> None:
    spec = builtin_spec("builtin:tiny")
    a, b = build_gpt_model(spec, seed=1), build_gpt_model(spec, seed=1)
    c = build_gpt_model(spec, seed=2)
    state_a, state_b, state_c = a.state_dict(), b.state_dict(), c.state_dict()
    weights = [k for k in state_a if not k.endswith("_extra_state")]
    assert all(torch.equal(state_a[k], state_b[k]) for k in weights)
    assert not torch.equal(state_a["output_layer.weight"], state_c["output_layer.weight"])


def test_bf16_and_activation_checkpointing_build_and_run() -> None:
    spec = builtin_spec("builtin:tiny")
    ids = random_ids(2, 16, seed=3)
    bf16 = build_gpt_model(spec, precision="bf16", seed=0)
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())
    assert token_logprobs(bf16, ids).dtype == torch.float32

    plain = build_gpt_model(spec, seed=0)
    ckpt = build_gpt_model(spec, seed=0, activation_checkpointing=True)
    assert ckpt.config.recompute_granularity == "full"
    grads = []
    for model in (plain, ckpt):
        model.train()
        token_logprobs(model, ids).sum().backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.allclose(g1, g2, atol=1e-6) for g1, g2 in zip(*grads, strict=True))


def test_parallel_state_is_process_global_and_guarded() -> None:
    init_model_parallel(1)  # idempotent
    with pytest.raises(ValueError, match="already initialised"):
        init_model_parallel(2)


WORLD_OF_ONE = """
import os, socket
taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(taken.getsockname()[1]))
from sc_lightning.models.megatron_import import import_megatron_without_compile
import_megatron_without_compile()
import torch
from sc_lightning.models.megatron import init_model_parallel
init_model_parallel(1)
print(torch.distributed.get_world_size())
"""


@pytest.mark.slow  # a fresh interpreter importing megatron-core
def test_a_world_of_one_needs_no_port_even_where_master_port_is_taken() -> None:
    """A lone process (an engine actor, a single-device trainer) starts torch.distributed in memory: MASTER_PORT
    naming a port another socket holds, as a free port taken between probe and bind would be, does not stop it."""
    done = subprocess.run(
        [sys.executable, "-c", WORLD_OF_ONE], cwd=REPO, env=user_environment(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "1"


def test_unknown_builtin_and_bad_settings_are_clear_errors() -> None:
    with pytest.raises(KeyError, match="builtin:tiny"):
        load_policy("builtin:huge")
    with pytest.raises(ValueError, match="precision"):
        build_gpt_model(BUILTIN_SPECS["builtin:tiny"], precision="fp16")
    with pytest.raises(FileNotFoundError, match="local"):
        load_policy("sc-lightning-test/definitely-not-a-model")
    with pytest.raises(ValueError, match="num_query_groups"):
        ModelSpec(18, 64, 2, 4, 3, 128, 64)


@pytest.mark.parametrize("name", sorted(BUILTIN_SPECS))
def test_every_builtin_model_loads_with_the_char_tokenizer(name: str) -> None:
    spec = builtin_spec(name)
    tokenizer = load_tokenizer(name)
    assert isinstance(tokenizer, CharTokenizer)
    if name.startswith("builtin:bench-"):  # a real model's vocabulary: rows past the tokenizer's ids, never encoded
        assert tokenizer.vocab_size < spec.vocab_size
    else:
        assert tokenizer.vocab_size == spec.vocab_size
    spec.check_parallel()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # embeddings 2 x 32000 x 2048 = 131.1M; a layer: q + o 2 x 2048^2, k + v 2 x 2048 x 8 x 128, SwiGLU
        # 3 x 2048 x 5632, two norms 2 x 2048 = 47.2M; 24 layers = 1,132.7M; final norm 2048
        ("builtin:bench-1.26b", 1_263_634_432),
        # Llama-3.2-1B: tied 128256 x 2048 = 262.7M; a layer: 2 x 2048^2 + 2 x 2048 x 8 x 64 + 3 x 2048 x 8192 +
        # 2 x 2048 = 60.8M; 16 layers = 973.1M; final norm 2048 (the 1,235,814,400 of the released model)
        ("builtin:bench-llama1b", 1_235_814_400),
    ],
)
def test_the_benchmark_shapes_have_the_parameters_they_are_named_for(name: str, expected: int) -> None:
    s = builtin_spec(name)
    layer = 2 * s.hidden_size**2 + 2 * s.hidden_size * s.num_query_groups * s.kv_channels
    layer += 3 * s.hidden_size * s.ffn_hidden_size + 2 * s.hidden_size
    embeddings = s.vocab_size * s.hidden_size * (1 if s.tie_word_embeddings else 2)
    assert embeddings + s.num_layers * layer + s.hidden_size == expected


def test_the_small_builtin_is_in_the_100m_to_500m_range_a_gpu_example_needs() -> None:
    model = build_gpt_model(builtin_spec("builtin:small"), seed=0)
    count = sum(p.numel() for p in model.parameters())
    assert 100e6 <= count <= 500e6, count


@pytest.mark.parametrize(
    "changes",
    [{}, {"arch": "qwen3", "qkv_bias": False, "tie_word_embeddings": True, "head_dim": 16}, {"arch": "llama"}],
    ids=["qwen2", "qwen3-tied", "llama"],
)
def test_a_spec_counts_the_parameters_its_model_has(changes: dict) -> None:
    spec = builtin_spec("builtin:tiny").replace(**changes)
    model = build_gpt_model(spec, seed=0)
    assert spec.num_parameters == sum(p.numel() for p in model.parameters())


def test_the_medium_builtin_has_300m_parameters_and_room_for_the_long_answers() -> None:
    """Counted from the spec: building 312M parameters would take a CPU box most of a minute."""
    spec = builtin_spec("builtin:medium")
    assert 300e6 <= spec.num_parameters <= 400e6, spec.num_parameters
    assert spec.max_position_embeddings >= 8 + 2048  # the worked-arithmetic prompt and the longest completion
