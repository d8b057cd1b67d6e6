"""benchmarks/step_profile.py: the device's idle gaps from its busy intervals, and a profiled block's summary."""

from __future__ import annotations

import gc

import torch
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.step_profile import format_summary, gap_buckets, idle_gaps, merged, profiled

intervals = st.lists(
    st.tuples(st.integers(0, 1000), st.integers(0, 200)).map(lambda t: (float(t[0]), float(t[0] + t[1]))), max_size=30
)


@given(intervals, st.integers(0, 600), st.integers(0, 600))
def test_idle_and_busy_time_add_up_to_the_window(spans: list[tuple[float, float]], start: int, length: int) -> None:
    union = merged(spans)
    assert all(a[1] < b[0] for a, b in zip(union, union[1:], strict=False))  # disjoint, in order
    end = start + length
    covered = sum(max(0.0, min(e, end) - max(s, start)) for s, e in union)
    gaps = idle_gaps(union, start, end)
    assert all(gap > 0 for gap in gaps)
    assert sum(gaps) + covered == length
    # a point of the window lies in a gap exactly when no interval holds it
    idle_points = sum(1 for t in range(start, end) if not any(s <= t + 0.5 < e for s, e in spans))
    assert idle_points == round(sum(gaps))


def test_overlapping_kernels_count_once_and_gaps_fall_in_their_buckets() -> None:
    union = merged([(0.0, 50.0), (10.0, 20.0), (40.0, 100.0), (2_000.0, 2_100.0)])
    assert union == [(0.0, 100.0), (2_000.0, 2_100.0)]
    gaps = idle_gaps(union, 0.0, 152_100.0)  # us
    assert gaps == [1_900.0, 150_000.0]
    buckets = gap_buckets(gaps)
    assert buckets[">=1 ms"] == {"count": 1, "s": 0.0019} and buckets[">=100 ms"] == {"count": 1, "s": 0.15}
    assert buckets[">=0.1 ms"]["count"] == buckets[">=10 ms"]["count"] == 0


def test_a_profiled_block_reports_its_wall_time_host_calls_and_garbage_collections() -> None:
    with profiled(torch.device("cpu")) as summary:
        a = torch.randn(64, 64)
        for _ in range(5):
            a = a @ a.T / 64
        gc.collect()  # a full collection, as the collector may run one in the middle of a training step
    result = summary()
    assert result["wall_s"] > 0 and "device_busy_s" not in result  # no device activity on the CPU
    assert result["calls"]["aten::mm"] == 5 and ("aten::mm", 5) in [(name, n) for name, _, n in result["host"]]
    assert result["gc"]["collections"][2] >= 1 and result["gc"]["seconds"][2] > 0
    assert result["gc"]["tracked_objects"] > 1000
    text = format_summary("block", result)
    assert "aten::mm" in text and "garbage collections by generation 0/1/2" in text
