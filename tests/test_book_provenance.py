"""tools/provenance.py and tools/generated.py: the runtime and environment table of the rerun
page and the CSV of every run's summary, checked by hand on a tiny fake results folder, then on
the committed results as `make book` writes them into book/_generated/."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

from fedsteer_lib.experiments.groups import GROUP_TITLES

from fedsteer_lib.experiments.config import RunConfig, method
from fedsteer_lib.experiments.groups import run_groups
from fedsteer_lib.experiments.registry import METHODS
from fedsteer_lib.experiments.results import has_run, results_root, run_path
from tools import generated, provenance

ROOT = Path(__file__).resolve().parents[1]

A = RunConfig(method=method("fedavg"), seed=0)
B = RunConfig(method=method("fedavg"), seed=1)
C = RunConfig(method=method("fedvarp"), seed=0)
D = RunConfig(method=method("fedsteer"), seed=0)  # never stored
STALE = RunConfig(method=method("mifa"), seed=0)  # stored in an outdated form: not a result


def _store(root: Path, config: RunConfig, wall: float, accuracy: float, **prov) -> None:
    path = run_path(config, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    summary = {"final_accuracy": accuracy, "mean_last_accuracy": accuracy - 0.01, "final_loss": 0.5,
               "collapsed": False, "collapse_round": None, "accuracy_before_collapse": None,
               "server_memory_bytes": 0, "wall_time": wall}
    path.write_text(json.dumps({"key": config.key(), "config": config.to_dict(with_device=False),
                                "provenance": prov, "summary": summary, "history": {}}))


@pytest.fixture
def fake(tmp_path) -> tuple[Path, dict[str, list[RunConfig]]]:
    root = tmp_path / "results"
    _store(root, A, 3600.0, 0.80, device="cpu", threads=1, torch="2.0", python="3.11.7", code_version="v1",
           date="2026-01-01T00:00:00+00:00")
    _store(root, B, 7200.0, 0.70, device="cpu", threads=2, torch="2.0", python="3.11.7", code_version="v2",
           date="2026-01-03T00:00:00+00:00")
    _store(root, C, 1800.0, 0.60, device="cuda:0 (H200)", threads=1, torch="2.1", python="3.11.7",
           code_version="v0", date="2025-12-31T00:00:00+00:00")
    stale = json.loads(run_path(A, root).read_text())
    stale.update(key=STALE.key(), config=STALE.to_dict(with_device=False))  # STALE's own run, in the old form
    stale["summary"].update(collapsed=True)
    del stale["summary"]["accuracy_before_collapse"]
    run_path(STALE, root).write_text(json.dumps(stale))
    return root, {"g1": [A, B, C, STALE], "g2": [C, D], "later": []}


def test_runtime_table_by_hand(fake):
    root, groups = fake
    with pytest.warns(UserWarning, match="collapsed run stored before"):
        table = provenance.runtime_table(groups, root).set_index("group")
    assert list(table.index) == ["g1", "g2", "all groups (each run once)"]  # "later" has no runs yet
    g1, g2, every = table.loc["g1"], table.loc["g2"], table.loc["all groups (each run once)"]
    assert g1["runs"] == "3 of 4"  # the stale result is not a run
    assert g1["total wall time (h)"] == pytest.approx((3600 + 7200 + 1800) / 3600)  # 3.5
    assert g1["median wall time (min)"] == pytest.approx(3600 / 60)  # median of 1800, 3600, 7200 s
    assert g1["device"] == "cpu, cuda:0 (H200)" and g1["threads"] == "1, 2" and g1["torch"] == "2.0, 2.1"
    assert g1["kernels"] == "native 3" and g1["CPU"] == "not recorded"  # stored before the kernel modes existed
    assert g1["code versions"] == "v0 … v2 (3 versions)"  # ordered by date: C (v0), A (v1), B (v2)
    assert g2["runs"] == "1 of 2" and g2["total wall time (h)"] == pytest.approx(0.5)
    assert g2["median wall time (min)"] == pytest.approx(30.0) and g2["code versions"] == "v0"
    assert every["runs"] == "3 of 5"  # A, B, C, STALE, D; C counted once
    assert every["total wall time (h)"] == pytest.approx(3.5)


def test_runtime_markdown_by_hand(fake):
    root, groups = fake
    with pytest.warns(UserWarning):
        text = provenance.runtime_markdown(provenance.runtime_table(groups, root))
    first, second = (part.splitlines() for part in text.split("\n\n"))
    assert first[0] == "| group | runs | total wall time (h) | median wall time (min) | kernels |"
    assert first[2:] == ["| g1 | 3 of 4 | 3.50 | 60.0 | native 3 |", "| g2 | 1 of 2 | 0.50 | 30.0 | native 1 |",
                         "| all groups (each run once) | 3 of 5 | 3.50 | 60.0 | native 3 |"]
    assert second[0] == "| group | CPU | device | threads | torch | code versions |"
    assert second[2] == "| g1 | not recorded | cpu, cuda:0 (H200) | 1, 2 | 2.0, 2.1 | v0 … v2 (3 versions) |"
    assert second[3] == "| g2 | not recorded | cuda:0 (H200) | 1 | 2.1 | v0 |"
    assert len(second) == 5

def test_all_runs_table_by_hand(fake):
    root, groups = fake
    with pytest.warns(UserWarning):
        table = provenance.all_runs_table(groups, root).set_index("key")
    assert sorted(table.index) == sorted(c.key() for c in (A, B, C))
    assert table.loc[C.key(), "groups"] == "g1;g2" and table.loc[A.key(), "groups"] == "g1"
    assert table.loc[B.key(), "final_accuracy"] == 0.70 and table.loc[C.key(), "wall_time"] == 1800.0
    assert table.loc[C.key(), "device"] == "cuda:0 (H200)" and table.loc[B.key(), "seed"] == 1


def test_write_generated(fake, tmp_path, monkeypatch):
    root, groups = fake
    monkeypatch.setattr(generated, "run_groups", lambda dataset, profile, root: groups)
    out = tmp_path / "generated"
    with pytest.warns(UserWarning):
        paths = generated.write_generated(out, root=root)
        expected = provenance.runtime_markdown(provenance.runtime_table(groups, root))
    assert paths["runtime"].read_text(encoding="utf8") == expected
    csv = pd.read_csv(paths["runs"])
    assert len(csv) == 3 and set(csv["key"]) == {A.key(), B.key(), C.key()}
    before = {k: p.stat().st_mtime_ns for k, p in paths.items()}
    with pytest.warns(UserWarning):
        generated.write_generated(out, root=root)  # same content: the files are left alone
    assert {k: p.stat().st_mtime_ns for k, p in paths.items()} == before


# ----------------------------------------------------------------------------- the generated files
@pytest.fixture(scope="module")
def generated_files(tmp_path_factory) -> dict[str, Path]:
    """The files `make book` writes into book/_generated/, written from the committed results."""
    out = tmp_path_factory.mktemp("generated")
    subprocess.run([sys.executable, "-m", "tools.generated", str(out)], check=True, cwd=ROOT,
                   capture_output=True)
    return {"runtime": out / "runtime.md", "runs": out / "runs.csv"}


def test_generated_files_from_the_committed_results(generated_files):
    root = results_root("paper")
    groups = {name: configs for name, configs in run_groups("fmnist", "paper", root=root).items() if configs}
    with warnings.catch_warnings():  # results stored in an outdated form: not counted, said elsewhere
        warnings.simplefilter("ignore")
        cached = {c.key() for configs in groups.values() for c in configs if has_run(c, root)}
    runs = pd.read_csv(generated_files["runs"])
    assert set(runs["key"]) == cached and runs["key"].is_unique
    assert (runs["wall_time"] > 0).all() and runs["final_accuracy"].between(0, 1).all()
    rows = generated_files["runtime"].read_text(encoding="utf8").split("\n\n")[0].splitlines()[2:]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == [*(GROUP_TITLES[g] for g in groups),
                                                               "all groups (each run once)"]
    total = re.match(r"\| all groups \(each run once\) \| (\d+) of (\d+) \| ([\d.]+) \|", rows[-1])
    assert total and int(total.group(1)) == len(cached)
    assert float(total.group(3)) == pytest.approx(runs["wall_time"].sum() / 3600, abs=0.005)


def test_generated_files_are_built_not_committed():
    """`make book-html` (and so `make book` and `make test`) writes them first; git ignores them;
    the rerun page includes and links exactly these two files."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf8")
    assert re.search(r"^book-html: generated\b", makefile, flags=re.M)
    assert re.search(r"^generated:.*\n\t\$\(PY\) -m tools\.generated \$\(GENERATED_DIR\)", makefile, flags=re.M)
    assert "GENERATED_DIR := book/_generated" in makefile
    ignored = subprocess.run(["git", "check-ignore", "-q", "book/_generated/runtime.md"], cwd=ROOT)
    assert ignored.returncode == 0, "book/_generated/ is not ignored by git"
    tracked = subprocess.run(["git", "ls-files", "book/_generated"], cwd=ROOT, capture_output=True, text=True)
    assert tracked.stdout.strip() == "", f"generated files are committed: {tracked.stdout}"
    rerun = (ROOT / "book" / "rerun.md").read_text(encoding="utf8")
    assert "```{include} _generated/runtime.md" in rerun and "<_generated/runs.csv>" in rerun



def test_verify_breakdown_by_hand(tmp_path):
    def record(key, stored, new, kernels="native", flipped=False):
        return {"key": key, "label": "x", "gamma": 0.9, "seed": 0, "stored_kernels": kernels, "identical": stored == new,
                "stored_accuracy": stored, "new_accuracy": new, "stored_collapsed": False, "new_collapsed": flipped,
                "stored_machine": "a", "new_machine": "b", "collapse_flipped": flipped, "now_kernels": "pinned"}

    logs = tmp_path / "verify"
    logs.mkdir()
    (logs / "one.jsonl").write_text("\n".join(json.dumps(r) for r in [
        record(A.key(), 0.80, 0.80), record(B.key(), 0.70, 0.72), record(C.key(), 0.10, 0.60, flipped=True)]) + "\n")
    (logs / "two.jsonl").write_text(json.dumps(record(C.key(), 0.60, 0.61)) + "\n"
                                    + json.dumps(record(D.key(), 0.5, 0.9, kernels="pinned")) + "\n")
    groups = {"g1": [A, B, C], "g2": [C, D], "none": [STALE]}
    table = provenance.verify_breakdown(groups, logs).set_index("group")
    assert list(table.index) == ["g1", "g2"]  # a group without recomputed runs is left out
    assert table.loc["g1", "recomputed"] == 4 and table.loc["g1", "bit-identical"] == 1  # C twice
    assert table.loc["g1", "median change"] == pytest.approx(0.015) and table.loc["g1", "largest change"] == pytest.approx(0.5)
    assert table.loc["g1", "collapses flipped"] == 1 and table.loc["g1", "at chance once"] == 1
    assert table.loc["g2", "recomputed"] == 2  # D, stored pinned, is demanded, not measured: left out
    assert table.loc["g2", "largest change"] == pytest.approx(0.5) and table.loc["g2", "at chance once"] == 1
    by_method = provenance.verify_breakdown(groups, logs, by="method").set_index("method")
    assert list(by_method.index) == [METHODS["fedavg"].display, METHODS["fedvarp"].display]  # MIFA: none; D pinned
    assert by_method.loc[METHODS["fedavg"].display, "recomputed"] == 2  # A and B
    assert by_method.loc[METHODS["fedvarp"].display, "recomputed"] == 2  # C in two logs
    assert by_method.loc[METHODS["fedvarp"].display, "largest change"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="by="):
        provenance.verify_breakdown(groups, logs, by="seed")
