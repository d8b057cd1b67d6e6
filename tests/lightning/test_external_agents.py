"""An external agent drives a real fit: a plain HTTP client in a thread follows an agent's loop over the endpoint.

Everything is real: the Lightning Trainer and strategy, the controller, the colocated Megatron engine (builtin:tiny
on CPU), the endpoint. The agent takes a rollout, asks /v1/chat/completions, appends a tool's answer, asks again and
posts a reward; the trained rows must mask exactly the tool's (and the template's) tokens, carry the posted rewards,
and the engine's logprobs and token versions.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

import torch
from lightning.pytorch import Callback

from sc_lightning.engines.factory import default_engine_factory
from sc_lightning.lightning.module import GRPOModule
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.trainer.policy_update import PolicyUpdate
from tests.helpers.fits import tiny_config, tiny_trainer

TOKENIZER = CharTokenizer()


def call(url: str, body: dict | None = None) -> tuple[int, Any]:
    """One request with urllib (GET without a body, else POST of JSON): (status, JSON body or None)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def reward_of(sequence: list[int]) -> float:
    """The agent's verdict: a function of the whole conversation, so equal conversations get equal rewards."""
    return (sum(sequence) % 5) / 4


class Agent(Callback):
    """From the start of training, a thread plays an agent's loop on every rollout the endpoint hands out."""

    def __init__(self) -> None:
        self.finished: list[dict[str, Any]] = []  # one per rewarded rollout: its two turns and its reward
        self.refused: list[tuple[int, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Start the agent on the strategy's endpoint."""
        url = trainer.strategy.rollout_side.endpoint_url
        self._thread = threading.Thread(target=self.run, args=(url,), daemon=True)
        self._thread.start()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Stop taking rollouts (the controller closes those left) and wait for the thread, also after a failure."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)

    def run(self, url: str) -> None:
        """Take rollouts until stopped or the endpoint goes away."""
        try:
            while not self._stop.is_set():
                self.play(url)
        except (urllib.error.URLError, ConnectionError):  # no HTTP status: the endpoint stopped (mid-call: closed)
            return

    def play(self, url: str) -> None:
        """Take one rollout, if one comes: two model turns with a tool's answer between, then a reward."""
        status, rollout = call(f"{url}/rollouts/next?wait_s=0.5")
        if status == 204:
            return
        rid, messages, turns = rollout["rollout_id"], rollout["messages"], []
        tool = {"role": "tool", "content": str(sum(map(int, rollout["text"].rstrip("=").split("+"))))}
        for _ in range(2):
            status, answer = call(f"{url}/chat/completions", {"messages": messages, "rollout_id": rid})
            if status != 200:
                self.refused.append((status, answer))
                break
            turns.append(answer)
            messages = [*messages, answer["choices"][0]["message"], tool]
        last = turns[-1]["choices"][0] if turns else {"prompt_token_ids": [], "token_ids": []}
        reward = reward_of(last["prompt_token_ids"] + last["token_ids"])
        status, posted = call(f"{url}/rollouts/{rid}/reward", {"reward": reward})
        if status == 200:
            self.finished.append({"rollout": rollout, "turns": turns, "tool": tool, "reward": reward})
        else:
            self.refused.append((status, posted))


class RecordingModule(GRPOModule):
    """GRPOModule that keeps every chunk it trains."""

    def policy_update(self, **kwargs: Any) -> PolicyUpdate:
        """The usual update, recording each chunk before it trains."""
        update = super().policy_update(**kwargs)
        train = update.train_chunk
        self.__dict__.setdefault("trained", [])

        def record(chunk: Any) -> Any:
            self.trained.append(chunk)
            return train(chunk)

        update.train_chunk = record  # type: ignore[method-assign]
        return update


def expected_row(finished: dict[str, Any]) -> dict[str, list]:
    """A rollout's row as the agent saw it: tokens, the mask (1 on model tokens), logprobs and versions, and the
    environment tokens before each turn (the template's cue, then the agent's last message and the cue)."""
    context = finished["rollout"]["prompt_token_ids"]
    row = {"mask": [0] * len(context), "logprobs": [0.0] * len(context), "versions": [-1] * len(context)}
    row["between"] = []
    for answer in finished["turns"]:
        choice, versions = answer["choices"][0], answer["token_versions"]
        between = choice["prompt_token_ids"][len(context) :]
        version = row["versions"][-1] if row["between"] else versions[0]
        row["between"].append(between)
        row["mask"] += [0] * len(between) + [1] * len(versions)
        row["logprobs"] += [0.0] * len(between) + choice["logprobs"]["token_logprobs"]
        row["versions"] += [version] * len(between) + versions
        context = choice["prompt_token_ids"] + choice["token_ids"]
    row["tokens"] = context
    return row


def test_an_external_agent_over_chat_completions_produces_the_trained_groups() -> None:
    config = tiny_config(
        "grpo.max_num_steps=2",
        "policy.model_name=builtin:tiny",
        "env.name=external",
        "policy.generation.mcore_generation_config.expose_http_server=true",
        "async_rl.rollout_failure.rollout_timeout_s=300",
    )
    agent = Agent()
    trainer = tiny_trainer(config, default_engine_factory, [agent])
    module = RecordingModule(config)
    trainer.fit(module)

    assert trainer.global_step == 2
    rows = [(chunk, i) for chunk in module.trained for i in range(len(chunk))]
    assert len(rows) == 2 * 4 * 4  # 2 steps x 4 groups x 4 samples, each an agent's rollout
    by_tokens: dict[tuple[int, ...], list[dict]] = {}
    for finished in agent.finished:
        expected = expected_row(finished)
        by_tokens.setdefault(tuple(expected["tokens"]), []).append({**expected, "reward": finished["reward"]})
        tool_ids = TOKENIZER.encode(finished["tool"]["content"] + "=")  # the tool message as the template renders it
        assert all(between[-len(tool_ids) :] == tool_ids for between in expected["between"][1:])
    for chunk, i in rows:
        ids = chunk.input_ids[i].tolist()
        matches = [e for tokens, es in by_tokens.items() if ids[: len(tokens)] == list(tokens) for e in es]
        assert matches, f"trained row {ids} is no agent's rollout"
        expected, n = matches[0], len(matches[0]["tokens"])
        assert ids[n:] == [TOKENIZER.pad_token_id] * (len(ids) - n)
        assert chunk.token_mask[i].tolist() == expected["mask"] + [0] * (len(ids) - n)
        assert chunk.rewards[i].item() == expected["reward"]
        torch.testing.assert_close(chunk.generation_logprobs[i, :n], torch.tensor(expected["logprobs"]))
        assert chunk.token_versions[i, :n].tolist() == expected["versions"]
    assert {int(chunk.token_versions.max()) for chunk in module.trained} == {0, 1}  # each step's own weights
    assert agent.refused == []  # even turns whose text lost a special id continue from their exact tokens
    assert all(len(finished["turns"]) == 2 for finished in agent.finished)
