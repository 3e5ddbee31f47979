"""Collection rules for `make test`, and the kernel mode of the test processes (native).

- When the book's headless browser is missing, its check fails once with the fix, not per page.
- `make test` runs on pytest-xdist workers with the scheduler below: every test file, and every
  notebook, is one unit that runs whole, in order, on one worker (a notebook's cells share one
  kernel; a module's fixtures are built once). Chapters 6, 7, 9 and appendix A are one unit: 7,
  9 and A read the quick runs that 6 (Table 1) and 7 (the ablations) compute, so they run after
  them on the same worker instead of computing the same runs twice at the same time. The other
  chapters compute only runs of their own. The two test files that start Ray clusters are one
  unit too.
- The suite keeps its headroom: a chapter whose `quick` execution (the sum of its cells' times
  under nbval) takes more than CHAPTER_BUDGET_S seconds fails the session, named with its time.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from fedsteer_lib import numerics
from fedsteer_lib.experiments.doctor import chromium_problem

# The tests compute with native kernels (fast; their bits are compared only within this process).
# What must be pinned runs in a process of its own: the committed reference run is recomputed by
# `python -m fedsteer_lib verify --what reference --kernels pinned` (tests/test_numerics.py).
numerics.select_kernels("native")

CHAPTER_BUDGET_S = 150.0  # seconds of one chapter's quick execution (issue 56)
BROWSER_TESTS = "test_book_browser.py"
BROWSER_PRESENT = "test_chromium_is_installed"


# Files that run as one unit on one worker, in collection order (see the module docstring).
SHARED_UNITS = {
    **{name: "chapters sharing Table 1's runs" for name in (
        "06_main_results.ipynb", "07_ablations.ipynb", "A_baseline_conventions.ipynb", "09_reproduction_report.ipynb")},
    # Each starts local Ray clusters (Flower's simulation runs on Ray): one at a time.
    **{name: "tests that start Ray" for name in ("test_flower.py", "test_ray_executor.py")},
}


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unused (and unchecked) without it
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ChapterScheduling(LoadScopeScheduling):
        """Units are files (as `xdist --dist loadfile`), except those of `SHARED_UNITS`, handed
        out in collection order: the Ray unit first (`LONGEST_FIRST`), then the notebooks."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_UNITS.get(Path(path).name, path)

    config.option.loadscopereorder = False  # xdist would hand out the units with most tests first
    return ChapterScheduling(config, log)


# Units handed out first: the longest (the Ray unit waits on cluster starts, Flower rounds and a
# killed node's timeout). Handed out in collection order, it started mid-session, where a unit that
# long can leave one worker running alone at the end.
LONGEST_FIRST = ("test_flower.py", "test_ray_executor.py")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: Path(str(item.fspath)).name not in LONGEST_FIRST)  # stable: order kept within
    if chromium_problem() is None:
        return
    dropped = [item for item in items
               if Path(str(item.fspath)).name == BROWSER_TESTS and item.originalname != BROWSER_PRESENT]
    if dropped:  # they would all fail with the same message: keep the one test that states it
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


_CHAPTER_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Add up each notebook's cell times (nbval's items are `notebooks/NN_x.ipynb::Cell k`)."""
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        _CHAPTER_SECONDS[path] = _CHAPTER_SECONDS.get(path, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    over = {p: t for p, t in _CHAPTER_SECONDS.items() if t > CHAPTER_BUDGET_S}
    if over and not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist)
        lines = ", ".join(f"{Path(p).name} {t:.0f} s" for p, t in sorted(over.items()))
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.ensure_newline()
        reporter.write_line(f"chapters over their {CHAPTER_BUDGET_S:.0f} s quick budget: {lines}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def no_compute(monkeypatch):
    """Any run or data preparation fails the test: a command must refuse before it computes."""
    from fedsteer_lib.experiments import sweep
    from fedsteer_lib.simulator import engine

    def refuse(*args, **kwargs):
        raise AssertionError("computed")

    for module in (sweep, engine):
        monkeypatch.setattr(module, "run", refuse)
        monkeypatch.setattr(module, "prepare", refuse)
