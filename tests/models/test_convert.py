"""HF <-> megatron conversion: logits parity against transformers, exact round trips, TP/PP layout, config mapping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sc_lightning.models.convert import (
    export_hf_weights,
    hf_param_shapes,
    hf_to_megatron_state,
    megatron_to_hf_state,
    parameter_mappings,
    random_hf_state,
    read_hf_safetensors,
)
from sc_lightning.models.hf_config import hf_config_dict, hf_config_problems, mcore_spec_from_hf_config
from sc_lightning.models.spec import BUILTIN_SPECS, ModelSpec
from tests.helpers.hf_models import HF_VARIANTS
from tests.helpers.models import TINY_VARIANTS, hf_causal_lm, random_ids

pytestmark = pytest.mark.usefixtures("model_parallel")
GQA = BUILTIN_SPECS["builtin:tiny"].replace(num_attention_heads=4)  # two query heads per KV group
VARIANTS = [*TINY_VARIANTS, *HF_VARIANTS]  # ours (random norms and biases) and transformers-written directories


def _spec_of(path: Path) -> ModelSpec:
    return mcore_spec_from_hf_config(json.loads((path / "config.json").read_text()))


@pytest.mark.parametrize("variant", VARIANTS)
def test_megatron_logits_match_transformers(variant: str, tiny_dirs: dict[str, Path]) -> None:
    from sc_lightning.models.logprobs import logits_of
    from sc_lightning.models.megatron import load_policy

    model, spec, _ = load_policy(str(tiny_dirs[variant]), precision="fp32")
    ids = random_ids(3, 48, seed=1, vocab=spec.vocab_size)
    with torch.no_grad():
        expected = hf_causal_lm(tiny_dirs[variant])(ids).logits
        got = logits_of(model.eval(), ids)
    assert got.shape == expected.shape == (3, 48, spec.vocab_size)
    diff = (got - expected).abs().max().item()
    assert diff < 1e-4, f"{variant}: max |logits diff| = {diff:.3g} (logits up to {expected.abs().max():.3g})"


@pytest.mark.parametrize("variant", VARIANTS)
def test_hf_megatron_hf_round_trip_is_exact(variant: str, tiny_dirs: dict[str, Path]) -> None:
    hf = hf_causal_lm(tiny_dirs[variant]).state_dict()  # tied models list lm_head too (same tensor)
    spec = _spec_of(tiny_dirs[variant])
    back = megatron_to_hf_state(hf_to_megatron_state(hf, spec), spec)
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[k], hf[k]) for k in hf)


@pytest.mark.parametrize("variant", ["qwen2", "llama-tied", "qwen3-tied-gqa"])
def test_export_hf_weights_streams_the_checkpoint_back(variant: str, tiny_dirs: dict[str, Path]) -> None:
    from sc_lightning.models.megatron import load_policy

    model, spec, _ = load_policy(str(tiny_dirs[variant]), precision="fp32")
    hf = hf_causal_lm(tiny_dirs[variant]).state_dict()
    streamed = list(export_hf_weights(model, spec))
    assert [name for name, _ in streamed] == list(hf_param_shapes(spec))  # HF order, lm_head last
    assert all(torch.equal(tensor, hf[name]) for name, tensor in streamed)
    as_bf16 = dict(export_hf_weights(model, spec, dtype=torch.bfloat16))
    assert all(t.dtype == torch.bfloat16 for t in as_bf16.values())


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("tied", [False, True])
def test_tp_shards_round_trip_with_vocab_padding(tp: int, tied: bool) -> None:
    spec = GQA.replace(vocab_size=17, tie_word_embeddings=tied, num_query_groups=4)
    hf = random_hf_state(spec, seed=3)
    shards = [hf_to_megatron_state(hf, spec, tp_rank=r, tp_size=tp) for r in range(tp)]
    padded = spec.padded_vocab_size(tp)
    assert padded % tp == 0 and padded >= 17
    assert shards[0]["embedding.word_embeddings.weight"].shape == (padded // tp, spec.hidden_size)
    assert torch.count_nonzero(shards[-1]["embedding.word_embeddings.weight"][-(padded - 17) :]) == 0
    back = megatron_to_hf_state(shards, spec)
    if tied:
        hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[k], hf[k]) for k in hf)


def test_tp_shards_hold_whole_kv_groups_and_gate_up_halves() -> None:
    spec = GQA  # 4 heads, 2 KV groups, head_dim 16, qwen2 (q/k/v biases)
    hf = random_hf_state(spec, seed=0)
    hf = {k: torch.randn_like(v) for k, v in hf.items()}
    p, d = "model.layers.0.", spec.kv_channels
    shard = hf_to_megatron_state(hf, spec, tp_rank=1, tp_size=2)
    qkv = shard["decoder.layers.0.self_attention.linear_qkv.bias"]  # group 1 only: q heads 2,3 then k1, v1
    q, k, v = (hf[f"{p}self_attn.{n}_proj.bias"] for n in "qkv")
    assert torch.equal(qkv, torch.cat([q[2 * d : 4 * d], k[d : 2 * d], v[d : 2 * d]]))
    fc1 = shard["decoder.layers.0.mlp.linear_fc1.weight"]
    f = spec.ffn_hidden_size // 2
    assert torch.equal(fc1, torch.cat([hf[p + "mlp.gate_proj.weight"][f:], hf[p + "mlp.up_proj.weight"][f:]]))
    proj = shard["decoder.layers.0.self_attention.linear_proj.weight"]
    assert torch.equal(proj, hf[p + "self_attn.o_proj.weight"][:, spec.hidden_size // 2 :])


def test_pipeline_stages_renumber_layers_and_split_the_ends() -> None:
    spec = BUILTIN_SPECS["builtin:tiny"].replace(num_layers=4, tie_word_embeddings=True)
    hf = random_hf_state(spec, seed=0)
    first = hf_to_megatron_state(hf, spec, pp_rank=0, pp_size=2)
    last = hf_to_megatron_state(hf, spec, pp_rank=1, pp_size=2)
    assert "embedding.word_embeddings.weight" in first and "output_layer.weight" not in first
    assert "embedding.word_embeddings.weight" not in last and "decoder.final_layernorm.weight" in last
    assert torch.equal(last["output_layer.weight"], hf["model.embed_tokens.weight"])  # tied copy on the last stage
    key = "decoder.layers.0.mlp.linear_fc2.weight"
    assert torch.equal(last[key], hf["model.layers.2.mlp.down_proj.weight"])
    assert not any(k.startswith("decoder.layers.2") for k in last)
    names = {m.mcore for m in parameter_mappings(spec, pp_rank=1, pp_size=2)}
    assert names == set(last)


def test_converter_rejects_missing_and_unused_weights() -> None:
    spec = BUILTIN_SPECS["builtin:tiny"]
    hf = random_hf_state(spec, seed=0)
    with pytest.raises(KeyError, match="model.norm.weight"):
        hf_to_megatron_state({k: v for k, v in hf.items() if k != "model.norm.weight"}, spec)
    with pytest.raises(ValueError, match="model.layers.9"):
        hf_to_megatron_state({**hf, "model.layers.9.mlp.up_proj.weight": torch.zeros(1)}, spec)
    with pytest.raises(ValueError, match="divisible"):
        hf_to_megatron_state(hf, spec, tp_rank=0, tp_size=4)  # 2 KV groups cannot split 4 ways


def test_config_mapping_both_ways(tiny_dirs: dict[str, Path]) -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(tiny_dirs["llama3-rope-mqa"]))
    spec = mcore_spec_from_hf_config(cfg)
    assert (spec.arch, spec.qkv_bias, spec.tie_word_embeddings, spec.num_query_groups) == ("llama", False, True, 1)
    assert (spec.rope_theta, spec.rope_scaling_factor, spec.kv_channels) == (500000.0, 32.0, 32)
    assert mcore_spec_from_hf_config(hf_config_dict(spec)) == spec
    qwen = BUILTIN_SPECS["builtin:tiny"]
    assert mcore_spec_from_hf_config(hf_config_dict(qwen)) == qwen
    assert mcore_spec_from_hf_config(hf_config_dict(qwen.replace(head_dim=8))).kv_channels == 8
    qwen3 = qwen.replace(arch="qwen3", qkv_bias=False, head_dim=48)
    config = hf_config_dict(qwen3)
    assert (config["architectures"], config["attention_bias"], config["head_dim"]) == (["Qwen3ForCausalLM"], False, 48)
    assert mcore_spec_from_hf_config(config) == qwen3 and qwen3.qk_layernorm and not qwen.qk_layernorm
    with pytest.raises(ValueError, match="qkv_bias=False"):
        hf_config_dict(qwen.replace(arch="qwen3"))


def test_config_mapping_rejects_what_megatron_cannot_hold() -> None:
    base = hf_config_dict(BUILTIN_SPECS["builtin:tiny"].replace(arch="llama", qkv_bias=False))
    with pytest.raises(NotImplementedError, match="model_type"):
        mcore_spec_from_hf_config({**base, "model_type": "gpt2"})
    with pytest.raises(NotImplementedError, match="bias"):
        mcore_spec_from_hf_config({**base, "attention_bias": True})
    with pytest.raises(NotImplementedError, match="hidden_act"):
        mcore_spec_from_hf_config({**base, "hidden_act": "gelu"})
    yarn = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 64}
    with pytest.raises(NotImplementedError, match="RoPE"):
        mcore_spec_from_hf_config({**base, "rope_parameters": yarn})


def test_config_problems_name_the_architecture_or_the_key() -> None:
    """One line per problem of a config.json, read as written (the checks fit --dry_run runs)."""
    llama = hf_config_dict(BUILTIN_SPECS["builtin:tiny"].replace(arch="llama", qkv_bias=False))
    qwen2 = hf_config_dict(BUILTIN_SPECS["builtin:tiny"])
    assert hf_config_problems(llama) == hf_config_problems(qwen2) == []
    assert hf_config_problems({**llama, "architectures": ["MistralForCausalLM"], "model_type": "mistral"}) == [
        "has architectures ['MistralForCausalLM']; sc_lightning trains LlamaForCausalLM, Qwen2ForCausalLM, "
        "Qwen3ForCausalLM"
    ]
    assert hf_config_problems({"model_type": "gpt2"}) == [
        "has model_type 'gpt2' and no architectures; sc_lightning trains LlamaForCausalLM, Qwen2ForCausalLM, "
        "Qwen3ForCausalLM"
    ]
    assert "model_type 'llama'" in hf_config_problems({**qwen2, "model_type": "llama"})[0]
    sliding = {**qwen2, "use_sliding_window": True, "layer_types": ["full_attention", "sliding_attention"]}
    assert [line.split(";")[0] for line in hf_config_problems(sliding)] == [
        "has use_sliding_window: true",
        "has layer_types ['sliding_attention']",
    ]
    assert hf_config_problems({**qwen2, "attention_bias": True}) == []  # Qwen2's q/k/v biases
    legacy = {"type": "linear", "factor": 2.0}  # transformers 4.x spelling
    assert hf_config_problems({**llama, "rope_parameters": None, "rope_scaling": legacy})[0].startswith(
        "has rope_scaling {'type': 'linear', 'factor': 2.0}; of RoPE scalings only llama3"
    )


def test_read_hf_safetensors_reads_single_and_sharded(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import save_file

    state = read_hf_safetensors(tiny_dirs["llama"])
    names = sorted(state)
    half = len(names) // 2
    save_file({k: state[k] for k in names[:half]}, str(tmp_path / "a.safetensors"))
    save_file({k: state[k] for k in names[half:]}, str(tmp_path / "b.safetensors"))
    weight_map = {k: ("a" if i < half else "b") + ".safetensors" for i, k in enumerate(names)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    sharded = read_hf_safetensors(tmp_path)
    assert sharded.keys() == state.keys() and all(torch.equal(sharded[k], state[k]) for k in state)
    with pytest.raises(FileNotFoundError):
        read_hf_safetensors(tmp_path / "missing")


def test_random_weights_stay_on_the_cpu_under_a_default_device_context() -> None:
    """Lightning builds models under its device context (``torch.device(root_device)``): the seeded weights must
    not follow it (a CPU generator cannot fill a CUDA tensor). ``meta`` stands in for ``cuda`` here."""
    spec = BUILTIN_SPECS["builtin:tiny"]
    with torch.device("meta"):
        state = random_hf_state(spec, seed=0)
    assert {t.device.type for t in state.values()} == {"cpu"}
    assert all(torch.equal(state[k], v) for k, v in random_hf_state(spec, seed=0).items())
