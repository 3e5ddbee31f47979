"""When the book's headless browser is missing, its check fails once with the fix, not per page."""
from __future__ import annotations

from pathlib import Path

from fedsteer_lib.experiments.doctor import chromium_problem

BROWSER_TESTS = "test_book_browser.py"
BROWSER_PRESENT = "test_chromium_is_installed"


def pytest_collection_modifyitems(session, config, items):
    if chromium_problem() is None:
        return
    dropped = [item for item in items
               if Path(str(item.fspath)).name == BROWSER_TESTS and item.originalname != BROWSER_PRESENT]
    if dropped:  # they would all fail with the same message: keep the one test that states it
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
