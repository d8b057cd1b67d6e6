"""The checker behind ``test_silent_knobs.py``: which leaf knobs of a schema nothing outside ``config/`` reads.

AST only: the package is parsed, never imported (the schema root class is the one thing imported). The rules
(what counts as a read, how shared names are qualified, the limits) are explained in ``test_silent_knobs.py``.
"""

from __future__ import annotations

import ast
import inspect
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sc_lightning.config.knobs import nested_sections, walk_fields

SELF_NAMES = frozenset({"self", "cls"})


@dataclass(frozen=True)
class Knob:
    """A leaf knob of the schema, as the check sees it."""

    label: str  # the dotpath, plus the owning class where several hold it: "a.sampler.s (WindowedSamplerConfig)"
    name: str  # the field name, which is what code reads
    family: type  # the base-most class declaring the field: an override of a base's field is the same knob
    qualifiers: frozenset[str]  # the enclosing section's field name, the owning and declaring class names


def leaf_knobs(root: type) -> list[Knob]:
    """Every leaf knob under ``root``, members of discriminated unions (sampler modes, estimators) included."""
    leaves = [f for f in walk_fields(root) if not nested_sections(f.type)]
    holders = Counter(f.path for f in leaves)
    knobs = []
    for f in leaves:
        declarers = [c for c in f.owner.__mro__ if f.name in inspect.get_annotations(c)]
        parent = f.path.split(".")[-2:-1]
        knobs.append(
            Knob(
                label=f.path if holders[f.path] == 1 else f"{f.path} ({f.owner.__name__})",
                name=f.name,
                family=declarers[-1],
                qualifiers=frozenset({*parent, f.owner.__name__, declarers[0].__name__}),
            )
        )
    return knobs


def names_read(tree: ast.AST) -> set[str]:
    """Names read under ``tree``: ``x.name``, ``getattr(x, "name")``, ``x["name"]``, ``x.get("name")``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            names.add(node.attr)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            names |= _string(node.slice)
        elif isinstance(node, ast.Call) and node.args and _is_lookup(node.func):
            names |= _string(node.args[1] if _is_getattr(node.func) and len(node.args) > 1 else node.args[0])
    return names


def _is_getattr(func: ast.expr) -> bool:
    return isinstance(func, ast.Name) and func.id == "getattr"


def _is_lookup(func: ast.expr) -> bool:
    return _is_getattr(func) or (isinstance(func, ast.Attribute) and func.attr == "get")


def _string(node: ast.expr) -> set[str]:
    return {node.value} if isinstance(node, ast.Constant) and isinstance(node.value, str) else set()


def mirrored_fields(tree: ast.AST) -> set[str]:
    """Fields of classes that copy themselves from another object field by field, like ``ClippedPGLoss.from_config``:

    ``cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})`` reads every field of ``cls`` from
    ``config``. Copying from ``self`` (``getattr(self, f.name)``) reads nothing from a config and does not count.
    """
    names = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if any(_copies_fields_from_another_object(node, cls.name) for node in ast.walk(cls)):
            names |= {
                stmt.target.id
                for stmt in cls.body
                if isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and "ClassVar" not in ast.unparse(stmt.annotation)
            }
    return names


def _copies_fields_from_another_object(node: ast.AST, class_name: str) -> bool:
    if not isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
        return False
    own = SELF_NAMES | {class_name}
    loop_vars = {
        g.target.id
        for g in node.generators
        if isinstance(g.target, ast.Name)
        and isinstance(g.iter, ast.Call)
        and _called_name(g.iter.func) == "fields"
        and any(isinstance(a, ast.Name) and a.id in own for a in g.iter.args)
    }
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and _is_getattr(call.func) and len(call.args) > 1:
            source, key = call.args[:2]
            from_self = isinstance(source, ast.Name) and source.id in SELF_NAMES
            field_name = isinstance(key, ast.Attribute) and key.attr == "name"
            if field_name and getattr(key.value, "id", "") in loop_vars and not from_self:
                return True
    return False


def _called_name(func: ast.expr) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def imported_from(tree: ast.AST, module_prefix: str) -> set[str]:
    """Names imported from ``module_prefix`` or its submodules (``from pkg.config import resolve`` gives resolve)."""
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(module_prefix)
        for alias in node.names
    }


def config_accessors(config_dir: Path, section_names: set[str]) -> dict[str, set[str]]:
    """What each accessor in ``config_dir`` reads, by accessor name.

    Accessors are module-level functions (``resolve``, ``step_floor``) and methods or properties of the schema's
    section classes (``PPOConfig.critic_epochs``, ``SCConfig.algo``); each reads what its body reads, and the
    functions it calls by name. Validation rules (decorated ``@ties``) are not accessors: a knob only a rule reads
    has no effect on a run.
    """
    reads: dict[str, set[str]] = {}
    for path in sorted(config_dir.rglob("*.py")):
        tree = ast.parse(path.read_text())
        methods = [f for c in tree.body if isinstance(c, ast.ClassDef) and c.name in section_names for f in c.body]
        for func in [*tree.body, *methods]:
            if isinstance(func, ast.FunctionDef) and not _is_rule(func):
                called = {n.func.id for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
                reads.setdefault(func.name, set()).update(names_read(func) | called)
    return reads


def _is_rule(func: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Call) and _called_name(d.func) == "ties" for d in func.decorator_list)


def reads_by_file(package_dir: Path, section_names: set[str], skip: tuple[str, ...] = ("testing",)) -> list[set[str]]:
    """For each file outside ``package_dir/config`` (and ``skip``): the names it reads, through accessors too."""
    accessors = config_accessors(package_dir / "config", section_names)
    files = []
    for path in sorted(package_dir.rglob("*.py")):
        if path.relative_to(package_dir).parts[0] in ("config", *skip):
            continue
        tree = ast.parse(path.read_text())
        reads = names_read(tree) | mirrored_fields(tree) | imported_from(tree, f"{package_dir.name}.config")
        while more := set().union(*(accessors[name] for name in reads & accessors.keys())) - reads:
            reads |= more  # follow accessors into the accessors they use, until nothing new is read
        files.append(reads)
    return files


def section_class_names(root: type) -> set[str]:
    """Names of the schema's section classes and their bases (whose methods may read knobs)."""
    owners = {root} | {f.owner for f in walk_fields(root)}
    return {c.__name__ for owner in owners for c in owner.__mro__ if c is not object}


def silent_knob_problems(
    package_dir: Path, root: type, exemptions: Mapping[str, str], *, exemptions_file: str
) -> list[str]:
    """Every knob nothing reads and no exemption explains, every stale or unknown exemption: one line each."""
    knobs = leaf_knobs(root)
    files = reads_by_file(package_dir, section_class_names(root))
    families = Counter(name for name, _ in {(k.name, k.family) for k in knobs})
    where = f"{package_dir.name}/config/"
    problems = []
    for knob in knobs:
        missing = _missing_reads(knob, files, shared=families[knob.name] > 1)
        if knob.label in exemptions:
            if not missing:
                problems.append(f"{knob.label}: is read outside {where}; delete its exemption from {exemptions_file}")
            elif not exemptions[knob.label].strip():
                problems.append(f"{knob.label}: its exemption in {exemptions_file} gives no reason")
        elif missing:
            problems.append(
                f"{knob.label}: no file outside {where} reads {missing}; read it where it takes effect, "
                f"or list it in {exemptions_file} with the reason"
            )
    known = {k.label for k in knobs}
    unknown = [label for label in exemptions if label not in known]
    return problems + [f"{label}: exempted in {exemptions_file} but no such knob" for label in unknown]


def _missing_reads(knob: Knob, files: list[set[str]], *, shared: bool) -> str:
    """'' when the knob is read, else what no file reads.

    A name that several knobs share counts only in a file that also reads one of the knob's qualifiers.
    """
    readers = [reads for reads in files if knob.name in reads]
    if not readers:
        return f"`{knob.name}`"
    if shared and not any(reads & knob.qualifiers for reads in readers):
        names = " or ".join(f"`{q}`" for q in sorted(knob.qualifiers))
        return f"`{knob.name}` together with {names} (`{knob.name}` alone names several knobs)"
    return ""
