"""The report of a real tiny run: every plot's PNG is written and embedded, and each drew the run's own numbers
(read here straight from metrics.csv and train_data.jsonl); a killed run's short or missing CSV still reports."""

from __future__ import annotations

import base64
import csv
import json
import re
import shutil
from collections import Counter
from html import escape
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from sc_lightning.report.main import build_report, main, plot_folder
from sc_lightning.rollout.envs.arithmetic import leading_integer
from tests.helpers.cli import run
from tests.helpers.run_dirs import TINY_RUN_STEPS

pytestmark = pytest.mark.slow

PLOTS = {"reward", "staleness", "step_time", "goodput", "throughput", "failures"}


def csv_path(run_dir: Path) -> Path:
    return run_dir / "lightning_logs" / "version_0" / "metrics.csv"


def csv_columns(run_dir: Path) -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    """Every column of the run's one metrics.csv as (steps, values) over the rows that hold it."""
    with csv_path(run_dir).open() as handle:
        rows = list(csv.DictReader(handle))
    columns = {}
    for name in rows[0]:
        points = [(float(row["step"]), float(row[name])) for row in rows if row[name] != ""]
        columns[name] = (tuple(s for s, _ in points), tuple(v for _, v in points))
    return columns


def samples(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "train_data.jsonl").read_text().splitlines()]


def jsonl_reward(run_dir: Path) -> dict[float, float]:
    by_step: dict[float, list[float]] = {}
    for sample in samples(run_dir):
        by_step.setdefault(float(sample["step"]), []).append(sample["reward"])
    return {step: sum(rewards) / len(rewards) for step, rewards in by_step.items()}


def copy_run(tiny_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_run, tmp_path / "run", ignore=shutil.ignore_patterns("report*")))


def check_png(path: Path, panels: int) -> None:
    """A real PNG of the plot's size, with more than a blank canvas on it."""
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(path)
    assert image.shape[0] == 330 and image.shape[1] == 500 * panels, image.shape
    assert len(np.unique(image.reshape(-1, image.shape[2]), axis=0)) > 50  # lines, text, ticks


def test_the_report_of_a_finished_run_draws_its_data(tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "report.html"
    assert main([str(tiny_run), "--out", str(out)]) == 0
    plots = {plot.name: plot for plot in build_report(tiny_run, out)}
    assert set(plots) == PLOTS
    html = out.read_text()
    for name, plot in plots.items():
        png = plot_folder(out) / f"{name}.png"
        assert png.read_bytes() == plot.png
        assert base64.b64encode(plot.png).decode() in html  # embedded: the page needs no other file
        check_png(png, panels=1 if name == "goodput" and not plot.series else 2)

    logged = csv_columns(tiny_run)
    steps = tuple(float(s) for s in range(TINY_RUN_STEPS))
    assert logged["train/reward"][0] == steps
    wall = tuple(np.cumsum(logged["timing/train/total_step_time"][1]))
    drawn = plots["reward"].series
    assert drawn["train/reward"] == logged["train/reward"]
    assert drawn["train/reward vs wall time"][1] == logged["train/reward"][1]
    assert drawn["train/reward vs wall time"][0] == pytest.approx(wall)
    assert drawn["train/reward"][1] == pytest.approx([jsonl_reward(tiny_run)[s] for s in steps])  # same rewards

    staleness = Counter(sample["step"] - sample["start_weight"] for sample in samples(tiny_run))
    assert staleness[0] >= 16 and sum(staleness.values()) == TINY_RUN_STEPS * 16  # step 0 trains version 0's rollouts
    drawn = plots["staleness"].series
    values = sorted(staleness)
    assert drawn["samples per staleness"] == (tuple(map(float, values)), tuple(float(staleness[v]) for v in values))
    for column in ("train/staleness_mean", "train/staleness_max"):
        assert drawn[column] == logged[column]

    timing = {name: series for name, series in logged.items() if name.startswith("timing/train/")}
    assert {"timing/train/policy_training", "timing/train/weight_sync"} <= set(timing)
    assert plots["step_time"].series == timing

    goodput = {name: series for name, series in logged.items() if name.startswith("goodput/")}
    assert plots["goodput"].series == {name: s for name, s in goodput.items() if name.endswith("_total_s")}

    throughput = {name: logged[name] for name in ("perf/tokens_per_s", "perf/tokens_per_s_per_gpu")}
    assert plots["throughput"].series == throughput  # no MFU on a CPU

    failures = {n: s for n, s in logged.items() if n.startswith("rollout/") and n.endswith("_total")}
    failures.pop("rollout/committed_total"), failures.pop("rollout/selected_total")
    failures |= {n: s for n, s in logged.items() if n.startswith("train/") and n.endswith("_groups")}
    assert {"rollout/redispatch_total", "rollout/infra_failures_total", "train/dropped_prompt_groups"} <= set(failures)
    assert plots["failures"].series == failures

    for shown in (
        "builtin:tiny-arith",
        "in_order",
        f"last step</td><td>{TINY_RUN_STEPS} of {TINY_RUN_STEPS}",
        "megatron-core",
    ):
        assert shown in html
    assert metadata.version("torch") in html
    assert_sampled_answers(tiny_run, html)


def assert_sampled_answers(run_dir: Path, html: str) -> None:
    """The samples/ record (on by default) holds the first and the last step: 4 prompts of each, every generation
    decoded from the rows the step trained (their rewards are train_data.jsonl's), and the report shows both."""
    records = {int(path.stem.removeprefix("step_")): json.loads(path.read_text()) for path in
               (run_dir / "samples").glob("step_*.json")}  # fmt: skip
    assert sorted(records) == [0, TINY_RUN_STEPS - 1]
    trained = {(s["step"], s["group_id"], s["generation_index"]): s["reward"] for s in samples(run_dir)}
    for step, record in records.items():
        assert len(record["prompts"]) == 4 and {p["prompt_id"] for p in samples_of(run_dir, step)} >= {
            p["prompt_id"] for p in record["prompts"]
        }
        for prompt in record["prompts"]:
            assert re.fullmatch(r"\d+\+\d+=", prompt["prompt"]), prompt["prompt"]  # the arithmetic question
            assert prompt["images"] == []
            answers = prompt["answers"]
            assert sorted(a["generation_index"] for a in answers) == [0, 1, 2, 3]
            for answer in answers:
                assert answer["reward"] == trained[(step, prompt["group_id"], answer["generation_index"])]
            right = sum(int(n) for n in prompt["prompt"][:-1].split("+"))  # the text is what the verifier scored
            assert all((leading_integer(a["text"]) == right) == (a["reward"] == 1.0) for a in answers), answers
        assert f"<h3>step {step} (" in html
        assert escape(record["prompts"][0]["answers"][0]["text"]) in html


def samples_of(run_dir: Path, step: int) -> list[dict]:
    return [sample for sample in samples(run_dir) if sample["step"] == step]


def test_a_killed_run_without_metrics_csv_reports_from_train_data(tiny_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(tiny_run, tmp_path)
    shutil.rmtree(run_dir / "lightning_logs")  # killed before the CSV logger's first flush
    (run_dir / "run_info.yaml").unlink()  # and started before run_info.yaml existed
    plots = {plot.name: plot for plot in build_report(run_dir)}
    reward = jsonl_reward(run_dir)
    assert plots["reward"].series == {"train/reward": (tuple(reward), tuple(reward.values()))}
    assert sum(plots["staleness"].series["samples per staleness"][1]) == TINY_RUN_STEPS * 16
    assert all(not plots[name].series for name in ("step_time", "goodput", "throughput", "failures"))
    html = (run_dir / "report.html").read_text()
    assert "no <code>run_info.yaml</code>" in html and "no rows yet" in html
    assert f"{TINY_RUN_STEPS * 16} samples over {TINY_RUN_STEPS} steps" in html
    for name in PLOTS:
        assert (run_dir / "report_plots" / f"{name}.png").stat().st_size > 5_000


def test_a_short_torn_csv_is_extended_by_train_data(tiny_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(tiny_run, tmp_path)
    lines = csv_path(run_dir).read_text().splitlines(keepends=True)
    csv_path(run_dir).write_text("".join(lines[:4]) + lines[4][: len(lines[4]) // 2])  # 3 steps and a torn line
    plots = {plot.name: plot for plot in build_report(run_dir)}
    logged, reward = csv_columns(tiny_run), jsonl_reward(run_dir)
    drawn = plots["reward"].series
    assert drawn["train/reward"][0] == tuple(float(s) for s in range(TINY_RUN_STEPS))
    assert drawn["train/reward"][1][:3] == logged["train/reward"][1][:3]
    assert drawn["train/reward"][1][3:] == tuple(reward[float(s)] for s in range(3, TINY_RUN_STEPS))
    assert drawn["train/reward vs wall time"][1] == logged["train/reward"][1][:3]  # step times: CSV only
    assert plots["step_time"].series["timing/train/total_step_time"] == tuple(
        values[:3] for values in logged["timing/train/total_step_time"]
    )


def test_a_byte_that_is_not_utf8_spoils_only_its_own_cell(tiny_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(tiny_run, tmp_path)
    text = csv_path(run_dir).read_bytes()
    header, first, rest = text.split(b"\n", 2)
    cells = first.split(b",")
    column = header.split(b",").index(b"train/loss")
    cells[column] = b"\xff"
    csv_path(run_dir).write_bytes(b"\n".join([header, b",".join(cells), rest]))
    plots = {plot.name: plot for plot in build_report(run_dir)}
    logged = csv_columns(tiny_run)
    assert plots["reward"].series["train/reward"][1] == logged["train/reward"][1]  # every step's reward still there


def test_goodput_and_validation_columns_are_drawn_whatever_their_names(tiny_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(tiny_run, tmp_path)
    extra = {  # fleets and parts the report does not know in advance, and a validation metric
        "goodput/trainer/productive_total_s": [1.0, 2.0, 3.5, 5.0, 6.0, 7.0],
        "goodput/trainer/refit_total_s": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
        "goodput/engine/trained_total_s": [0.5, 1.5, 2.5, 3.5, 4.5, 5.5],
        "goodput/engine/pending_total_s": [0.2, 0.2, 0.3, 0.3, 0.4, 0.4],
        "goodput/engine/wall_total_s": [0.7, 1.7, 2.8, 3.8, 4.9, 5.9],  # their sum: a line over the stack
        "goodput/engine/trained_s": [0.5, 1.0, 1.0, 1.0, 1.0, 1.0],  # per step, not cumulative: not stacked
        "val/reward": ["", "", "0.25", "", "", "0.5"],
        "val/teacher_reward/add": ["", "", "0.5", "", "", "0.75"],
        "val/teacher_kl/add": ["", "", "3.0", "", "", "1.0"],  # not a reward: kept off the reward axis
        "val/duration_s": ["", "", "9.0", "", "", "8.0"],
    }
    with csv_path(tiny_run).open() as handle:
        rows = [{k: v for k, v in row.items() if not k.startswith("goodput/")} for row in csv.DictReader(handle)]
    with csv_path(run_dir).open("w", newline="") as handle:
        writer = csv.DictWriter(handle, [*rows[0], *extra])
        writer.writeheader()
        writer.writerows({**row, **{name: values[i] for name, values in extra.items()}} for i, row in enumerate(rows))
    plots = {plot.name: plot for plot in build_report(run_dir)}
    steps = tuple(float(s) for s in range(TINY_RUN_STEPS))
    expected = {name: (steps, tuple(values)) for name, values in extra.items() if name.endswith("_total_s")}
    assert plots["goodput"].series == expected
    check_png(run_dir / "report_plots" / "goodput.png", panels=2)  # one panel per fleet
    assert plots["reward"].series["val/reward"] == ((2.0, 5.0), (0.25, 0.5))
    assert plots["reward"].series["val/teacher_reward/add"] == ((2.0, 5.0), (0.5, 0.75))
    assert not {"val/teacher_kl/add", "val/duration_s"} & set(plots["reward"].series)


def test_the_report_subcommand_writes_the_html_beside_the_run(tiny_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(tiny_run, tmp_path)
    result = run("report", str(run_dir), timeout_s=120)
    assert result.returncode == 0, result.stderr[-2000:]
    html = (run_dir / "report.html").read_text()
    assert str(run_dir / "report.html") in result.stdout
    assert html.count("data:image/png;base64,") >= 6 and "grpo.num_prompts_per_step" in html
    assert "per step generation kept the engines busy" in result.stdout  # the fit's end-of-run advice,
    assert "per step generation kept the engines busy" in html  # on demand from the logged totals
    assert result.stdout.count("advice:") == 1
