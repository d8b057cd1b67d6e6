"""The report's "Sampled answers": the first and the last step of a run's samples/ record (written here by the
trainer's SampleLog), each prompt's images copied beside the report and embedded, its answers with their rewards."""

from __future__ import annotations

import base64
import re
from html import escape
from pathlib import Path

import numpy as np
import torch

from sc_lightning.report.main import build_report
from sc_lightning.report.samples import WHY
from sc_lightning.trainer.sample_log import SampledAnswer, SampledPrompt, SampleLog
from tests.helpers.images import pattern
from tests.helpers.run_dirs import write_version

STEPS = 10


def scene(step: int) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(pattern(32, 32, seed=step)))[None]


def fabricated_run(run_dir: Path) -> Path:
    """A 10-step run's metrics.csv and its samples/ record (every 4th step, the first and the last)."""
    write_version(run_dir, 0, "step,train/reward\n" + "".join(f"{s},{s / STEPS}\n" for s in range(STEPS)))
    log = SampleLog(run_dir / "samples", every_n_steps=4)
    log.open(resume_step=0)
    for step in range(STEPS):
        answers = [
            SampledAnswer(0, f"answer-{step}-right", 1.0, False),
            SampledAnswer(1, f"<b>answer-{step}-cut</b>", 0.0, True),  # text, not markup
        ]
        prompt = SampledPrompt(f"clevr-{step:03d}", step, f"g{step}", step - 1, "<image>+1=", answers, scene(step))
        log.record(step, [prompt])
    log.close()
    return run_dir


def test_the_first_and_last_recorded_steps_show_their_scenes_and_answers(tmp_path: Path) -> None:
    run_dir = fabricated_run(tmp_path / "run")
    build_report(run_dir)
    html = (run_dir / "report.html").read_text()
    section = html[html.index("<h2 id='samples'>Sampled answers</h2>") :]

    steps = re.findall(r"<h3>step (\d+) \((first|last) recorded step\)</h3>", section)
    assert steps == [("0", "first"), ("9", "last")]  # steps 4 and 8 are on record, but not shown
    for step in (0, 9):
        assert f"answer-{step}-right" in section and f"&lt;b&gt;answer-{step}-cut&lt;/b&gt;" in section
        assert f"clevr-{step:03d} (started at weight version {step - 1}, mean reward 0.50)" in section
        copied = run_dir / "report_plots" / "samples" / f"clevr-{step:03d}_0.png"
        assert copied.read_bytes() == (run_dir / "samples" / "images" / copied.name).read_bytes()
        assert base64.b64encode(copied.read_bytes()).decode() in section  # embedded: the page needs no other file
    assert "answer-4-right" not in section
    assert section.count("&lt;image&gt;+1=") == 2
    assert re.findall(r"<td>(1|0) ?(cut)?</td>", section) == [("1", ""), ("0", "cut")] * 2
    copied = sorted(path.name for path in (run_dir / "report_plots" / "samples").iterdir())
    assert copied == ["clevr-000_0.png", "clevr-009_0.png"]  # the shown steps' images only
    assert "<td>samples/</td><td>steps 0, 4, 8, 9</td>" in html  # the header's progress


def test_a_run_without_the_record_says_how_to_get_one(tmp_path: Path) -> None:
    write_version(tmp_path, 0, "step,train/reward\n0,0.5\n")
    build_report(tmp_path)
    html = (tmp_path / "report.html").read_text()
    assert f"<h2 id='samples'>Sampled answers</h2><p class='caption'>{escape(WHY)}</p>" in html
    assert "--data.sample_log_prompts" in WHY and "<td>samples/</td><td>none recorded</td>" in html
    assert not (tmp_path / "report_plots" / "samples").exists()


def test_a_record_whose_image_went_missing_still_reports(tmp_path: Path) -> None:
    run_dir = fabricated_run(tmp_path / "run")
    (run_dir / "samples" / "images" / "clevr-009_0.png").unlink()
    (run_dir / "samples" / "step_000000.json").write_text('{"step": 0, "pro')  # torn: left out
    build_report(run_dir)
    html = (run_dir / "report.html").read_text()
    assert re.findall(r"<h3>step (\d+) \((first|last) recorded step\)</h3>", html) == [("4", "first"), ("9", "last")]
    assert "images/clevr-009_0.png is missing" in html and "answer-9-right" in html
