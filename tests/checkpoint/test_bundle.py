"""The controller's files in a bundle round-trip, and a resume takes the newest bundle that verifies."""

from __future__ import annotations

import pytest

from sc_lightning.checkpoint.atomic import BundleError, write_atomically
from sc_lightning.checkpoint.bundle import (
    CONTROLLER_FILE,
    RECOVERY_FILE,
    REPLAY_INDEX_FILE,
    RESERVE_FILE,
    latest_bundle,
    read_controller_state,
    write_controller_files,
)
from tests.helpers.controller_state import STATE


def write(root, step: int, state: dict = STATE):
    with write_atomically(root / f"step_{step}") as directory:
        write_controller_files(directory, state)
    return root / f"step_{step}"


def test_controller_files_round_trip(tmp_path) -> None:
    bundle = write(tmp_path, 3)
    assert {p.name for p in bundle.iterdir()} == {CONTROLLER_FILE, REPLAY_INDEX_FILE, RECOVERY_FILE, "MANIFEST.json"}
    assert read_controller_state(bundle) == {**STATE, "replacement_reserve": []}  # no spares: no reserve file


def test_a_replacement_reserve_gets_its_own_file(tmp_path) -> None:
    spares = [{"prompt_id": "s0", "token_ids": [3]}, {"prompt_id": "s1", "token_ids": [4, 4]}]
    bundle = write(tmp_path, 3, {**STATE, "replacement_reserve": spares})
    assert (bundle / RESERVE_FILE).is_file()
    assert read_controller_state(bundle)["replacement_reserve"] == spares


def test_latest_bundle_is_the_newest_that_verifies_and_a_damaged_one_is_skipped_not_touched(tmp_path, caplog) -> None:
    assert latest_bundle(tmp_path / "missing") is None
    older = write(tmp_path, 2)
    newest = write(tmp_path, 10)  # numeric order: step_10 is newer than step_2
    (tmp_path / "tmp_step_11_deadbeef").mkdir()  # a crashed write never counts
    assert latest_bundle(tmp_path) == newest
    (newest / RECOVERY_FILE).write_bytes(b"torn")
    assert latest_bundle(tmp_path) == older
    assert f"skipping the damaged bundle {newest}" in caplog.text and f"{RECOVERY_FILE}: does not match" in caplog.text
    (older / CONTROLLER_FILE).unlink()  # half deleted
    with pytest.raises(BundleError, match=rf"every bundle in {tmp_path} is damaged.*Nothing was deleted"):
        latest_bundle(tmp_path)
    assert (newest / RECOVERY_FILE).read_bytes() == b"torn", "a resume deletes and rewrites nothing"


def test_an_unreadable_controller_file_is_named(tmp_path) -> None:
    bundle = write(tmp_path, 1)
    (bundle / CONTROLLER_FILE).write_text("{not json")
    with pytest.raises(BundleError, match=r"step_1: the controller state cannot be read"):
        read_controller_state(bundle)
