"""Data-plane throughput: put and get of both backends against a plain memcpy of the same bytes.

Payload: one field ``input_ids`` of jagged int32 rows, lengths uniform in [1024, 3072] (256 rows = about 2 MiB;
also 2048 rows = about 16 MiB). Every figure is the median over ``--reps`` timed repetitions after ``--warmup``
untimed ones; each repetition puts fresh keys, gets them back in key order, then clears them (not timed).

Baseline ("memcpy"): ``dst.copy_(src)`` of one contiguous int32 buffer holding the same bytes into a preallocated
buffer of the same size, in a tight loop: ``--reps`` copies just before the memory backend's repetitions and as many
just after, each run after 25 untimed copies (so that it is cache-warm), the median of all (so that load drift on
the shared machine hits it and the backend alike). Also shown for context: "gather" = ``torch.cat(rows)``, the
cost of merely collecting the jagged rows into one new buffer, which any store given one tensor per row must pay;
"row views" = ``buffer.unsafe_split_with_sizes(lengths)``, the cost of merely creating one tensor per row (the
cheapest torch op for it), which any get must pay.

The memory backend is measured with the field given in two forms, alternating repetition by repetition: "rows", a
list of per-row tensors, and "packed", one jagged ``torch.nested`` tensor (layout ``torch.jagged``) over one buffer,
built once before timing. Get returns per-row tensors either way (the contract), so it is the same operation twice.

TQ raw: ``transfer_queue.kv_batch_put`` of a prebuilt wire TensorDict and ``kv_batch_get`` of the same rows, on
the same running TransferQueue, interleaved with the wrapper's repetitions (the target is measured against these).
The wrapper's put includes copying the per-row tensors into that TensorDict; its get includes the strictness
checks and the split back into rows. For context, "raw + nesting" / "raw + unbind" add what a caller holding
per-row tensors pays with torch's own API (``torch.nested.as_nested_tensor`` before the put, ``unbind`` after).

The memory backend and memcpy are measured first, before Ray and TransferQueue start (their idle processes take
CPU time on a 2-core machine); then TransferQueue.

Run: ``python benchmarks/data_plane.py`` (``--skip-tq`` for the memory backend only). Targets: memory put and get
>= 50% of memcpy throughput; the TransferQueue backend adds <= 10% over the raw calls (measured as the median of
per-repetition ratios of adjacent wrapper and raw repetitions).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sc_lightning.data_plane.memory import MemoryDataPlane  # noqa: E402
from sc_lightning.data_plane.wire import to_wire  # noqa: E402

MIB = 2**20
TIGHT_WARMUP = 25
"""Untimed calls before a tight loop: at 16 MiB a copy needs about 20 repetitions to reach its cache-warm speed."""


def make_rows(num_rows: int, seed: int = 0) -> list[torch.Tensor]:
    """Jagged int32 token rows, lengths uniform in [1024, 3072]."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1024, 3073, (num_rows,), generator=gen).tolist()
    return [torch.randint(0, 150_000, (length,), generator=gen, dtype=torch.int32) for length in lengths]


def timings(fn: Callable[[], object], reps: int, warmup: int) -> list[float]:
    """Wall times of ``reps`` calls of ``fn`` after ``warmup`` untimed calls; results are freed outside the clock."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        del result  # as in the put/get cycle, where the caller frees what get returned after the clock stops
    return times


def median_seconds(fn: Callable[[], object], reps: int, warmup: int) -> float:
    """Median wall time of ``fn`` over ``reps`` calls after ``warmup`` untimed calls."""
    return statistics.median(timings(fn, reps, warmup))


def check_rows(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    """Fail loudly if a backend returned different rows than were put."""
    same = len(got) == len(want) and all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want))  # noqa: B905
    if not same:
        raise SystemExit(f"{what}: rows read back differ from the rows put")


class PutGet:
    """Times put and get of fresh keys on one store; the clear between repetitions is not timed."""

    def __init__(
        self,
        name: str,
        put: Callable,
        get: Callable,
        clear: Callable,
        rows: list[torch.Tensor],
        to_rows: Callable = lambda got: got,
    ) -> None:
        self.name, self._put, self._get, self._clear, self.rows = name, put, get, clear, rows
        self._to_rows = to_rows  # turns what get returned into rows, for the one untimed correctness check
        self.put_times: list[float] = []
        self.get_times: list[float] = []
        self._rep = 0

    def run_once(self, timed: bool) -> None:
        """One put + get + clear of ``len(rows)`` fresh keys."""
        keys = [f"{self.name}/{self._rep}/{i}" for i in range(len(self.rows))]
        self._rep += 1
        start = time.perf_counter()
        self._put(keys)
        middle = time.perf_counter()
        got = self._get(keys)
        end = time.perf_counter()
        if self._rep == 1:
            check_rows(self._to_rows(got), self.rows, self.name)
        self._clear(keys)
        if timed:
            self.put_times.append(middle - start)
            self.get_times.append(end - middle)

    def medians(self) -> tuple[float, float]:
        """Median put and get seconds."""
        return statistics.median(self.put_times), statistics.median(self.get_times)

    def overhead_over(self, other: PutGet) -> tuple[float, float]:
        """Median over repetitions of (this / other - 1) for put and get: paired, so load drift cancels."""
        put = statistics.median(a / b - 1 for a, b in zip(self.put_times, other.put_times, strict=True))
        get = statistics.median(a / b - 1 for a, b in zip(self.get_times, other.get_times, strict=True))
        return put, get


def interleave(runners: list[PutGet], reps: int, warmup: int) -> None:
    """Alternate the runners (and their order) repetition by repetition so drifting load hits them alike."""
    for rep in range(warmup + reps):
        for runner in runners if rep % 2 == 0 else runners[::-1]:
            runner.run_once(timed=rep >= warmup)


def memory_runner(rows: list[torch.Tensor], packed: bool) -> PutGet:
    """The memory backend, given the field as per-row tensors or (``packed``) as one jagged nested tensor."""
    plane = MemoryDataPlane("bench")
    column = torch.nested.as_nested_tensor(rows, layout=torch.jagged) if packed else rows
    return PutGet(
        "memory-packed" if packed else "memory-rows",
        lambda keys: plane.put(keys, {"input_ids": column}),
        # packed in, packed out (get_packed); per-row tensors in, per-row tensors out (get)
        (lambda keys: plane.get_packed(keys, ["input_ids"])["input_ids"])
        if packed
        else (lambda keys: plane.get(keys, ["input_ids"])["input_ids"]),
        plane.clear,
        rows,
        to_rows=(lambda got: got.rows()) if packed else (lambda got: got),
    )


def tq_runners(rows: list[torch.Tensor], plane: object) -> list[PutGet]:
    """The TransferQueue backend and raw TransferQueue KV calls on the same running TransferQueue."""
    import transfer_queue as tq
    from tensordict import TensorDict

    from sc_lightning.data_plane.wire import wire_to_rows

    wire = to_wire({"input_ids": rows}, len(rows))  # built once: raw calls get the wire form for free
    raw = PutGet(
        "tq-raw",
        lambda keys: tq.kv_batch_put(keys=keys, partition_id="bench-raw", fields=wire),
        lambda keys: tq.kv_batch_get(keys=keys, partition_id="bench-raw", select_fields=["input_ids"]),
        lambda keys: tq.kv_clear(keys=keys, partition_id="bench-raw"),
        rows,
        to_rows=lambda got: wire_to_rows("input_ids", got["input_ids"]),
    )
    raw_rows = PutGet(  # what a caller with per-row tensors pays using torch's own jagged API around raw calls
        "tq-raw-rows",
        lambda keys: tq.kv_batch_put(
            keys=keys,
            partition_id="bench-raw",
            fields=TensorDict({"input_ids": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}, [len(keys)]),
        ),
        lambda keys: tq.kv_batch_get(keys=keys, partition_id="bench-raw", select_fields=["input_ids"])[
            "input_ids"
        ].unbind(),
        lambda keys: tq.kv_clear(keys=keys, partition_id="bench-raw"),
        rows,
    )
    wrapped = PutGet(
        "tq-backend",
        lambda keys: plane.put(keys, {"input_ids": rows}),
        lambda keys: plane.get(keys, ["input_ids"])["input_ids"],
        plane.clear,
        rows,
    )
    return [wrapped, raw, raw_rows]


def rate(nbytes: int, seconds: float) -> str:
    """MiB/s, right-aligned."""
    return f"{nbytes / MIB / seconds:10.1f}"


def main() -> None:
    """Parse arguments, run every case, print a table per case."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[256, 2048], help="row counts to run")
    parser.add_argument("--reps", type=int, default=50, help="timed repetitions for memcpy and the memory backend")
    parser.add_argument("--tq-reps", type=int, default=31, help="timed repetitions for TransferQueue")
    parser.add_argument("--warmup", type=int, default=3, help="untimed repetitions first")
    parser.add_argument("--skip-tq", action="store_true", help="only memcpy and the memory backend")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads in this process")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cases = [measure_memory(num_rows, args) for num_rows in args.rows]  # before Ray starts: its idle processes
    plane = None  # take CPU time on a 2-core machine, which is noise for an in-process store
    if not args.skip_tq:
        from sc_lightning.data_plane.tq_runtime import cpu_cores
        from sc_lightning.data_plane.transfer_queue import TransferQueueDataPlane

        plane = TransferQueueDataPlane("bench", storage_capacity=None, num_storage_units=1)
        print(f"TransferQueue: 1 storage unit, TQ_NUM_THREADS={cpu_cores()} (cores), Ray on this machine")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    print("memcpy = dst.copy_(src), src one contiguous int32 buffer of the same bytes, dst preallocated")
    print("gather = torch.cat(rows): collecting the jagged rows into one new buffer (context only)")
    print("row views = src.unsafe_split_with_sizes(lengths): one tensor per row, nothing copied (context only)")
    print("rows = field given as a list of per-row tensors; packed = as one jagged nested tensor (built untimed)")
    print("memory backend and memcpy measured before Ray/TransferQueue start\n")
    try:
        for case in cases:
            report(case, args, plane)
    finally:
        if plane is not None:
            plane.close()


def measure_memory(num_rows: int, args: argparse.Namespace) -> dict:
    """Time memcpy, the context operations and the memory backend for one payload size."""
    rows = make_rows(num_rows)
    src = torch.cat(rows)
    warm = max(args.warmup, TIGHT_WARMUP)
    gather = median_seconds(lambda: torch.cat(rows), args.reps, warm)
    lengths = [row.shape[0] for row in rows]
    views = median_seconds(lambda: src.unsafe_split_with_sizes(lengths), args.reps, warm)
    dst = torch.empty_like(src)
    memcpy_times = timings(lambda: dst.copy_(src), args.reps, warm)
    memory = [memory_runner(rows, packed=False), memory_runner(rows, packed=True)]
    interleave(memory, args.reps, args.warmup)
    memcpy_times += timings(lambda: dst.copy_(src), args.reps, warm)  # before and after: halves the drift
    (rows_put, rows_get), (packed_put, packed_get) = (runner.medians() for runner in memory)
    return {
        "rows": rows,
        "memcpy": statistics.median(memcpy_times),
        "lines": [
            ("gather (torch.cat)", gather),
            ("row views (split)", views),
            ("memory put (rows)", rows_put),
            ("memory get (rows)", rows_get),
            ("memory put (packed)", packed_put),
            ("memory get (packed)", packed_get),
        ],
        "forms": [("rows", rows_put, rows_get), ("packed", packed_put, packed_get)],
    }


def report(case: dict, args: argparse.Namespace, plane: object) -> None:
    """Measure TransferQueue (if running) for one payload size and print the case's table."""
    rows, memcpy = case["rows"], case["memcpy"]
    nbytes = sum(row.numel() for row in rows) * 4
    print(f"== {len(rows)} rows, {nbytes // 4} int32 tokens, {nbytes / MIB:.2f} MiB ==")
    print(f"{'operation':<26}{'median ms':>10}{'MiB/s':>10}{'vs memcpy':>11}")
    lines = [("memcpy (baseline)", memcpy), *case["lines"]]
    if plane is not None:
        runners = tq_runners(rows, plane)
        interleave(runners, args.tq_reps, args.warmup)
        (tq_put, tq_get), (raw_put, raw_get), (nest_put, unbind_get) = (runner.medians() for runner in runners)
        (over_put, over_get), (conv_put, conv_get) = (runners[0].overhead_over(other) for other in runners[1:])
        lines += [("TQ backend put", tq_put), ("TQ backend get", tq_get), ("TQ raw kv_batch_put", raw_put)]
        lines += [("TQ raw kv_batch_get", raw_get), ("TQ raw put + nesting", nest_put)]
        lines.append(("TQ raw get + unbind", unbind_get))
    for name, seconds in lines:
        print(f"{name:<26}{seconds * 1e3:10.3f}{rate(nbytes, seconds)}{memcpy / seconds:10.1%}")
    for form, put, get in case["forms"]:
        print(f"memory ({form}): put / memcpy = {memcpy / put:.1%}   get / memcpy = {memcpy / get:.1%}", end="")
        print("   (target >= 50%)")
    if plane is not None:
        print(f"TQ put / memcpy = {memcpy / tq_put:.2%}   TQ get / memcpy = {memcpy / tq_get:.2%}")
        print(f"TQ backend overhead vs raw: put {over_put:+.1%}   get {over_get:+.1%}   (target <= +10%)")
        print(f"  vs raw + torch's jagged conversion: put {conv_put:+.1%}   get {conv_get:+.1%}")
        print("  (medians of per-repetition ratios; the runners alternate, so machine-load drift cancels)")
    print()


if __name__ == "__main__":
    main()
