"""A vision-language GRPO run through the command line (issue 39): the CLEVR warm start loads back as a VLM, a short
fit of configs/grpo_tiny_vlm.yaml trains with the scenes reaching the engine and the trainer, and its bundle refuses
to export (the vision side has no Hugging Face form)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sc_lightning.models.policy_source import model_spec, policy_tokenizer
from sc_lightning.models.spec import builtin_spec
from sc_lightning.models.warm_start import resolve_model_name
from tests.helpers.cli import run, step_metrics

pytestmark = pytest.mark.slow
CONFIG = "configs/grpo_tiny_vlm.yaml"


def test_the_clevr_warm_start_loads_back_as_a_vision_language_model(tmp_path: Path) -> None:
    """The warm-started directory holds the vision side's spec and a tokenizer with ``<image>`` at the spec's id."""
    directory = Path(resolve_model_name("builtin:tiny-vlm-clevr", seed=3, cache_dir=tmp_path))
    spec = model_spec(str(directory))
    assert spec == builtin_spec("builtin:tiny-vlm")
    tokenizer = policy_tokenizer(str(directory))
    assert tokenizer.vocab_size == spec.vocab_size
    assert tokenizer.encode("<image>") == [spec.vision.image_token_id]
    assert tokenizer.decode([spec.vision.image_token_id, *tokenizer.encode("2")]) == "2"


@pytest.mark.timeout(600)
def test_a_vlm_run_trains_on_its_scenes_and_refuses_to_export(tmp_path: Path) -> None:
    """Three steps of the shipped config with a bundle: the engine refuses an image prompt without its images and
    the trainer a row without them, so a finished fit shows both got them; ``export`` of its bundle names why not."""
    fit = run(
        "fit",
        "--config",
        CONFIG,
        "--grpo.max_num_steps=3",
        "--checkpointing.enabled=true",
        "--checkpointing.save_data_plane=true",
        f"--checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
        timeout_s=540,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    steps = step_metrics(tmp_path)
    assert len(steps) == 3 and all(float(step["train/num_valid_samples"]) > 0 for step in steps)
    bundle = sorted((tmp_path / "ckpt").glob("step_*"))[-1]
    export = run("export", "--ckpt_path", str(bundle), "--output", str(tmp_path / "hf"), timeout_s=120)
    assert export.returncode != 0
    assert "is a vision-language model" in export.stderr and "no Hugging Face form" in export.stderr
    assert not (tmp_path / "hf").exists()
