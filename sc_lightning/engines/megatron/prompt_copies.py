"""Rows of one prompt prefill it once: the others copy its K/V from the row that wrote them.

A GRPO step asks each prompt for several completions at once (16 in the shipped configs); each is a row of the
engine's batch with the same prompt, whose K/V at the prompt's positions are the same (the same tokens at the same
positions under the same weights). Prefilling them once and copying the cache rows costs a memory copy per row
instead of a forward over the prompt, which grows with the prompt: a 2K-token prompt costs ~5 TFLOP of prefill at
1.26B parameters, its K/V 200 MB to copy.

:func:`prompt_copies` plans a step's prefill: a waiting row whose prompt another row has written copies it (the
positions ``0 .. len(prompt) - 2``: a decode step feeds the prompt's last token, as for any row); a fresh row whose
prompt another waiting row is prefilling waits for it, then copies (the batch plans again right after a prefill
chunk, so the rows of a prompt that one chunk prefills whole all decode in that step); the rest prefill. A prompt
with images never takes a copy (the same ids stand for other pictures), and the engine checks each copy's prompts
are the same.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def prompt_copies(
    prompts: Sequence[tuple[Hashable, int] | None], cached: Sequence[int], waiting: Sequence[int]
) -> tuple[list[tuple[int, int, int]], list[int]]:
    """Plan the prefill of rows ``waiting`` (indices, oldest first) given each row's prompt ``(key, positions to
    share)`` (None: a prompt that never shares) and the positions ``cached`` in its slot: the ``(source, target,
    positions)`` copies to make, and the rows to prefill (in ``waiting``'s order; a copied row that still waits for
    more positions, such as one re-prefilling its own sampled tokens, prefills them after its copy)."""
    written: dict[Hashable, int] = {}
    for row, (prompt, done) in enumerate(zip(prompts, cached, strict=True)):
        if prompt is not None and prompt[1] > 0 and done >= prompt[1]:
            written.setdefault(prompt[0], row)
    prefilling = {prompts[i][0] for i in waiting if (p := prompts[i]) is not None and 0 < cached[i] < p[1]}
    copies: list[tuple[int, int, int]] = []
    prefill: list[int] = []
    for row in waiting:
        prompt = prompts[row]
        if prompt is None or prompt[1] == 0 or cached[row] > 0:
            prefill.append(row)
        elif (source := written.get(prompt[0])) is not None:
            copies.append((source, row, prompt[1]))
            prefill.append(row)
        elif prompt[0] not in prefilling:
            prefilling.add(prompt[0])
            prefill.append(row)
    return copies, prefill
