"""Crash-safe directories: write into a temporary sibling, fsync, rename; verify every file on the way back.

A bundle (a trainer checkpoint ``step_N``, a rollout snapshot ``snapshot_NNNNNN``) is either complete or absent:

- :func:`write_atomically` (or :class:`AtomicDirectory`, to commit from another thread) yields a private temporary
  directory next to the final one; when the block ends without an exception it writes ``MANIFEST.json`` (every
  file's size and SHA-256), fsyncs every file and directory of the tree, renames it to its final name and fsyncs
  the parent, so a crash at any moment leaves either no bundle or a whole one.
  An exception removes the temporary directory; a full disk is a :class:`BundleError` naming the bundle (the
  earlier bundles are untouched). A final name that exists already is an error (bundles are immutable), unless
  what stands there is damaged: it is then moved aside to ``<name>.damaged-<id>``, never deleted;
- :func:`verify_bundle` re-reads a bundle against its manifest; a missing, truncated or altered file is a
  :class:`BundleError` naming the file and what to do. The manifest also holds the bundle's layout version
  (:data:`BUNDLE_FORMAT`; a manifest without one is format 1): one written by a newer sc_lightning is a
  :class:`BundleFormatError`, never taken for damage;
- :func:`complete_bundles` lists the bundles of a directory (temporaries never count), and
  :func:`remove_stale_temporaries` deletes the temporaries a crash left behind.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

MANIFEST = "MANIFEST.json"
BUNDLE_FORMAT = 1
"""The layout version of the bundles and snapshots this code writes (in their manifest); it reads no newer one."""
TEMPORARY_PREFIX = "tmp_"
DAMAGED_INFIX = ".damaged-"
log = logging.getLogger(__name__)


class BundleError(RuntimeError):
    """A bundle is incomplete or corrupt, or would overwrite another; the message names the file."""


class BundleFormatError(BundleError):
    """A bundle was written in a newer layout than this code reads; the message names both versions."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


class AtomicDirectory:
    """A temporary directory next to ``final`` that :meth:`commit` turns into ``final``, whole, or :meth:`abort` drops.

    ``commit`` writes the manifest, fsyncs every file and directory, renames and fsyncs the parent; it may run on
    another thread than the one that filled the directory.
    """

    def __init__(self, final: Path) -> None:
        if final.exists():
            _move_aside_if_damaged(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        self.final = final
        self.path = final.parent / f"{TEMPORARY_PREFIX}{final.name}_{uuid.uuid4().hex[:8]}"
        self.path.mkdir()

    def commit(self) -> Path:
        """Manifest, fsync, rename: the bundle appears at ``final`` complete (or not at all)."""
        try:
            files = {
                str(p.relative_to(self.path)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                for p in _files(self.path)
            }
            manifest = {"format": BUNDLE_FORMAT, "files": files}
            (self.path / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            for path in sorted(self.path.rglob("*"), reverse=True):  # files before the directories holding them
                _fsync(path)
            _fsync(self.path)
            os.rename(self.path, self.final)
            _fsync(self.final.parent)
        except BaseException as err:
            self.abort()
            _raise_if_disk_full(err, self.final)
            raise
        return self.final

    def abort(self) -> None:
        """Remove the temporary directory (nothing appears at ``final``)."""
        shutil.rmtree(self.path, ignore_errors=True)


@contextlib.contextmanager
def write_atomically(final: Path) -> Iterator[Path]:
    """Yield a temporary directory; on success it becomes ``final``, whole, with a manifest of its files."""
    directory = AtomicDirectory(final)
    try:
        yield directory.path
    except BaseException as err:
        directory.abort()
        _raise_if_disk_full(err, final)
        raise
    directory.commit()


def _raise_if_disk_full(err: BaseException, final: Path) -> None:
    """A BundleError naming ``final`` when ``err`` is a full disk (the caller has removed the temporary)."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        raise BundleError(
            f"{final}: the disk is full ({err.strerror}); nothing of this bundle was kept and the earlier bundles "
            f"are intact: free space under {final.parent} (or set checkpointing.keep_top_k) and run again"
        ) from err


def _move_aside_if_damaged(final: Path) -> None:
    """Make room for a new bundle at ``final`` where a damaged one stands (moved aside, never deleted); a
    BundleError where a valid one does (bundles are immutable)."""
    try:
        verify_bundle(final)
    except BundleFormatError:
        raise BundleError(
            f"{final} exists already, written by a newer sc_lightning; bundles are never overwritten"
        ) from None
    except BundleError as damage:
        aside = final.with_name(f"{final.name}{DAMAGED_INFIX}{uuid.uuid4().hex[:8]}")
        os.rename(final, aside)
        log.warning("a damaged bundle stood where %s goes (%s): moved to %s, kept", final, damage, aside)
        return
    raise BundleError(f"{final} exists already; bundles are never overwritten")


def verify_bundle(bundle: Path) -> dict[str, dict[str, int | str]]:
    """Check every file of ``bundle`` against its manifest; returns the manifest's file table."""
    manifest = bundle / MANIFEST
    try:
        written = json.loads(manifest.read_text())
        files, layout = written["files"], written.get("format", 1)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise BundleError(
            f"{manifest}: missing or unreadable ({err}); the bundle is incomplete or corrupt — resume from an "
            "earlier one or remove it"
        ) from None
    if not isinstance(layout, int) or layout > BUNDLE_FORMAT:
        raise BundleFormatError(
            f"{bundle} was written in bundle format {layout!r} by a newer sc_lightning; this one reads format "
            f"{BUNDLE_FORMAT} and older: resume with the sc_lightning that wrote it (nothing was deleted)"
        )
    for name, expected in files.items():
        path = bundle / name
        if not path.is_file():
            raise BundleError(f"{path}: listed in {MANIFEST} but missing; resume from an earlier bundle")
        if path.stat().st_size != expected["bytes"] or _sha256(path) != expected["sha256"]:
            raise BundleError(
                f"{path}: does not match {MANIFEST} (truncated or altered: {path.stat().st_size} bytes, "
                f"expected {expected['bytes']}); resume from an earlier bundle"
            )
    return files


def is_intact(bundle: Path) -> bool:
    """Whether ``bundle`` verifies against its manifest (:func:`verify_bundle`)."""
    try:
        verify_bundle(bundle)
    except BundleFormatError:
        raise
    except BundleError:
        return False
    return True


def newest_intact(candidates: Sequence[Path], what: str) -> tuple[Path | None, list[str]]:
    """The newest of ``candidates`` (oldest first) that verifies, and why each newer one was skipped: a damaged one is
    named in a warning (as ``what``) and kept as it is; one of a newer format stops the search (BundleFormatError)."""
    damaged: list[str] = []
    for path in reversed(candidates):
        try:
            verify_bundle(path)
        except BundleFormatError:
            raise  # not damaged: written by a newer sc_lightning, which must resume it
        except BundleError as err:
            log.warning("skipping the damaged %s %s (kept as is): %s", what, path, err)
            damaged.append(str(err))
            continue
        return path, damaged
    return None, damaged


def complete_bundles(root: Path, pattern: str = r"step_(\d+)") -> list[tuple[int, Path]]:
    """``(number, path)`` of the bundles in ``root`` named like ``pattern``, in increasing order."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = re.fullmatch(pattern, path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def remove_stale_temporaries(root: Path) -> list[Path]:
    """Delete the temporary directories an interrupted write left in ``root``; returns what was removed."""
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(TEMPORARY_PREFIX)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale
