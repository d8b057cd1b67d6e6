"""``fit`` from a Hugging Face directory as a user brings one, and ``export`` back to one: for each supported
architecture (Llama-3.x untied and tied, Qwen2.5, Qwen3), a tiny random model written by ``transformers`` with its BPE
tokenizer and chat template trains 3 GRPO steps through ``python -m sc_lightning fit`` (colocated Megatron engine,
in-process data plane), its prompts rendered by the directory's chat template after ``data.system_prompt``; the fit
ends by exporting its final bundle (``checkpointing.export_hf_at_end``). One fit per architecture serves every test.

A trained row's tokens decode, with the directory's own tokenizer, to that rendering of one of the dataset's prompts:
the run used the directory's tokenizer, special tokens and template end to end. The export loads in ``transformers``
with the bundle's own logits, keeps the source's config and tokenizer, and trains on with ``fit``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from sc_lightning.cli.main import main
from sc_lightning.models.convert import read_hf_safetensors
from tests.helpers.cli import QUICK, run, step_metrics
from tests.helpers.configs import TINY
from tests.helpers.dataset_files import write_rows
from tests.helpers.exports import assert_export_matches_bundle, assert_tokenizer_round_trips, transformers_logits
from tests.helpers.hf_models import make_hf_model_dir

pytestmark = pytest.mark.slow

SYSTEM = "Add the numbers."
SUMS = [(a, b) for a in range(4) for b in range(4)]  # 16 prompts: 3 steps of 4 groups
CASES = {  # the fits: an HF_ARCHITECTURES entry and the changes to its config
    "llama3": ("llama3", {}),
    "llama3-tied": ("llama3", {"tie_word_embeddings": True}),
    "qwen2.5": ("qwen2.5", {}),
    "qwen3": ("qwen3", {}),
}


@dataclass(frozen=True)
class HFFit:
    """A finished fit from an HF directory: its run directory, the source model, the fit's output, the export."""

    root: Path
    model_dir: Path
    stderr: str

    @property
    def bundle(self) -> Path:
        """The fit's final bundle."""
        return self.root / "checkpoints" / "step_3"

    @property
    def export(self) -> Path:
        """The end-of-fit export of the final bundle."""
        return self.root / "checkpoints" / "hf_export" / "step_3"


def fit_from(model_dir: Path, root: Path, *extra: str) -> tuple[int, str]:
    """``fit`` of the summing prompts from ``model_dir`` under the chat template into ``root``: exit code, stderr."""
    prompts = write_rows(root, [{"problem": f"{a}+{b}=", "expected_answer": a + b} for a, b in SUMS], "jsonl")
    result = run(
        "fit", "--config", TINY, *QUICK, "--config", "tests/small_steps.yaml",
        f"--policy.model_name={model_dir}",
        f"--data.dataset_name={prompts}",
        "--data.apply_chat_template=true",
        f"--data.system_prompt={SYSTEM}",
        "--data.max_prompt_length=48",
        "--policy.max_total_sequence_length=64",
        f"--trainer.default_root_dir={root}",
        *extra,
    )  # fmt: skip
    return result.returncode, result.stderr


@pytest.fixture(scope="module", params=list(CASES))
def hf_fit(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> HFFit:
    """3 GRPO steps from a tiny random ``transformers`` directory, checkpointed, exported at the end."""
    root = tmp_path_factory.mktemp(request.param)
    name, overrides = CASES[request.param]
    model_dir = make_hf_model_dir(root / "source", name, **overrides)
    code, stderr = fit_from(
        model_dir, root,
        "--grpo.max_num_steps=3",
        # a random model earns no reward, so its gradients are zero: weight decay makes every step change the weights
        "--policy.optimizer.lr=0.05",
        "--policy.optimizer.weight_decay=0.5",
        '--trainer.callbacks=[{"class_path": "tests.helpers.callbacks.TrainedTokens"}]',
        "--checkpointing.enabled=true",
        "--checkpointing.save_data_plane=true",
        f"--checkpointing.checkpoint_dir={root / 'checkpoints'}",
        "--checkpointing.export_hf_at_end=true",
    )  # fmt: skip
    assert code == 0, stderr[-3000:]
    return HFFit(root, model_dir, stderr)


def test_fit_trains_three_steps_from_a_transformers_directory(hf_fit: HFFit) -> None:
    from transformers import AutoTokenizer

    model_dir, stderr = hf_fit.model_dir, hf_fit.stderr
    assert [row["step"] for row in step_metrics(hf_fit.root)] == ["0", "1", "2"]
    architecture = json.loads((model_dir / "config.json").read_text())["architectures"][0]
    assert f"model: {architecture}, vocabulary " in stderr
    assert f"tokenizer {model_dir} (chat template)" in stderr

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    rendered = {
        tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{a}+{b}="}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for a, b in SUMS
    }
    rows = [json.loads(line) for line in (hf_fit.root / "trained_tokens.jsonl").read_text().splitlines()]
    assert {row["step"] for row in rows} == {0, 1, 2} and len(rows) == 3 * 16
    for row in rows:
        completion_start = row["token_mask"].index(1)
        prompt = tokenizer.decode(row["input_ids"][:completion_start], skip_special_tokens=False)
        assert prompt in rendered, prompt


def test_the_end_of_fit_export_runs_in_transformers_with_the_bundles_logits(hf_fit: HFFit, model_parallel) -> None:
    assert_export_matches_bundle(hf_fit.export, hf_fit.bundle / "trainer.ckpt", hf_fit.model_dir)
    source, exported = (json.loads((d / "config.json").read_text()) for d in (hf_fit.model_dir, hf_fit.export))
    assert exported.pop("dtype") == "float32"
    source.pop("dtype", None)
    assert exported == source  # its RoPE scaling, tied embeddings, special-token ids: the source's own config
    generation = json.loads((hf_fit.export / "generation_config.json").read_text())
    assert generation["eos_token_id"] == source["eos_token_id"]
    assert sorted(p.name for p in hf_fit.export.glob("*.safetensors")) == ["model.safetensors"]


def test_the_exports_tokenizer_round_trips_the_dataset(hf_fit: HFFit) -> None:
    texts = [SYSTEM, *(f"{a}+{b}={a + b}" for a, b in SUMS)]
    assert_tokenizer_round_trips(hf_fit.export, hf_fit.model_dir, texts)


def test_export_splits_the_weights_above_the_shard_size_and_refuses_bad_paths(
    hf_fit: HFFit, model_parallel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sharded = tmp_path / "sharded"
    args = ["export", "--ckpt_path", str(hf_fit.bundle), "--output", str(sharded), "--max_shard_size", "20KB"]
    assert main(args) == 0
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert len(files) > 2 and set(index["weight_map"].values()) == set(files)
    whole, split = read_hf_safetensors(hf_fit.export), read_hf_safetensors(sharded)
    assert len(whole) > len(files)
    for name in files:  # at most 20 KB of tensors, or one larger tensor alone
        names = [tensor for tensor, file in index["weight_map"].items() if file == name]
        assert sum(whole[n].nbytes for n in names) <= 20_000 or len(names) == 1, name
    assert split.keys() == whole.keys() and all(split[k].equal(whole[k]) for k in whole)
    assert transformers_logits(sharded).equal(transformers_logits(hf_fit.export))
    capsys.readouterr()

    assert main(["export", "--ckpt_path", str(hf_fit.bundle), "--output", str(sharded)]) == 2  # never overwritten
    assert f"error: {sharded} exists and is not an empty directory" in capsys.readouterr().err
    assert main(["export", "--ckpt_path", str(tmp_path), "--output", str(tmp_path / "x")]) == 2  # as generate says
    assert "not a checkpoint bundle (no trainer.ckpt); give a bundle directory" in capsys.readouterr().err
    assert main(["export", "--ckpt_path", str(tmp_path / "nope"), "--output", str(tmp_path / "x")]) == 2
    assert "--ckpt_path " + str(tmp_path / "nope") + ": no such file or directory" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_export_refuses_an_incomplete_bundle(hf_fit: HFFit, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    damaged = shutil.copytree(hf_fit.bundle, tmp_path / "step_3")
    (damaged / "controller_state.json").write_text("{}")
    assert main(["export", "--ckpt_path", str(damaged / "trainer.ckpt"), "--output", str(tmp_path / "out")]) == 3
    assert f"{damaged / 'controller_state.json'}: does not match MANIFEST.json" in capsys.readouterr().err
    (damaged / "MANIFEST.json").unlink()
    assert main(["export", "--ckpt_path", str(damaged), "--output", str(tmp_path / "out")]) == 3
    assert "MANIFEST.json: missing or unreadable" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("hf_fit", ["llama3"], indirect=True)
def test_the_end_of_fit_export_stops_past_its_deadline_naming_the_bundle(
    hf_fit: HFFit, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung export child does not hang the fit that launched it (holding its checkpoint directory's lock): it is
    stopped at the deadline, and the message says how to export by hand."""
    import shutil

    from sc_lightning.cli import export

    bundle = shutil.copytree(hf_fit.bundle, tmp_path / "checkpoints" / hf_fit.bundle.name)
    monkeypatch.setattr(export, "FINAL_EXPORT_TIMEOUT_S", 0.5)  # an interpreter alone takes longer to start
    assert export.export_final_bundle(tmp_path / "checkpoints") == 1
    err = capsys.readouterr().err
    assert f"exporting {bundle} to {tmp_path / 'checkpoints' / 'hf_export' / bundle.name} ran past 0 s" in err
    assert f"python -m sc_lightning export --ckpt_path {bundle} --output OUT" in err


# one architecture: fit reads an export as any HF directory. CASES' first, whose parameter index (0) pytest groups
# this test's with, so it runs beside that fit's other tests and no fit is repeated
@pytest.mark.parametrize("hf_fit", ["llama3"], indirect=True)
def test_fit_trains_on_from_an_export(hf_fit: HFFit, tmp_path: Path) -> None:
    code, stderr = fit_from(hf_fit.export, tmp_path, "--grpo.max_num_steps=1")
    assert code == 0, stderr[-3000:]
    assert "model: LlamaForCausalLM, vocabulary " in stderr
    assert f"tokenizer {hf_fit.export} (chat template)" in stderr
    assert [row["step"] for row in step_metrics(tmp_path)] == ["0"]
