"""The HTML page: a header (what the run is, how far it got, its config and library versions) and every plot,
embedded as a base64 ``data:`` URI so the file is self-contained."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

import yaml

from sc_lightning.report.plots import Plot
from sc_lightning.report.run_info import RUN_INFO
from sc_lightning.report.tables import RunData

SUMMARY = (
    "{algo}.num_prompts_per_step",
    "{algo}.num_generations_per_prompt",
    "{algo}.max_num_steps",
    "policy.model_name",
    "policy.precision",
    "policy.generation.backend",
    "async_rl.sampler.name",
    "data_plane.backend",
    "data.dataset_name",
    "env.name",
    "trainer.accelerator",
    "trainer.devices",
    "trainer.num_nodes",
    "seed_everything",
)
"""The config knobs the header shows (``{algo}`` is ``grpo`` or ``ppo``); the whole config is folded below them."""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1060px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0; } h2 { font-size: 1.15em; margin: 28px 0 6px; }
.sub { color: #666; margin-top: 4px; } .columns { display: grid; grid-template-columns: repeat(3, auto); gap: 28px; }
table { border-collapse: collapse; font-size: 0.9em; } td { padding: 2px 14px 2px 0; vertical-align: top; }
td:first-child { color: #555; } code, pre { font-size: 0.85em; } pre { background: #f6f6f6; padding: 8px; }
img { max-width: 100%; border: 1px solid #eee; } .caption { color: #444; font-size: 0.9em; margin-top: 2px; }
h3 { font-size: 1em; margin: 18px 0 4px; } .sample { display: flex; gap: 14px; margin: 8px 0 14px; }
img.scene { width: 128px; image-rendering: pixelated; margin-right: 4px; }
pre.prompt, pre.answer { white-space: pre-wrap; margin: 0; max-height: 12em; overflow: auto; }
"""


def render_page(run: RunData, plots: Sequence[Plot], extra: str = "") -> str:
    """The whole report as one HTML document: the header, the plots, then ``extra`` (the sections that are no
    plot, as HTML: the sampled answers)."""
    sections = "".join(_figure(plot) for plot in plots) + extra
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>sc_lightning report: {escape(run.run_dir.name)}</title><style>{STYLE}</style></head><body>"
        f"<h1>sc_lightning run report</h1><p class='sub'><code>{escape(str(run.run_dir))}</code> — generated "
        f"{datetime.now(UTC).isoformat(timespec='seconds')}</p>{_header(run)}{sections}</body></html>\n"
    )


def progress(run: RunData) -> list[tuple[str, str]]:
    """How far the run got, by source: the steps metrics.csv holds, those train_data.jsonl holds, and those the
    samples/ record holds."""
    rows = []
    steps = sorted(run.metrics)
    versions = ", ".join(path.parent.name for path in run.metrics_files) or "none"
    csv = f"steps {steps[0]}–{steps[-1]} ({len(steps)} rows)" if steps else "no rows yet"
    rows.append(("metrics.csv", f"{csv}; logger versions: {versions}"))
    trained = run.sample_steps()
    jsonl = f"{len(run.samples)} samples over {len(trained)} steps" if trained else "absent or empty"
    rows.append(("train_data.jsonl", jsonl))
    recorded = ", ".join(map(str, run.sample_records))
    rows.append(("samples/", f"steps {recorded}" if recorded else "none recorded"))
    last = max([*steps, *trained], default=None)
    config = _config(run)
    budget = _lookup(config, f"{_algo(config)}.max_num_steps") if config else None
    if last is not None:
        rows.append(("last step", f"{last + 1} of {budget}" if budget is not None else str(last + 1)))
    return rows


def config_summary(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The :data:`SUMMARY` knobs the config sets, as (dotpath, value) rows, the algorithm first."""
    algo = _algo(config)
    rows = [("algorithm", algo)]
    for template in SUMMARY:
        path = template.format(algo=algo)
        value = _lookup(config, path)
        if value is not None:
            rows.append((path, str(value)))
    return rows


def _header(run: RunData) -> str:
    blocks = [("Progress", _table(progress(run)))]
    config = _config(run)
    if config:
        full = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
        folded = f"<details><summary>whole resolved config</summary><pre>{escape(full)}</pre></details>"
        blocks.append(("Config", _table(config_summary(config)) + folded))
    else:
        blocks.append(("Config", f"<p>no <code>{RUN_INFO}</code> in the run directory: config unknown.</p>"))
    info = run.info or {}
    versions = info.get("versions")
    body = _table(list(versions.items())) if isinstance(versions, dict) else "<p>unknown</p>"
    if "written_at" in info:
        body += f"<p class='sub'>recorded {escape(str(info['written_at']))}</p>"
    blocks.append(("Versions", body))
    return "<div class='columns'>" + "".join(f"<div><h2>{t}</h2>{body}</div>" for t, body in blocks) + "</div>"


def _figure(plot: Plot) -> str:
    data = base64.b64encode(plot.png).decode("ascii")
    return (
        f"<h2 id='{plot.name}'>{escape(plot.title)}</h2>"
        f"<img alt='{escape(plot.title)}' src='data:image/png;base64,{data}'>"
        f"<p class='caption'>{escape(plot.caption)}</p>"
    )


def _table(rows: list[tuple[str, Any]]) -> str:
    cells = "".join(f"<tr><td>{escape(str(key))}</td><td>{escape(str(value))}</td></tr>" for key, value in rows)
    return f"<table>{cells}</table>"


def _config(run: RunData) -> dict[str, Any] | None:
    config = (run.info or {}).get("config")
    return config if isinstance(config, dict) else None


def _algo(config: dict[str, Any]) -> str:
    return "ppo" if config.get("ppo") else "grpo"


def _lookup(config: dict[str, Any], path: str) -> Any:
    value: Any = config
    for key in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value
