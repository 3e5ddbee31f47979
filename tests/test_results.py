"""results.runs_table / history_table carry one column per method parameter, as the config holds it."""
from __future__ import annotations

from fedsteer_lib.experiments.config import FLSystem, RunConfig, Training, method
from fedsteer_lib.simulator.engine import RunResult
from fedsteer_lib.experiments.results import METHOD_PARAMETERS, history_table, runs_table, save_run

SUMMARY = {"final_accuracy": 0.5, "mean_last_accuracy": 0.5, "final_loss": 1.0, "collapsed": False,
           "collapse_round": None, "server_memory_bytes": 0, "wall_time": 1.0}


def _save(root, spec):
    config = RunConfig(method=spec, system=FLSystem(gamma=0.9), training=Training(rounds=2)).validate()
    history = [{"round": t, "accuracy": 0.5, "loss": 1.0} for t in range(3)]
    save_run(RunResult(config=config.to_dict(), history=history, summary=SUMMARY, extras={}), config, root)
    return config


def test_runs_and_history_tables_have_the_method_parameters(tmp_path):
    specs = [method("fedsteer", core_size=10, lam=0.0, refresh_every=5), method("fedavg"), method("fedstale", beta=0.5),
             method("fedprox", mu=0.5, weighting="unbiased")]
    configs = [_save(tmp_path, s) for s in specs]
    runs = runs_table(configs, tmp_path)
    assert set(METHOD_PARAMETERS) <= set(runs.columns) and list(runs["label"]) == [s.label for s in specs]
    steer, avg, stale, prox = (runs.iloc[i] for i in range(4))
    assert (steer["core_size"], steer["lam"], steer["refresh_every"], steer["ordering"]) == (10, 0.0, 5, "unbiased")
    assert type(steer["core_size"]) is int  # as the config holds it, not 10.0
    assert steer["subsample"] == 0 and steer["enforce_every"] == 0 and steer["warmup_cycles"] == 5  # defaults
    assert all(avg[k] is None for k in METHOD_PARAMETERS)  # fedavg has no parameter
    assert stale["beta"] == 0.5 and stale["core_size"] is None
    assert (prox["mu"], prox["weighting"]) == (0.5, "unbiased") and prox["beta"] is None
    curves = history_table(configs, tmp_path)
    assert len(curves) == 12 and set(METHOD_PARAMETERS) <= set(curves.columns)
    assert curves.drop_duplicates("label")["core_size"].tolist() == [10, None, None, None]
    assert runs_table([], tmp_path).empty


def test_a_truncated_or_foreign_result_file_is_named_not_counted_and_recomputed(tmp_path):
    import json
    import warnings

    import pytest

    from fedsteer_lib.experiments.results import has_run, load_run, result_problem, run_path
    from fedsteer_lib.experiments.sweep import missing, run_grid

    configs = [RunConfig(method=method(m), system=FLSystem(num_clients=20, gamma=0.7, validation_size=1000), seed=0,
                         training=Training(rounds=2, local_epochs=1, eval_every=2, eval_last=1))
               for m in ("fedavg", "mifa", "fedvarp")]
    assert run_grid(configs, tmp_path, progress=False) == 3
    truncated, foreign, good = (run_path(c, tmp_path) for c in configs)
    truncated.write_text(truncated.read_text()[:100])
    foreign.write_text(json.dumps({"hello": 1}))
    with pytest.warns(UserWarning, match=str(truncated.name) + ".*unreadable.*the sweep recomputes it"):
        assert not has_run(configs[0], tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert result_problem(configs[1], tmp_path).startswith("not a run result")
        assert has_run(configs[2], tmp_path)
        assert missing(configs, tmp_path) == configs[:2]  # never silently counted
        with pytest.raises(ValueError, match="unreadable.*sweep` recomputes it"):
            load_run(configs[0], tmp_path)
        assert run_grid(configs, tmp_path, progress=False) == 2  # recomputed, the good one left alone
    assert all(has_run(c, tmp_path) for c in configs)
    assert load_run(configs[0], tmp_path)["key"] == configs[0].key()


def test_a_collapsed_run_in_the_old_summary_format_is_recomputed(tmp_path):
    import warnings

    from fedsteer_lib.experiments.results import has_run

    spec = method("fedavg")
    config = RunConfig(method=spec, seed=0)
    old = {"final_accuracy": 0.57, "collapsed": True, "collapse_round": 40}  # the last accuracy before collapse
    save_run(RunResult(config=config.to_dict(), history=[], summary=old, extras={}), config, tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not has_run(config, tmp_path)
    assert "collapsed run stored before" in str(caught[0].message)
    save_run(RunResult(config=config.to_dict(), history=[], summary={**old, "final_accuracy": 0.1,
                                                                       "accuracy_before_collapse": 0.57}, extras={}),
             config, tmp_path)
    assert has_run(config, tmp_path)


# --- an unknown code version is said; a result that cannot be saved is one line (issue 58) -------------
def test_an_unknown_code_version_says_why(tmp_path, monkeypatch):
    import os
    import shutil
    import subprocess

    from fedsteer_lib.experiments import results

    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    assert results._describe_code(tmp_path) == ("unknown", None, "git is not installed (not on PATH)")
    monkeypatch.undo()
    version, _, why = results._describe_code(tmp_path)  # not a repository
    assert version == "unknown" and why.startswith(f"git describe in {tmp_path}: not a git repository"), why
    if os.geteuid() == 0:  # a checkout owned by another user: git's "dubious ownership" (only root can make one)
        repo = tmp_path / "theirs"
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        for path in (repo, *repo.rglob("*")):
            os.lchown(path, 65534, 65534)
        version, _, why = results._describe_code(repo)
        assert version == "unknown" and "detected dubious ownership" in why, why
        shutil.rmtree(repo)


def test_saving_a_result_of_unknown_code_warns_once_in_one_line(tmp_path, monkeypatch, capsys):
    from fedsteer_lib.experiments import results

    why = "git describe in /x: detected dubious ownership in repository at '/x'"
    monkeypatch.setattr(results, "_PROCESS_CODE", ("unknown", None, why))
    monkeypatch.setattr(results, "_WARNED_UNKNOWN_CODE", False)
    config = _save(tmp_path, method("fedavg"))
    err = capsys.readouterr().err
    assert err == f"warning: results saved by this process record code_version 'unknown': {why}\n"
    assert results.load_run(config, tmp_path)["provenance"]["code_version"] == "unknown"
    _save(tmp_path, method("fedvarp"))
    assert capsys.readouterr().err == ""  # once per process


def test_a_full_disk_at_save_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    import errno

    import pytest

    from fedsteer_lib.experiments import results

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results.os, "fsync", full)
    with pytest.raises(results.ResultNotSavedError) as info:
        _save(tmp_path, method("fedavg"))
    message = str(info.value)
    assert "\n" not in message and message.endswith(".json: No space left on device")
    assert message.startswith("the result of run ") and " could not be saved to " in message
    assert [p.name for p in (tmp_path / "runs").iterdir()] == []


def test_a_disk_without_room_is_a_layout_problem_before_any_compute(tmp_path, monkeypatch):
    import os

    from fedsteer_lib.experiments import results

    real = os.statvfs

    class Full:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = st.f_frsize, 10

    monkeypatch.setattr(results.os, "statvfs", lambda path: Full(real(path)))
    config = RunConfig(method=method("fedavg"), system=FLSystem(gamma=0.9), training=Training(rounds=2))
    problems = results.layout_problems([config], tmp_path)
    assert list(problems) == [None] and "its disk is full" in problems[None] and str(tmp_path) in problems[None]
