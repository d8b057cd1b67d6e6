"""Crash-safe bundles: whole or absent under SIGKILL at any moment, verified file by file on the way back."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from sc_lightning.checkpoint.atomic import (
    MANIFEST,
    BundleError,
    complete_bundles,
    remove_stale_temporaries,
    verify_bundle,
    write_atomically,
)


def write_bundle(root, name: str, payload: bytes = b"weights") -> None:
    with write_atomically(root / name) as tmp:
        (tmp / "model.pt").write_bytes(payload)
        (tmp / "nested").mkdir()
        (tmp / "nested" / "state.json").write_text('{"step": 1}')


def test_a_written_bundle_verifies_and_lists(tmp_path) -> None:
    write_bundle(tmp_path, "step_2")
    write_bundle(tmp_path, "step_10")
    assert [n for n, _ in complete_bundles(tmp_path)] == [2, 10]
    files = verify_bundle(tmp_path / "step_2")
    assert set(files) == {"model.pt", "nested/state.json"} and files["model.pt"]["bytes"] == 7
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("tmp_")]


def test_a_failed_write_leaves_nothing(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="boom"), write_atomically(tmp_path / "step_1") as tmp:
        (tmp / "model.pt").write_bytes(b"half")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_bundles_are_never_overwritten(tmp_path) -> None:
    write_bundle(tmp_path, "step_1")
    with pytest.raises(BundleError, match="exists already"), write_atomically(tmp_path / "step_1"):
        pass


def test_a_damaged_bundle_where_a_new_one_goes_is_moved_aside_not_deleted(tmp_path, caplog) -> None:
    """A run resumed before a damaged bundle writes that step again: the damaged one moves aside, byte for byte."""
    write_bundle(tmp_path, "step_1")
    (tmp_path / "step_1" / "model.pt").write_bytes(b"torn")
    write_bundle(tmp_path, "step_1", b"weights again")
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("step_1.damaged-")]
    assert (aside / "model.pt").read_bytes() == b"torn" and verify_bundle(tmp_path / "step_1")
    assert [n for n, _ in complete_bundles(tmp_path)] == [1]  # the damaged one no longer counts as a bundle
    assert f"moved to {aside}" in caplog.text


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"])
def test_a_full_disk_names_the_bundle_and_leaves_the_earlier_ones_intact(tmp_path, code: int) -> None:
    write_bundle(tmp_path, "step_1")
    full = rf"step_2: the disk is full .* free space under {tmp_path}"
    with pytest.raises(BundleError, match=full), write_atomically(tmp_path / "step_2") as tmp:
        (tmp / "model.pt").write_bytes(b"half")
        raise OSError(code, os.strerror(code))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"] and verify_bundle(tmp_path / "step_1")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: (b / "model.pt").write_bytes(b"weigh"), r"model.pt: does not match .*5 bytes, expected 7"),
        (lambda b: (b / "model.pt").write_bytes(b"WEIGHTS"), r"model.pt: does not match"),
        (lambda b: (b / "nested" / "state.json").unlink(), r"state.json: listed in MANIFEST.json but missing"),
        (lambda b: (b / MANIFEST).unlink(), r"MANIFEST.json: missing or unreadable"),
        (lambda b: (b / MANIFEST).write_text("{"), r"MANIFEST.json: missing or unreadable"),
    ],
    ids=["truncated", "altered", "missing file", "no manifest", "corrupt manifest"],
)
def test_damage_is_named_by_file(tmp_path, damage, message: str) -> None:
    write_bundle(tmp_path, "step_1")
    damage(tmp_path / "step_1")
    with pytest.raises(BundleError, match=message):
        verify_bundle(tmp_path / "step_1")


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from sc_lightning.checkpoint.atomic import write_atomically
    root = Path(sys.argv[1])
    for step in range(1, 10_000):
        with write_atomically(root / f"step_{step}") as tmp:
            for part in range(8):
                (tmp / f"part{part}.bin").write_bytes(bytes([step % 256]) * 65536)
        print(step, flush=True)
    """
)


@pytest.mark.parametrize("kill_after", [1, 3, 7])
def test_sigkill_mid_write_leaves_only_whole_bundles(tmp_path, kill_after: int) -> None:
    """Kill a writer looping over bundles; every bundle left verifies, and temporaries are swept on restart."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(kill_after):  # wait until kill_after bundles are reported written, then kill mid-stream
            assert writer.stdout.readline(), "the writer stopped early"
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.wait(timeout=60)
    bundles = complete_bundles(tmp_path)
    assert len(bundles) >= kill_after
    assert [n for n, _ in bundles] == list(range(1, len(bundles) + 1))
    for _, bundle in bundles:
        assert len(verify_bundle(bundle)) == 8
    remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for _, p in bundles)
