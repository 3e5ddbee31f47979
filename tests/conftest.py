"""Collection rules for `make test`, and the kernel mode of the test processes (native).

- When the book's headless browser is missing, its check fails once with the fix, not per page.
- `make test` runs on pytest-xdist workers with the scheduler below: every test file, and every
  notebook, is one unit that runs whole, in order, on one worker (a notebook's cells share one
  kernel; a module's fixtures are built once). Chapters 6, 7, 9 and 10 are one unit: 7, 9 and
  10 read the quick runs that 6 (Table 1) and 7 (the ablations) compute, so they run after them
  on the same worker instead of computing the same runs twice at the same time. The other
  chapters compute only runs of their own. The two test files that start Ray clusters are one
  unit too.
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
        out in collection order: `make test` lists the notebooks first, the longest work."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_UNITS.get(Path(path).name, path)

    config.option.loadscopereorder = False  # xdist would hand out the units with most tests first
    return ChapterScheduling(config, log)


def pytest_collection_modifyitems(session, config, items):
    if chromium_problem() is None:
        return
    dropped = [item for item in items
               if Path(str(item.fspath)).name == BROWSER_TESTS and item.originalname != BROWSER_PRESENT]
    if dropped:  # they would all fail with the same message: keep the one test that states it
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
