"""The report's "Sampled answers" section: the first and the last step of the run's ``samples/`` record.

Each step shows its recorded prompts (``data.sample_log_prompts`` of them): the prompt's images, copied into the
report's plot folder as ``samples/<name>.png`` and embedded as ``data:`` URIs like the plots, the prompt's text, and
every sampled answer with its reward (``cut`` marks one that hit ``max_new_tokens``). The record is written by
:class:`~sc_lightning.trainer.sample_log.SampleLog`; a run without it gets one line saying how to get one.
"""

from __future__ import annotations

import base64
import shutil
from html import escape
from pathlib import Path
from typing import Any

from sc_lightning.report.tables import RunData
from sc_lightning.trainer.sample_log import SAMPLES_DIR, read_record

TITLE = "Sampled answers"
WHY = (
    "no samples recorded (run with --data.sample_log_prompts N, N > 0; the default, 4, writes "
    f"{SAMPLES_DIR}/ under trainer.default_root_dir)"
)
ANSWER_CHARACTERS = 2000
"""An answer longer than this is cut in the report (the record keeps it whole)."""


def samples_section(run: RunData, folder: Path) -> str:
    """The section's HTML: the first and the last recorded step (one when the record holds one), each prompt's
    images copied into ``folder``/samples/ and embedded; one line saying why when the run recorded none."""
    readable = {step: record for step, path in run.sample_records.items() if (record := read_record(path))}
    heading = f"<h2 id='samples'>{TITLE}</h2>"
    if not readable:
        return f"{heading}<p class='caption'>{escape(WHY)}</p>"
    first, last = min(readable), max(readable)
    shown = [(first, "first recorded step")] + ([(last, "last recorded step")] if last != first else [])
    body = "".join(_step(step, label, readable[step], run.run_dir / SAMPLES_DIR, folder) for step, label in shown)
    caption = (
        f"{len(readable)} steps on record ({', '.join(map(str, sorted(readable)))}); each shows the first prompt "
        "groups the step trained, with every sampled answer decoded from the trained rows and its reward."
    )
    return f"{heading}{body}<p class='caption'>{escape(caption)}</p>"


def _step(step: int, label: str, record: dict[str, Any], source: Path, folder: Path) -> str:
    """One recorded step: each of its prompts with its images and answers."""
    prompts = "".join(_prompt(prompt, source, folder) for prompt in record["prompts"])
    return f"<h3>step {step} ({label})</h3>{prompts or '<p>no prompt groups on record</p>'}"


def _prompt(prompt: dict[str, Any], source: Path, folder: Path) -> str:
    """A prompt's images (copied and embedded), text, and answers with their rewards."""
    images = "".join(_image(name, source, folder) for name in prompt.get("images", ()))
    answers = prompt.get("answers", [])
    rows = "".join(
        f"<tr><td>{_reward(answer.get('reward'))}{' cut' if answer.get('truncated') else ''}</td>"
        f"<td><pre class='answer'>{escape(_cut(str(answer.get('text', ''))))}</pre></td></tr>"
        for answer in answers
    )
    rewards = [float(a["reward"]) for a in answers if isinstance(a.get("reward"), int | float)]
    mean = f", mean reward {sum(rewards) / len(rewards):.2f}" if rewards else ""
    about = f"{prompt.get('prompt_id')} (started at weight version {prompt.get('start_weight')}{mean})"
    return (
        f"<div class='sample'><div>{images}</div><div><p class='sub'>{escape(about)}</p>"
        f"<pre class='prompt'>{escape(_cut(str(prompt.get('prompt', ''))))}</pre>"
        f"<table><tr><td>reward</td><td>answer</td></tr>{rows}</table></div></div>"
    )


def _image(name: str, source: Path, folder: Path) -> str:
    """One of a prompt's PNGs, copied to ``folder``/samples/ and embedded (a line instead when it is missing)."""
    path = source / name
    try:
        data = path.read_bytes()
    except OSError:
        return f"<p class='sub'>{escape(name)} is missing</p>"
    target = folder / SAMPLES_DIR / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
    encoded = base64.b64encode(data).decode("ascii")
    return f"<img class='scene' alt='{escape(name)}' src='data:image/png;base64,{encoded}'>"


def _reward(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, int | float) else "?"


def _cut(text: str) -> str:
    return text if len(text) <= ANSWER_CHARACTERS else text[:ANSWER_CHARACTERS] + " …"
