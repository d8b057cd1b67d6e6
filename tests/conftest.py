"""The suite's hooks (GPU deselection, start order, the exclusive lock, the exit) and its shared fixtures; the
helpers tests import live in tests/helpers/."""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# before the helper modules load: their asserts report as a test's own do (pytest rewrites test modules and conftests)
pytest.register_assert_rewrite("tests.helpers")

from sc_lightning.models.megatron_import import import_megatron_without_compile  # noqa: E402
from tests.exclusive import machine_lock  # noqa: E402
from tests.helpers.configs import REPO  # noqa: E402
from tests.helpers.ray_head import RAY_ADDRESS, RayHead, connect_ray  # noqa: E402

import_megatron_without_compile()  # before the test modules import it: no TorchInductor or wandb (seconds a worker)

# Hypothesis's per-example deadline measures the machine, not the code: on a loaded 2-core CI box an example that
# takes 30 ms may take 300 ms, and hypothesis then reports a flaky failure. Every property still runs in full.
settings.register_profile("sc_lightning", deadline=None)
settings.load_profile("sc_lightning")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the ``gpu`` tests where no GPU exists, put the longest tests first, and group the tests that share a
    costly fixture."""
    _deselect_gpu_tests_without_a_gpu(config, items)
    items.sort(key=_start_order)  # stable: each class keeps its collection order
    _group_by_shared_fixtures(items)


BUILT_PER_PROCESS = frozenset({"model_parallel", "tiny_dirs"})
"""Session fixtures every worker process builds for itself: per-process state, or seconds to build."""


def _group_by_shared_fixtures(items: list[pytest.Item]) -> None:
    """Send the tests that share a module- or session-scoped fixture of this suite to one pytest-xdist worker.

    scripts/test.sh runs ``--dist loadgroup``: the tests of one ``xdist_group`` run on one worker, every other test on
    whichever worker frees up. Without the group both workers would build a shared fixture (a vLLM engine, a finished
    run, a Ray cluster: tens of seconds each) for their share of its tests. A module's fixtures group its tests by
    module; a session fixture groups its tests by its name.
    """
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = set()
        for name, definitions in info.name2fixturedefs.items():
            definition = definitions[-1]
            if not getattr(definition.func, "__module__", "").startswith("tests") or name in BUILT_PER_PROCESS:
                continue
            if definition.scope == "module":
                shared.add(item.nodeid.split("::")[0])
            elif definition.scope == "session":
                shared.add(name)
        if shared:
            item.add_marker(pytest.mark.xdist_group("+".join(sorted(shared))))


def _deselect_gpu_tests_without_a_gpu(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the ``gpu`` tests where no GPU exists (reported as deselected, not skipped); scripts/gpu_check.sh
    runs them on the GPU machine."""
    import torch

    if torch.cuda.is_available():
        return
    deselected = [item for item in items if item.get_closest_marker("gpu")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]


def _start_order(item: pytest.Item) -> tuple[int, float]:
    """``exclusive`` tests first, then ``long`` ones, the longest first, then ``slow`` ones, then the rest.

    scripts/test.sh runs the suite on two pytest-xdist workers that take the next test as they free up.
    The exclusive tests run one at a time with the machine to themselves (:func:`pytest_runtest_protocol`), best while
    the other worker would only wait anyway; then the minutes-long tests go out, longest first, so the two workers
    end within about one short test of each other instead of one of them starting a long run when the other is done.
    """
    if item.get_closest_marker("exclusive"):
        return 0, 0.0
    long = item.get_closest_marker("long")
    if long:
        return 1, -float(long.kwargs["minutes"])
    return (2 if item.get_closest_marker("slow") else 3), 0.0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """On a pytest-xdist worker: an ``exclusive`` test runs with no other test beside it, every other test beside
    other non-exclusive ones only (:mod:`tests.exclusive`). The lock spans the whole protocol, module fixtures
    started or stopped with the test (a Ray cluster, a vLLM engine) included."""
    worker = getattr(item.config, "workerinput", None)
    if worker is None:  # one process: nothing runs beside the test anyway
        return (yield)
    shared = Path(tempfile.gettempdir()) / f"sc-lightning-tests-{worker['testrunuid']}"  # the run's workers share it
    shared.mkdir(exist_ok=True)
    with machine_lock(shared, exclusive=item.get_closest_marker("exclusive") is not None):
        return (yield)


_SESSION_STATUS: list[int] = []
_RAY_HEADS: list[RayHead] = []

SHARED_RAY_CPUS = 64
"""Logical CPUs of the tests' shared Ray cluster: room for every actor a test's runs start, never a limit (the
runs' own placement decides what they take)."""


def pytest_sessionstart(session: pytest.Session) -> None:
    """In each process that runs tests: start the Ray cluster its runs join (:mod:`tests.helpers.ray_head`) and name
    it in ``RAY_ADDRESS``, which every process the tests start inherits; it comes up while the tests are collected
    (:func:`pytest_collection_finish` waits for it)."""
    config = session.config
    if getattr(config, "workerinput", None) is None and getattr(config.option, "numprocesses", None):
        return  # pytest-xdist's controller runs no test
    if os.environ.get(RAY_ADDRESS):
        return  # the caller named a cluster
    if importlib.util.find_spec("ray") is None:
        return  # the GPU image has no Ray: its tests (tests/gpu) start none
    head = RayHead(Path(tempfile.mkdtemp(prefix="scray-")), num_cpus=SHARED_RAY_CPUS)  # short: socket paths
    _RAY_HEADS.append(head)
    os.environ.update(head.auth_env, **{RAY_ADDRESS: head.address})


def pytest_collection_finish(session: pytest.Session) -> None:
    """Wait for the shared Ray cluster to be up before the first test runs."""
    for head in _RAY_HEADS:
        head.wait_ready()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the shared Ray cluster; remember the session's result for :func:`pytest_unconfigure`."""
    for head in _RAY_HEADS:
        head.stop()
    _SESSION_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the test process with the session's result, skipping the interpreter's own teardown.

    A full run (2026-12-02) passed every test and then died of a segmentation fault while the interpreter tore down
    what the in-process tests had loaded (Ray's and megatron's native threads, vLLM, Triton): exit code 139 for a
    green suite. Every report is written by now; only library finalisers are skipped (the tests stop their own Ray
    clusters and engines).
    """
    if _SESSION_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_SESSION_STATUS[-1])


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """This process connected to Ray, per module: the shared cluster ``RAY_ADDRESS`` names
    (:func:`pytest_sessionstart`), or without one a local instance of 4 logical CPUs (room for three engine actors).

    Ray actors unpickle classes and functions by reference, so their workers import this repository's modules too;
    they start as a TransferQueue data plane's do (sc_lightning.data_plane.tq_runtime). Yields the ``ray`` module.
    """
    import ray

    from sc_lightning.data_plane.tq_runtime import tq_ray_runtime_env

    connect_ray(4, log_to_driver=False, runtime_env=tq_ray_runtime_env({"PYTHONPATH": str(REPO)}))
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def repo() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def model_parallel() -> None:
    """Initialise torch.distributed (gloo, world of one) and megatron's parallel state at TP=1, once per process."""
    from sc_lightning.models.megatron import init_model_parallel

    init_model_parallel(1)
