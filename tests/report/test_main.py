"""``report``'s bad input ends in one ``error:`` line and exit code 2, before anything is drawn; the advice it prints
covers the whole run even when a killed process's rows never reached metrics.csv."""

from __future__ import annotations

from pathlib import Path

import pytest

from sc_lightning.report import ReportError, build_report
from sc_lightning.report.main import main
from sc_lightning.report.run_info import RUN_INFO
from tests.helpers.cli import run
from tests.helpers.run_dirs import write_version


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run that has only just started: its run_info.yaml and no metrics yet."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RUN_INFO).write_text("config: {}\n")
    return tmp_path / "run"


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The command's one stderr line, which must be an ``error:`` line."""
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("error: ") and not captured.out
    return line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (lambda run, tmp: [str(run), "--out", str(tmp)], "is a directory; give the HTML file to write, e.g. --out"),
        (lambda run, tmp: [str(run), "--out", str(run / RUN_INFO / "r.html")], "cannot write the report"),
        (lambda run, tmp: [str(tmp / "absent")], "does not exist; give the run's trainer.default_root_dir"),
        (lambda run, tmp: [str(run / RUN_INFO)], "is not a directory; give the run's trainer.default_root_dir"),
        (lambda run, tmp: [str(tmp)], "holds no run: no */version_N/metrics.csv, train_data.jsonl or run_info.yaml"),
        (lambda run, tmp: [], "the following arguments are required: RUN_DIR (usage: "),
        (lambda run, tmp: [str(run), "--out"], "argument --out: expected one argument"),
        (lambda run, tmp: [str(run), "--outt", "x.html"], "unrecognized arguments: --outt x.html"),
    ],
    ids=[
        "out-is-a-directory",
        "out-under-a-file",
        "no-run-dir",
        "run-dir-is-a-file",
        "no-run-files",
        "no-args",
        "out-without-value",
        "unknown-flag",
    ],
)
def test_bad_input_is_one_error_line_and_exit_code_2(
    argv, message: str, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv(run_dir, run_dir.parent)) == 2
    assert message in error_line(capsys)
    assert not (run_dir / "report.html").exists()


def test_the_python_api_raises_the_same_errors(run_dir: Path) -> None:
    with pytest.raises(ReportError, match="is a directory"):
        build_report(run_dir, out=run_dir.parent)


HEADER = "epoch,goodput/engine/idle_total_s,goodput/engine/trained_total_s,goodput/engine/wall_total_s,"
HEADER += "goodput/trainer/productive_total_s,goodput/trainer/wait_rollouts_total_s,step\n"


def test_the_advice_covers_every_step_when_earlier_rows_never_reached_the_csv(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the first process was killed before the CSV logger's first flush; the resumed one logged steps 8 and 9 with
    # the totals it continued from step 7's bundle: 10 steps of 2 s of training each so far
    write_version(run_dir, 0, HEADER)
    write_version(run_dir, 1, HEADER + "1,0.0,16.0,16.0,16.0,0.0,8\n1,0.0,18.0,18.0,18.0,0.0,9\n")
    assert main([str(run_dir), "--out", str(run_dir / "r.html")]) == 0
    out = capsys.readouterr().out
    assert "goodput over 10 steps: trainer 18.0 s" in out
    assert "per step generation kept the engines busy 1.80 s and training took 1.80 s" in out


@pytest.mark.slow
def test_the_report_command_refuses_an_existing_directory_as_out(run_dir: Path, tmp_path: Path) -> None:
    result = run("report", str(run_dir), "--out", str(tmp_path), timeout_s=120)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: --out {tmp_path} is a directory; give the HTML file to write, e.g. --out {tmp_path / 'report.html'}"
    ]
