"""The engine's split decode-attention kernel on the CPU, through Triton's interpreter (``TRITON_INTERPRET=1``).

The interpreter runs the very kernel source with numpy, so its arithmetic and indexing (which positions a split
reads, how the splits' softmaxes merge) are checked here; its speed is measured on a GPU
(``benchmarks/decode_attention.py``) and its bf16 path by ``tests/gpu/test_engine_gpu.py``. The interpreter has no
bf16, so these cases run in fp16. It is chosen when Triton is imported, hence a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = """
import json, sys
import torch
from sc_lightning.engines.megatron import decode_kernels

errors = []
for hpg, dim, split, block, cache_dtype in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(hpg * 1000 + split)
    rows, groups, length = 5, 2, 150
    cache = torch.randn(6, length, groups, 2, dim, generator=g).to(getattr(torch, cache_dtype))
    query = torch.randn(rows, groups, hpg, dim, generator=g).half()
    positions = torch.tensor([0, 31, 32, 100, 149])
    beyond = positions[:, None] < torch.arange(1, length)
    cache = cache.float()
    cache[:rows, 1:][beyond] = float("nan")  # positions past a row's own are never read
    cache[rows:] = float("nan")  # nor are other slots
    cache = cache.to(getattr(torch, cache_dtype))
    got = decode_kernels.decode_attention(query, cache, positions, dim**-0.5, split=split, block=block)
    worst = 0.0
    for r, p in enumerate(positions.tolist()):
        seen = cache[r, : p + 1].float()
        scores = torch.einsum("ghd,ngd->ghn", query[r].float(), seen[:, :, 0]) * dim**-0.5
        expected = torch.einsum("ghn,ngd->ghd", scores.softmax(-1), seen[:, :, 1]).reshape(-1)
        error = (got[r, 0].float() - expected).abs().max().item()
        worst = max(worst, error if error == error else float("inf"))  # a NaN read is the worst error
    errors.append(worst)
print(json.dumps(errors))
"""


def interpreted_errors(script: str, cases: list) -> list[float]:
    """Run ``script`` on ``cases`` in a child process under Triton's interpreter: each case's worst error."""
    child = subprocess.run(
        [sys.executable, "-c", script, json.dumps(cases)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    errors = json.loads(child.stdout.strip().splitlines()[-1])
    assert len(errors) == len(cases)
    return errors


def test_split_decode_attention_equals_softmax_attention_over_each_rows_own_positions() -> None:
    """At the 1.26B shape's groups (2 query heads of 128) and Llama-3.2-1B's (4 of 64): splits of 16 and 32
    positions (several per row, a row ending mid-split and on a split's edge) and one split longer than the cache
    (the unsplit kernel) all equal attention computed in fp32 over positions ``0..p`` of the row's own slot, and so
    does an fp8 cache (its values, converted for the products); positions beyond ``p`` and other slots hold NaN, so
    reading one would show."""
    cases = [(hpg, dim, split, 16, "float16") for hpg, dim in [(2, 128), (4, 64)] for split in (16, 32)]
    cases += [(2, 128, 256, 64, "float16"), (2, 128, 32, 16, "float8_e4m3fn")]  # unsplit; an fp8 cache
    for case, error in zip(cases, interpreted_errors(CHILD, cases), strict=True):
        assert error < 2e-3, (case, error)  # fp16 inputs, fp32 accumulation


PAGED_CHILD = """
import json, sys
import torch
from sc_lightning.engines.megatron import decode_kernels

errors = []
for hpg, dim, split, cache_dtype in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(hpg * 1000 + split)
    rows, groups, block, max_blocks = 4, 2, 16, 6
    positions = torch.tensor([0, 15, 40, 95])  # within a block, on a block's edge, several blocks, the last
    held = [(p.item() + 1 + block - 1) // block for p in positions]
    order = torch.randperm(1 + sum(held), generator=g).tolist()
    order.remove(0)  # block 0 is scratch: never a row's
    blocks = torch.randn(1 + sum(held), block, groups, 2, dim, generator=g)
    blocks[0] = float("nan")  # read only through a table entry a row has not filled: never
    tables = torch.zeros(rows, max_blocks, dtype=torch.int32)
    for r, n in enumerate(held):
        tables[r, :n] = torch.tensor([order.pop() for _ in range(n)], dtype=torch.int32)
        seen = positions[r] + 1
        last = tables[r, n - 1]
        blocks[last, seen - (n - 1) * block :] = float("nan")  # past the row's own position: never read
    cache = blocks.to(getattr(torch, cache_dtype))
    query = torch.randn(rows, groups, hpg, dim, generator=g).half()
    got = decode_kernels.decode_attention(query, cache, positions, dim**-0.5, split=split, block=block, tables=tables)
    worst = 0.0
    for r, p in enumerate(positions.tolist()):
        seen = torch.cat([cache[b] for b in tables[r, : held[r]].tolist()])[: p + 1].float()
        scores = torch.einsum("ghd,ngd->ghn", query[r].float(), seen[:, :, 0]) * dim**-0.5
        expected = torch.einsum("ghn,ngd->ghd", scores.softmax(-1), seen[:, :, 1]).reshape(-1)
        error = (got[r, 0].float() - expected).abs().max().item()
        worst = max(worst, error if error == error else float("inf"))
    errors.append(worst)
print(json.dumps(errors))
"""


def test_a_paged_cache_is_read_through_each_rows_block_table() -> None:
    """Rows whose positions lie in scattered blocks of a pool (a paged cache): each row's attention equals softmax
    attention over its own positions gathered through its table; the scratch block and positions past a row's own
    hold NaN, so reading one would show. Splits of one block and of two."""
    cases = [(2, 128, 16, "float16"), (4, 64, 32, "float16"), (2, 128, 32, "float8_e4m3fn")]
    for case, error in zip(cases, interpreted_errors(PAGED_CHILD, cases), strict=True):
        assert error < 2e-3, (case, error)
