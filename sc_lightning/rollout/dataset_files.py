"""Dataset files read as records: a JSONL file, a Parquet file, or a directory written by ``datasets``' save_to_disk.

:func:`open_records` picks the reader by the path. Every reader gives the same two things (docs/datasets.md):

- :attr:`~RecordFile.columns`: the column names of its schema, or None for JSONL, which has none (each line may
  hold other keys);
- :meth:`~RecordFile.records`: every row as ``(where, record)``, ``where`` naming its place (``file:line`` for
  JSONL, the 0-based row index ``path[i]`` for the others) and ``record`` a mapping of plain, JSON-able values (an
  Arrow value JSON cannot hold, such as a date or a decimal, comes as its text; binary, such as an image's bytes, as
  a ``data:application/octet-stream;base64,...`` URI, the form a JSONL file gives an image in). A JSONL line that is
  not UTF-8 or not a JSON object comes as a :class:`BadRow` instead, so the caller counts it with the rows it refuses
  itself.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from sc_lightning.config.runtime import DATASET_FILES

BATCH_ROWS = 1024
"""Rows converted to Python at a time from a Parquet file or a saved dataset."""
BYTES_URI = "data:application/octet-stream;base64,"
"""What a binary Arrow value's base64 text follows in a record."""


class BadRow(ValueError):
    """One dataset row cannot be used; the message is the reason (the caller adds where the row is)."""


Record = Mapping[str, Any] | BadRow
"""One row: its values by column, or the BadRow saying why it cannot be read as a record."""


class DatasetFileError(ValueError):
    """A path is no dataset file this package reads, or it cannot be read; the message says why."""


class RecordFile(Protocol):
    """A dataset file's rows, read the same way whatever its format."""

    path: Path
    columns: tuple[str, ...] | None

    def records(self) -> Iterator[tuple[str, Record]]:
        """Every row as ``(where, record)``, in file order; DatasetFileError when the file cannot be read on."""


def open_records(path: str | Path) -> RecordFile:
    """The reader of the dataset at ``path`` (a directory: saved by ``save_to_disk``; else by its suffix);
    DatasetFileError when there is none."""
    path = Path(path)
    if not path.exists():
        raise DatasetFileError(f"no such file or directory (looked in {path.absolute().parent})")
    if not os.access(path, os.R_OK):
        raise DatasetFileError("cannot be read (permission denied); make it readable")
    if path.is_dir():
        return SavedDataset(path)
    if path.suffix == ".parquet":
        return ParquetRecords(path)
    if path.suffix == ".jsonl":
        return JsonlRecords(path)
    raise DatasetFileError(f"is not {DATASET_FILES}")


class JsonlRecords:
    """A JSONL file: one JSON object per line, blank lines skipped; a byte-order mark may open the file."""

    columns = None

    def __init__(self, path: Path) -> None:
        self.path = path

    def records(self) -> Iterator[tuple[str, Record]]:
        """Each non-blank line as ``("file:line", object)``, or a BadRow when it is not UTF-8 or not an object."""
        try:
            lines = self.path.read_bytes().splitlines()
        except OSError as err:
            raise DatasetFileError(str(err)) from err
        for lineno, line in enumerate(lines, start=1):
            if line.strip():
                yield f"{self.path}:{lineno}", _json_object(line, first=lineno == 1)


def _json_object(line: bytes, *, first: bool) -> Record:
    """The JSON object on ``line``, or the BadRow saying why there is none."""
    try:
        decoded = line.decode("utf-8-sig" if first else "utf-8")
    except UnicodeDecodeError as err:
        return BadRow(f"not valid UTF-8: {err}")
    try:
        record = json.loads(decoded)
    except json.JSONDecodeError as err:
        return BadRow(f"not valid JSON: {err}")
    except RecursionError:
        return BadRow("nested too deeply to read (a JSON value inside thousands of others)")
    if not isinstance(record, dict):
        return BadRow(f"expected a JSON object, got {type(record).__name__}")
    return record


class ParquetRecords:
    """A Parquet file, read with pyarrow a batch of rows at a time."""

    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq  # lazy: pyarrow is only needed for Parquet and saved datasets

        self.path = path
        try:
            self._file = pq.ParquetFile(path)
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise DatasetFileError(f"is not a Parquet file pyarrow can read: {err}") from None
        self.columns: tuple[str, ...] | None = tuple(self._file.schema_arrow.names)

    def records(self) -> Iterator[tuple[str, Record]]:
        """Each row as ``("path[i]", record)``."""
        return _arrow_records(self.path, self._file.iter_batches(batch_size=BATCH_ROWS))


class SavedDataset:
    """A directory written by ``datasets.Dataset.save_to_disk`` (one split), read with ``datasets.load_from_disk``."""

    def __init__(self, path: Path) -> None:
        from datasets import Dataset, load_from_disk  # lazy: the datasets library takes seconds to import

        self.path = path
        try:
            loaded = load_from_disk(str(path))
        except (OSError, ValueError) as err:
            raise DatasetFileError(f"is a directory that datasets' load_from_disk cannot read: {err}") from None
        if not isinstance(loaded, Dataset):
            splits = list(loaded)
            raise DatasetFileError(
                f"holds a DatasetDict of the splits {', '.join(splits)}; give one split's directory, such as "
                f"{path / splits[0]}"
            )
        self._dataset = loaded
        self.columns: tuple[str, ...] | None = tuple(loaded.column_names)

    def records(self) -> Iterator[tuple[str, Record]]:
        """Each row as ``("path[i]", record)``."""
        return _arrow_records(self.path, self._dataset.with_format("arrow").iter(batch_size=BATCH_ROWS))


def _arrow_records(path: Path, batches: Iterable[Any]) -> Iterator[tuple[str, Record]]:
    """The rows of Arrow ``batches`` (record batches or tables) as plain records, numbered from 0."""
    index = 0
    try:
        for batch in batches:
            for row in batch.to_pylist():
                yield f"{path}[{index}]", {str(key): _plain(value) for key, value in row.items()}
                index += 1
    except (OSError, ValueError) as err:  # a damaged page or shard after the schema read fine
        raise DatasetFileError(f"{path}[{index}] cannot be read: {err}") from err


def _plain(value: Any) -> Any:
    """``value`` as JSON-able plain data: containers converted through, bytes as a base64 ``data:`` URI, anything
    else JSON cannot hold as its text."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, bytes):
        return BYTES_URI + base64.b64encode(value).decode("ascii")
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return str(value)
