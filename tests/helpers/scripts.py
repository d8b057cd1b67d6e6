"""Scripts for the FAKE ScriptedEngine over the arithmetic and calculator tasks, in the character tokenizer the tests
share."""

from __future__ import annotations

from collections import Counter

from sc_lightning.tokenizer import CharTokenizer

TOKENIZER = CharTokenizer()


def answer_correctly(prompt: tuple[int, ...], call: int) -> tuple[int, ...]:
    """Script: the right answer to "a+b=" (so rewards are 1.0)."""
    text = TOKENIZER.decode(prompt)
    a, b = text.rstrip("=").split("+")
    return tuple(TOKENIZER.encode(str(int(a) + int(b))))


def calculator_user(prompt: tuple[int, ...], call: int) -> tuple[int, ...]:
    """Script for calculator conversations: repeat the expression as a calculator call, then answer with the tool's
    result."""
    if TOKENIZER.EOS not in prompt:  # the opening: call the calculator with the expression
        return (*prompt[1:-1], TOKENIZER.EOS)
    after_call = prompt[len(prompt) - prompt[::-1].index(TOKENIZER.EOS) :]  # the tool's answer and its "="
    return (*after_call[:-1], TOKENIZER.EOS)


class Alternating:
    """Script: the k-th generation of a prompt answers correctly when k is even, else one too many."""

    def __init__(self) -> None:
        self.seen: Counter = Counter()

    def __call__(self, prompt: tuple[int, ...], call: int) -> tuple[int, ...]:
        k = self.seen[prompt]
        self.seen[prompt] += 1
        a, b = TOKENIZER.decode(prompt).rstrip("=").split("+")
        return tuple(TOKENIZER.encode(str(int(a) + int(b) + k % 2)))
