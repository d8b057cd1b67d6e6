"""TP=2 over two gloo processes equals TP=1: logits, log-probs, gradients, shards and the HF export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sc_lightning.models.convert import hf_to_megatron_state, megatron_to_hf_state, random_hf_state
from sc_lightning.models.spec import builtin_spec
from tests.helpers.models import hf_causal_lm, random_ids
from tests.models.tp_worker import save_rank_results
from tests.ranks import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("model_parallel")]
VARIANTS = ("qwen2-vocab19", "llama-tied", "qwen3-tied-gqa")  # vocab 19 is padded to 20 at TP=2


@pytest.fixture(scope="module")
def tp2(tiny_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Run tests.models.tp_worker on two ranks; their saved results in rank order."""
    out = tmp_path_factory.mktemp("tp2")
    models = [f"{v}={tiny_dirs[v]}" for v in VARIANTS] + ["builtin=builtin:tiny"]
    run_ranks(save_rank_results, 2, out, models)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_tp2_logits_and_logprobs_equal_tp1(variant: str, tp2: list[dict], tiny_dirs: dict[str, Path]) -> None:
    from sc_lightning.models.logprobs import logits_of, token_logprobs
    from sc_lightning.models.megatron import load_policy

    model, spec, _ = load_policy(str(tiny_dirs[variant]), precision="fp32", seed=0)
    ids = random_ids(3, 24, seed=11, vocab=spec.vocab_size)
    with torch.no_grad():
        hf_logits = hf_causal_lm(tiny_dirs[variant])(ids).logits
        tp1_logits = logits_of(model, ids)
    tp1_logprobs = token_logprobs(model, ids)
    tp1_logprobs.sum().backward()
    for rank in tp2:
        got = rank[variant]
        assert got["logits"].shape == tp1_logits.shape == (3, 24, spec.vocab_size)
        assert (got["logits"] - tp1_logits).abs().max() < 1e-5
        assert (got["logits"] - hf_logits).abs().max() < 1e-4
        assert (got["logprobs"] - tp1_logprobs.detach()).abs().max() < 1e-5
        assert torch.equal(got["logprobs"][:, 0], torch.zeros(3))
        assert torch.allclose(got["norm_grad"], model.decoder.final_layernorm.weight.grad, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_tp2_shards_round_trip_and_export(variant: str, tp2: list[dict], tiny_dirs: dict[str, Path]) -> None:
    from sc_lightning.models.convert import read_hf_safetensors
    from sc_lightning.models.hf_config import mcore_spec_from_hf_config

    hf_model = hf_causal_lm(tiny_dirs[variant])
    spec = mcore_spec_from_hf_config(hf_model.config)
    hf = hf_model.state_dict()
    shards = [rank[variant]["shard"] for rank in tp2]
    for r, shard in enumerate(shards):
        expected = hf_to_megatron_state(read_hf_safetensors(tiny_dirs[variant]), spec, tp_rank=r, tp_size=2)
        assert shard.keys() == expected.keys() and all(torch.equal(shard[k], expected[k]) for k in shard)
    back = megatron_to_hf_state(shards, spec)
    assert back.keys() == hf.keys() and all(torch.equal(back[k], hf[k]) for k in hf)
    for rank in tp2:  # every rank receives the full, unpadded tensors
        assert rank[variant]["export"].keys() == hf.keys()
        assert all(torch.equal(rank[variant]["export"][k], hf[k]) for k in hf)


def test_builtin_random_init_does_not_depend_on_tp(tp2: list[dict]) -> None:
    spec = builtin_spec("builtin:tiny")
    expected = random_hf_state(spec, seed=0)
    exported = tp2[0]["builtin"]["export"]
    assert exported.keys() == expected.keys()
    assert all(torch.equal(exported[k], expected[k]) for k in expected)
