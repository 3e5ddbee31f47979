"""The sweep runner: results are written atomically; a sweep killed with SIGKILL and restarted
loses no finished run and gives the same table as one that was never interrupted. Also the run
groups of the diagnostics chapters (`convergence_grid`, `stability_grid`)."""
import json
import os
import signal
import subprocess
import sys
import dataclasses
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from fedsteer_lib.experiments.config import FLSystem, RunConfig, Training, get_profile, method
from fedsteer_lib.experiments.groups import convergence_grid, server_step_grid, stability_grid
from fedsteer_lib.experiments.tuning import select_server_steps
from fedsteer_lib.experiments.results import results_root, runs_table

SCRIPT = textwrap.dedent("""
    import sys
    from fedsteer_lib.experiments.config import FLSystem, RunConfig, Training, method
    from fedsteer_lib.experiments.sweep import run_grid
    configs = [RunConfig(method=method(m), system=FLSystem(num_clients=20, gamma=0.7, validation_size=1000), seed=s,
                         training=Training(rounds=3, local_epochs=1, eval_every=3, eval_last=1))
               for s in (0, 1) for m in ("fedavg", "mifa")]
    run_grid(configs, sys.argv[1], progress=False)
""")


def _configs():
    return [RunConfig(method=method(m), system=FLSystem(num_clients=20, gamma=0.7, validation_size=1000), seed=s,
                      training=Training(rounds=3, local_epochs=1, eval_every=3, eval_last=1))
            for s in (0, 1) for m in ("fedavg", "mifa")]


def _sweep(root: Path, script: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(script), str(root)], env=env)


def test_killed_sweep_resumes_without_losing_runs(tmp_path):
    script = tmp_path / "sweep.py"
    script.write_text(SCRIPT)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    proc = _sweep(killed, script)
    deadline = time.time() + 300
    while time.time() < deadline and len(list((killed / "runs").glob("[0-9a-f]*.json"))) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = sorted(p.name for p in (killed / "runs").glob("[0-9a-f]*.json"))
    assert 2 <= len(done_before) < 4, done_before
    for p in (killed / "runs").glob("[0-9a-f]*.json"):  # every finished file is complete JSON
        json.loads(p.read_text())
    mtimes = {p: p.stat().st_mtime_ns for p in (killed / "runs").glob("[0-9a-f]*.json")}

    assert _sweep(killed, script).wait() == 0  # resume
    assert _sweep(clean, script).wait() == 0  # never interrupted
    for p, mtime in mtimes.items():  # finished runs were not recomputed
        assert p.stat().st_mtime_ns == mtime
    cols = ["key", "label", "seed", "final_accuracy", "final_loss", "collapsed"]
    resumed = runs_table(_configs(), killed)[cols]
    fresh = runs_table(_configs(), clean)[cols]
    assert len(resumed) == 4
    assert resumed.equals(fresh)


def _children(pid: int) -> list[int]:
    """The pids of `pid`'s multiprocessing workers."""
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", "spawn_main"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc (Linux)")
def test_a_killed_sweeps_workers_end_with_it(tmp_path):
    """`kill` reaches only the sweep, not its two workers: they must not go on computing as orphans."""
    script = tmp_path / "sweep.py"
    main = "if __name__ == '__main__':  # the workers are spawned: they import this file\n"
    script.write_text(SCRIPT.replace("rounds=3", "rounds=2000").replace(
        "run_grid(configs", main + "    run_grid(configs").replace("progress=False", "progress=False, workers=2"))
    proc = _sweep(tmp_path / "cache", script)
    deadline = time.time() + 120
    while time.time() < deadline and len(workers := _children(proc.pid)) < 2:
        time.sleep(0.2)
    assert len(workers) == 2, "the sweep did not start its two workers"
    while time.time() < deadline and len(list((tmp_path / "cache" / "runs" / ".locks").glob("*.lock"))) < 2:
        time.sleep(0.2)  # both workers are computing a run
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(Path(f"/proc/{w}").exists() for w in workers):
        time.sleep(0.2)
    alive = [w for w in workers if Path(f"/proc/{w}").exists()]
    for w in alive:  # leave no orphan behind, even when the check fails
        os.kill(w, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived their sweep"


def test_missing_result_is_a_clear_error(tmp_path):
    from fedsteer_lib.experiments.results import load_run

    with pytest.raises(FileNotFoundError, match="no result for run"):
        load_run(_configs()[0], tmp_path)


def test_complete_seeds_lists_only_seeds_with_every_run_cached(tmp_path):
    from fedsteer_lib.experiments.sweep import complete_seeds, run_grid

    configs = _configs()
    assert complete_seeds(configs, tmp_path) == []
    seed0 = [c for c in configs if c.seed == 0]
    run_grid(seed0 + [c for c in configs if c.seed == 1][:1], tmp_path, progress=False)
    assert complete_seeds(configs, tmp_path) == [0]
    # a grid without seed 1 (like Fig. 5's fewer seeds) does not hold seed 1 back
    assert complete_seeds(seed0, tmp_path) == [0]
    run_grid(configs, tmp_path, progress=False)
    assert complete_seeds(configs, tmp_path) == [0, 1]


def test_committed_results_cover_the_whole_fashion_mnist_paper_grid():
    """`make book` renders the paper profile without computing: every run of its grid is committed."""
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "fedsteer_lib", "status", "--profile", "paper",
                          "--dataset", "fmnist"], cwd=repo, capture_output=True, text=True, check=True).stdout
    from fedsteer_lib.experiments.groups import IN_PROGRESS, run_groups

    rows = {line.split()[0]: line.split()[1:4] for line in out.splitlines() if "runs cached" in line}
    assert set(rows) == set(run_groups("fmnist", "paper", root=results_root("paper"))), out
    for name, (cached, _, total) in rows.items():
        if name in IN_PROGRESS:  # a finished group must leave IN_PROGRESS (its chapter then needs every run)
            assert cached != total or total == "0", f"{name} is complete: remove it from groups.IN_PROGRESS\n{out}"
        else:
            assert cached == total, out
    assert "(every run the book needs is cached: make book renders from the cache, computing nothing" in out, out


# --- the diagnostics run groups of chapters 5 and 8 ----------------------------------------------
def test_convergence_grid_is_every_table_1_method_with_probes():
    paper = convergence_grid("fmnist", "paper", seeds=[3, 4])
    labels = [c.method.label for c in paper if c.system.gamma == 0.9 and c.seed == 3]
    assert labels == ["fedavg", "fedavg_unbiased", "fedvarp", "fedstale", "scaffold", "mifa", "fedprox", "fedsteer",
                      "fedsteer(refresh_every=5)"]
    assert [c.method.get("beta") for c in paper if c.method.name == "fedstale"] == [0.7] * 4
    assert len(paper) == 2 * 2 * 9 and {c.system.gamma for c in paper} == {0.7, 0.9} and {c.seed for c in paper} == {3, 4}
    assert len(convergence_grid("fmnist", "paper")) == 8 * 2 * 9  # every seed: the claims' units
    assert all(c.diagnostics.probe_every == 10 for c in paper)
    quick = convergence_grid("fmnist", "quick")  # the profile's five of them
    assert [c.method.label for c in quick] == ["fedavg_unbiased", "fedvarp", "mifa", "fedsteer(warmup_cycles=2)",
                                               "fedsteer(refresh_every=5, warmup_cycles=2)"]
    assert all(c.diagnostics.probe_every == 3 and c.training.rounds == 5 and c.seed == 0 for c in quick)
    assert all(c.training.local_epochs == 1 for c in quick) and all(c.training.local_epochs == 2 for c in paper)


def test_the_quick_regime_cell_is_the_quick_table_1_grid():
    # Its one cell (lr 0.1, the quick profile's E = 1) reuses Table 1's quick runs, as the paper
    # profile's lr 0.1 / E = 2 cell reuses Table 1's.
    from fedsteer_lib.experiments.groups import paper_grid, regime_grid

    for profile in ("quick", "paper"):
        table1 = {c.method.label: c.key() for c in paper_grid("fmnist", profile) if c.seed == 0 and c.system.gamma == 0.9}
        epochs = get_profile(profile).local_epochs or 2
        cell = {c.method.label: c.key() for c in regime_grid("fmnist", profile)
                if c.training.client_lr == 0.1 and c.training.local_epochs == epochs and c.seed == 0 and c.system.gamma == 0.9}
        shared = set(cell) & set(table1)
        assert {"fedavg", "fedvarp", "mifa"} <= shared and all(cell[m] == table1[m] for m in shared), profile


def test_stability_grid_is_fig_8_at_every_gamma_and_seed():
    configs = stability_grid("fmnist", "paper")
    settings = ["λ=0.0, |X|=10", "λ=0.0, |X|=40", "λ=0.5, |X|=10", "λ=0.5, |X|=40"]
    assert list(configs) == [(s, g, seed) for s in settings for g in (0.7, 0.9) for seed in range(8)]
    for (name, gamma, seed), c in configs.items():
        assert c.method.get("refresh_every") == 5 and c.system.gamma == gamma and c.seed == seed
        assert c.diagnostics.track_coords == (5, 55, 95) and c.training.rounds == 150
        assert name == f"λ={c.method.get('lam')}, |X|={c.method.get('core_size')}"


# The quick profile with two methods in its server-step search and two cells in its regime map
# (lr 0.1 at E = 1 and E = 2): the selection rules below need more than one of each.
TWO_STEP_METHODS = dataclasses.replace(get_profile("quick"), server_step_roles=("fedavg_unbiased", "fedsteer"))
TWO_REGIME_CELLS = dataclasses.replace(get_profile("quick"), regime_local_epochs=(1, 2))


def test_server_step_grid_gives_every_method_the_same_three_steps_on_validation():
    configs = server_step_grid("fmnist", "paper")
    per_method = {}
    for c in configs:
        per_method.setdefault(c.method.label, set()).add((c.training.server_lr, c.system.gamma))
        assert c.system.validation_size == 10_000 and c.seed == 0  # never the test set; seed 0 only
    assert all(v == {(s, g) for s in (0.25, 0.5, 1.0) for g in (0.7, 0.9)} for v in per_method.values())
    assert {"fedsteer", "fedsteer(ordering=as_written)", "fedavg", "mifa(start=wait_all)"} <= set(per_method)
    assert "full" not in per_method and [c.method.get("beta") for c in configs if c.method.name == "fedstale"] == [0.7] * 6
    assert len(configs) == 13 * 3 * 2
    quick = server_step_grid("fmnist", "quick")  # the quick profile: two steps for one method
    assert sorted((_label(c.method), c.training.server_lr) for c in quick) == [
        ("fedavg_unbiased", 0.5), ("fedavg_unbiased", 1.0)]
    two = server_step_grid("fmnist", TWO_STEP_METHODS)  # a profile's roles pick the methods
    assert sorted((_label(c.method), c.training.server_lr) for c in two) == [
        ("fedavg_unbiased", 0.5), ("fedavg_unbiased", 1.0), ("fedsteer", 0.5), ("fedsteer", 1.0)]


def _label(spec) -> str:
    """A method's label without FedSteer's warm-up length (which only the profile sets)."""
    return spec.label.replace("(warmup_cycles=2)", "").replace(", warmup_cycles=2", "")


def test_server_step_choice_by_hand():
    runs = pd.DataFrame([  # final-round validation accuracy, averaged over the gammas
        ("a", 0.25, 0.7, 0.80), ("a", 0.25, 0.9, 0.70), ("a", 1.0, 0.7, 0.85), ("a", 1.0, 0.9, 0.60),
        ("b", 0.5, 0.7, 0.70), ("b", 0.5, 0.9, 0.70), ("b", 1.0, 0.7, 0.72), ("b", 1.0, 0.9, 0.68)],
        columns=["label", "server_lr", "gamma", "final_accuracy"])
    chosen = select_server_steps(runs).set_index("label")
    assert chosen.loc["a", "server_lr"] == 0.25  # 0.75 beats 0.725
    assert chosen.loc["b", "server_lr"] == 1.0  # a tie at 0.70 goes to the frozen, larger step


def test_the_calibrated_point_follows_the_rule_once_the_map_has_every_unbiased_fedavg_run(tmp_path):
    from fedsteer_lib.experiments.config import CALIBRATION_TARGET
    from fedsteer_lib.experiments.groups import calibrated_grid, calibration_cell, regime_grid
    from fedsteer_lib.experiments.results import save_run
    from fedsteer_lib.simulator.engine import RunResult

    unbiased = [c for c in regime_grid("fmnist", TWO_REGIME_CELLS) if c.method.name == "fedavg_unbiased"]
    assert [(c.training.client_lr, c.training.local_epochs) for c in unbiased] == [(0.1, 1), (0.1, 2)]
    assert calibration_cell("fmnist", TWO_REGIME_CELLS, tmp_path) is None and calibrated_grid("fmnist", TWO_REGIME_CELLS, root=tmp_path) == []
    # |0.45 - 0.509| = 0.059 > |0.55 - 0.509| = 0.041: the E = 2 cell, once both cells are cached
    for c, acc in zip(unbiased, (0.45, 0.55)):
        save_run(RunResult(config=c.to_dict(), history=[], extras={},
                           summary={"final_accuracy": acc, "mean_last_accuracy": acc, "final_loss": 1.0,
                                    "collapsed": False, "collapse_round": None, "server_memory_bytes": 0,
                                    "wall_time": 1.0}), c, tmp_path)
        assert (calibration_cell("fmnist", TWO_REGIME_CELLS, tmp_path) is None) == (c is unbiased[0])
    cell = calibration_cell("fmnist", TWO_REGIME_CELLS, tmp_path)
    assert cell == {"client_lr": 0.1, "local_epochs": 2, "mean": 0.55, "n": 1, "paper": CALIBRATION_TARGET["paper_accuracy"]}
    every_method = dataclasses.replace(TWO_REGIME_CELLS, calibrated_roles=None)  # the paper profile's methods
    configs = calibrated_grid("fmnist", every_method, root=tmp_path)
    labels = [_label(c.method) for c in configs]
    assert "full" not in labels and "fedsteer(ordering=as_written)" in labels and "mifa(start=wait_all)" in labels
    assert len(labels) == len(set(labels)) == 17
    quick = [_label(c.method) for c in calibrated_grid("fmnist", TWO_REGIME_CELLS, root=tmp_path)]
    assert sorted(quick) == sorted(["fedavg", "fedavg_unbiased", "mifa(start=wait_all)",
                                    "fedsteer", "fedsteer(ordering=as_written)"])  # the quick profile's five
    assert {(c.training.client_lr, c.training.local_epochs) for c in configs} == {(0.1, 2)}


def test_own_step_grid_reruns_the_methods_whose_chosen_step_is_not_the_frozen_one(tmp_path):
    from fedsteer_lib.experiments.groups import own_step_grid, server_step_choices
    from fedsteer_lib.experiments.results import save_run
    from fedsteer_lib.simulator.engine import RunResult

    search = server_step_grid("fmnist", TWO_STEP_METHODS)  # FedAvg (unbiased) and FedSteer at eta_s 0.5 and 1
    assert server_step_choices("fmnist", TWO_STEP_METHODS, tmp_path) is None and own_step_grid("fmnist", TWO_STEP_METHODS, root=tmp_path) == []
    accuracy = {("fedavg_unbiased", 0.5): 0.7, ("fedavg_unbiased", 1.0): 0.6, ("fedsteer", 0.5): 0.6, ("fedsteer", 1.0): 0.6}
    for i, c in enumerate(search):
        acc = accuracy[(_label(c.method), c.training.server_lr)]
        save_run(RunResult(config=c.to_dict(), history=[], extras={},
                           summary={"final_accuracy": acc, "mean_last_accuracy": acc, "final_loss": 1.0, "collapsed": False,
                                    "collapse_round": None, "server_memory_bytes": 0, "wall_time": 1.0}), c, tmp_path)
        assert (server_step_choices("fmnist", TWO_STEP_METHODS, tmp_path) is None) == (i < len(search) - 1)
    choices = {_label(m): lr for m, lr in server_step_choices("fmnist", TWO_STEP_METHODS, tmp_path).items()}
    assert choices == {"fedavg_unbiased": 0.5, "fedsteer": 1.0}  # FedSteer's tie goes to the frozen step
    reruns = own_step_grid("fmnist", TWO_STEP_METHODS, root=tmp_path)
    assert [(_label(c.method), c.training.server_lr, c.system.validation_size) for c in reruns] == [
        ("fedavg_unbiased", 0.5, 0)]  # on the test split, every seed and gamma of the profile
    assert {(c.seed, c.system.gamma) for c in reruns} == {(0, 0.9)}
