"""No silent knobs: every knob of the schema is read outside ``sc_lightning/config/``, or exempted here with a reason.

A knob that is parsed and documented but read by nothing has no effect, and no other test notices (issue 14:
``seq_logprob_error_threshold`` was such a knob). The checker is ``tests/config/silent_knobs.py``; AST only.

**Knobs.** :func:`~sc_lightning.config.knobs.walk_fields` (the walk ``key_index`` uses for loading and that the docs
test checks) gives every field at its dotpath; a leaf knob is a field that holds no section. Each member of a
discriminated union (every sampler mode, every advantage estimator) contributes its own fields; free-form mappings
(``init_args``) are leaves. Where several classes hold one dotpath the label adds the class:
``async_rl.sampler.max_staleness_versions (WindowedSamplerConfig)``.

**Reads.** Every ``sc_lightning/**/*.py`` outside ``config/`` is parsed (``cli/`` included; ``sc_lightning/testing/``
is left out: the package never imports it, see test_layout, so a read there changes no run). A file reads a name by

- ``x.name`` (a load, not an assignment), ``getattr(x, "name")``, ``x["name"]``, ``x.get("name")``;
- importing it from ``sc_lightning.config``;
- mirroring: a class that builds itself with ``getattr(config, f.name) for f in dataclasses.fields(cls)``
  (``ClippedPGLoss.from_config``) reads each of its own fields from the config section;
- a config accessor it reads or imports: a module-level function of ``config/`` (``resolve``, ``step_floor``) or a
  method or property of a section class (``PPOConfig.critic_epochs``, ``SCConfig.algo``, ``gate_window``). What the
  accessor reads counts for the file, transitively. Validation rules (``@ties``) are never followed: a knob only a
  rule reads has no effect on a run.

Not reads: dict displays (``{"name": v}`` builds data), strings and docstrings, and the generic walks of
``config_to_dict`` / ``to_plain`` (the resolved-config dump and the snapshot fingerprint copy every knob without
giving any of them an effect).

**Names.** A knob is read when its field name is read. A name several knobs share (``enabled``, ``name``,
``precision``, ``max_staleness_versions``; a subclass overriding a base's field is the same knob) counts only in a
file that also reads one of the knob's qualifiers: the enclosing field (``colocated`` for
``policy.generation.colocated.enabled``) or the owning or declaring class (``DataPlaneConfig``, which a function
taking ``cfg: DataPlaneConfig`` imports).

**Exemptions.** :data:`READ_ONLY_BY_VALIDATION` maps a label to why only validation or migration reads it (a knob that
must keep its default and that a rule rejects otherwise, a legacy block, a knob a rule checks against another one).
An exemption for a knob that is read, one without a reason, and one naming no knob fail too, so the list cannot rot.

**Limits.** Names, not data flow: a unique name read on an unrelated object counts (a ``.seed`` of anything reads
``grpo.seed``), and one class's field at several dotpaths is one name (``policy.optimizer.lr`` and
``value.optimizer.lr``; ``grpo.*`` and ``ppo.*``), so reading it for one of them counts for all. Qualifying shared
names is co-occurrence in a file, not proof the read is on that section, and members of one union share their
qualifier (``sampler``), so sampler modes are not told apart. A read is not an effect: a knob only logged passes.
A generic read the checker does not know (``Foo(**asdict(section))``) shows up as an unread knob: the check errs
loudly, and the fix is to teach the checker the pattern rather than to exempt the knob.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

from sc_lightning.config.schema import SCConfig
from tests.config.silent_knobs import leaf_knobs, silent_knob_problems
from tests.helpers.configs import REPO

THIS_FILE = "tests/config/test_silent_knobs.py"

_PER_ALGORITHM = {
    "{algo}.batch_multiplier": "over-generation is rejected by dynamic_sampling_fits unless 1 (it must stay 1)",
    "{algo}.skip_reference_policy_logprobs_calculation": (
        "the reference pass is skipped whenever loss_fn.reference_policy_kl_penalty is 0 (lightning/module.py); "
        "loss_consistency only checks that this flag comes with a zero penalty"
    ),
}
_TRAINER_BATCH = (
    "must equal num_prompts_per_step x num_generations_per_prompt (batch_matches_step); the step batch is built "
    "from those two knobs"
)
READ_ONLY_BY_VALIDATION: dict[str, str] = {
    **{path.format(algo=algo): why for path, why in _PER_ALGORITHM.items() for algo in ("grpo", "ppo")},
    "grpo.async_grpo": "legacy block: no_legacy_async_block rejects it with its async_rl translation",
    "ppo.async_ppo": "legacy block: no_legacy_async_block rejects it with its async_rl translation",
    "policy.train_global_batch_size": _TRAINER_BATCH,
    "value.train_global_batch_size": _TRAINER_BATCH,
    "policy.generation.vllm_cfg.async_engine": "vLLM always runs its async engine: generation_engine rejects false",
}


def test_every_knob_is_read_outside_config_or_exempted_with_a_reason() -> None:
    problems = silent_knob_problems(REPO / "sc_lightning", SCConfig, READ_ONLY_BY_VALIDATION, exemptions_file=THIS_FILE)
    assert not problems, f"{len(problems)} knob problem(s):\n" + "\n".join(problems)


def test_the_knobs_checked_are_the_documented_leaves_union_members_included() -> None:
    reference = (REPO / "docs" / "config-reference.md").read_text()
    labels = {knob.label for knob in leaf_knobs(SCConfig)}
    assert all(f"`{label.split(' ')[0]}`" in reference for label in labels)
    assert {
        "async_rl.sampler.init_args",
        "async_rl.sampler.max_staleness_versions (WindowedSamplerConfig)",
        "ppo.adv_estimator.gae_lambda",
        "grpo.seq_logprob_error_threshold",
    } <= labels


# A toy package: a schema in toy/config/ and two files that read parts of it. Each knob's comment says why it is
# (or is not) read; the tests below pin that the checker agrees.
TOY_SCHEMA = """
    from typing import Any, Literal

    from sc_lightning.config.knobs import knob, section


    @section
    class Sub:
        enabled: bool = knob(False)  # read: run.py reads .enabled and .sub
        depth: int = knob(1)  # read


    @section
    class Other:
        enabled: bool = knob(False)  # unread: .other is read in show.py, .enabled only in run.py


    @section
    class Loss:
        scale: float = knob(1.0)  # read
        mirrored_only: float = knob(0.0)  # read: ToyLoss.from_config copies it by dataclasses.fields


    @section
    class ModeA:
        name: Literal["a"] = knob("a")  # read: run.py reads .mode.name
        a_only: int = knob(0)  # read


    @section
    class ModeB:
        name: Literal["b"] = knob("b")
        b_only: int = knob(0)  # unread


    @section
    class Root:
        used: int = knob(1)  # read
        unused_knob: int = knob(2)  # unread: the planted silent knob
        derived_only: int = knob(3)  # read through the accessor doubled()
        rule_only: bool = knob(False)  # unread: only a @ties rule reads it
        extra: dict[str, Any] = knob(factory=dict)  # read
        sub: Sub = knob(factory=Sub)
        other: Other = knob(factory=Other)
        loss: Loss = knob(factory=Loss)
        mode: ModeA | ModeB = knob(factory=ModeA)

        def doubled(self) -> int:
            return 2 * self.derived_only
"""
TOY_RULES = """
    def ties(*paths):
        return lambda rule: rule


    @ties("rule_only")
    def rule_only_is_false(config, report):
        if config.rule_only:
            report.append("rule_only")


    def validate(config):
        report = []
        rule_only_is_false(config, report)
        return report
"""
TOY_RUN = """
    import dataclasses

    from toy.config.rules import validate


    @dataclasses.dataclass
    class ToyLoss:
        scale: float = 1.0
        mirrored_only: float = 0.0

        @classmethod
        def from_config(cls, config):
            return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


    def run(config):
        validate(config)
        sub = config.sub
        depth = sub.depth if sub.enabled else 0
        return config.used + config.doubled() + depth + ToyLoss.from_config(config.loss).scale, config.mode.name


    def mode_a(config):
        return config.mode.a_only, config["extra"]
"""
TOY_SHOW = """
    import dataclasses


    def show(config):
        return {"other": config.other, "unused_knob": "set in a dict display, which reads nothing"}


    @dataclasses.dataclass
    class Row:
        rule_only: bool = False

        def copy(self):  # copies its own fields: reads nothing from a config
            return Row(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
"""
TOY_UNREAD = ["unused_knob", "rule_only", "other.enabled", "mode.b_only"]


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, type]:
    """The toy package's directory and its schema root (imported from the written file)."""
    package = tmp_path / "toy"
    (package / "config").mkdir(parents=True)
    for path, source in {
        "config/schema.py": TOY_SCHEMA,
        "config/rules.py": TOY_RULES,
        "run.py": TOY_RUN,
        "show.py": TOY_SHOW,
    }.items():
        (package / path).write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location("toy_schema", package / "config" / "schema.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "toy_schema", module)
    spec.loader.exec_module(module)
    return package, module.Root


def labels_of(problems: list[str]) -> list[str]:
    return [problem.split(": ", 1)[0] for problem in problems]


def test_a_planted_silent_knob_is_reported_by_dotpath_with_the_hint(toy: tuple[Path, type]) -> None:
    package, root = toy
    others = {label: "explained elsewhere" for label in TOY_UNREAD if label != "unused_knob"}
    assert silent_knob_problems(package, root, others, exemptions_file="EXEMPTIONS.py") == [
        "unused_knob: no file outside toy/config/ reads `unused_knob`; read it where it takes effect, "
        "or list it in EXEMPTIONS.py with the reason"
    ]


def test_reads_count_through_accessors_and_mirrors_but_not_rules_or_other_files(toy: tuple[Path, type]) -> None:
    package, root = toy
    problems = silent_knob_problems(package, root, {}, exemptions_file="E")
    assert labels_of(problems) == TOY_UNREAD
    assert "`enabled` together with `Other` or `other`" in problems[2]


def test_stale_reasonless_and_unknown_exemptions_fail(toy: tuple[Path, type]) -> None:
    package, root = toy
    exemptions = {label: "explained" for label in TOY_UNREAD} | {"used": "stale", "unused_knob": " ", "no.such": "x"}
    assert silent_knob_problems(package, root, exemptions, exemptions_file="E") == [
        "used: is read outside toy/config/; delete its exemption from E",
        "unused_knob: its exemption in E gives no reason",
        "no.such: exempted in E but no such knob",
    ]
