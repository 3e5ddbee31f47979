"""Pinned numerics, provenance that names the machine, and `verify` (issue 33).

The pinned mode is shown to work the way the issue asks: the same small run computed in two
processes given different maximum instruction sets differs with native kernels, and is
bit-identical with pinned kernels."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fedsteer_lib import numerics
from fedsteer_lib.experiments import cli
from fedsteer_lib.experiments.config import FLSystem, RunConfig, Training, method
from fedsteer_lib.experiments.results import run_path, save_run
from fedsteer_lib.experiments.sweep import run_grid

REPO = Path(__file__).resolve().parents[1]
# Evaluated on a 1,000-image validation split: a few seconds a run.
SMALL = RunConfig(method=method("fedavg"), system=FLSystem(num_clients=20, gamma=0.9, validation_size=1000), seed=0,
                  training=Training(rounds=3, local_epochs=1, eval_every=1, eval_last=1, client_lr=0.1))

RUN = """
import json, sys
from fedsteer_lib import numerics
numerics.select_kernels()  # $FEDSTEER_KERNELS, before torch computes (as every entry point does)
from fedsteer_lib.experiments.config import FLSystem, RunConfig, Training, method
from fedsteer_lib.simulator.engine import run
c = RunConfig(method=method("fedavg"), system=FLSystem(num_clients=20, gamma=0.9, validation_size=1000), seed=0,
              training=Training(rounds=3, local_epochs=1, eval_every=1, eval_last=1, client_lr=0.1))
r = run(c, progress=False)
print(json.dumps({"rounds": [[h["accuracy"], h["loss"], h["update_norm"]] for h in r.history], "machine": r.machine}))
"""
# A lower maximum instruction set than this CPU's best, for each of the three libraries.
LOWER_ISA = {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "SSE4_2"}


def _run_in_process(kernels: str, extra_env: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (*LOWER_ISA, numerics.ENV_VAR)}
    env.update(extra_env, **{numerics.ENV_VAR: kernels})
    proc = subprocess.run([sys.executable, "-c", RUN], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def four_runs() -> dict[tuple[str, str], dict]:
    cases = [(k, isa) for k in numerics.KERNELS for isa in ("best", "lower")]
    with ThreadPoolExecutor(2) as pool:
        outs = pool.map(lambda case: _run_in_process(case[0], LOWER_ISA if case[1] == "lower" else {}), cases)
    return dict(zip(cases, outs))


def test_native_kernels_give_other_bits_under_another_maximum_isa(four_runs):
    best, lower = four_runs[("native", "best")], four_runs[("native", "lower")]
    assert best["rounds"] != lower["rounds"]
    assert lower["machine"]["aten_cpu_capability"] == "DEFAULT" and lower["machine"]["mkl_cbwr"] == "SSE4_2"


def test_pinned_kernels_give_the_same_bits_whatever_maximum_isa_the_process_is_given(four_runs):
    best, lower = four_runs[("pinned", "best")], four_runs[("pinned", "lower")]
    assert best["rounds"] == lower["rounds"]
    for m in (best["machine"], lower["machine"]):
        assert (m["kernels"], m["aten_cpu_capability"], m["onednn"], m["nnpack"], m["mkl_cbwr"], m["threads"]) == (
            "pinned", "AVX2", "off", "off", "COMPATIBLE,STRICT", 1)


def test_pinned_kernels_refuse_a_process_where_torch_computed_first():
    code = """
import os, torch
os.environ["ATEN_CPU_CAPABILITY"] = "default"
torch.ones(8).sum()  # ATen's CPU capability is now fixed at DEFAULT
from fedsteer_lib import numerics
numerics.select_kernels("pinned")
try:
    numerics.check_kernels("cpu")
except numerics.NumericsError as err:
    print("REFUSED", err)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True).stdout
    assert "REFUSED pinned kernels asked for, but torch uses DEFAULT kernels" in out and "select_kernels('pinned') before torch computes" in out


PINNED_RUN = """
import sys
from fedsteer_lib import numerics
numerics.select_kernels("pinned")
from fedsteer_lib.experiments.config import RunConfig
from fedsteer_lib.experiments.sweep import run_grid
import json
config = RunConfig.from_dict(json.loads(sys.argv[2]))
assert run_grid([config], sys.argv[1], progress=False) == 1
"""


@pytest.fixture(scope="module")
def computed(tmp_path_factory) -> Path:
    """A cache holding SMALL computed with pinned kernels, in a process of its own (the tests'
    own processes compute with native kernels), once for the tests below (each copies it)."""
    root = tmp_path_factory.mktemp("computed")
    proc = subprocess.run([sys.executable, "-c", PINNED_RUN, str(root), json.dumps(SMALL.to_dict())], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture
def cache(computed, tmp_path) -> Path:
    import shutil

    shutil.copytree(computed, tmp_path / "cache")
    return tmp_path / "cache"


def test_a_result_records_the_machine_that_computed_it(cache):
    tmp_path = cache
    prov = json.loads(run_path(SMALL, tmp_path).read_text())["provenance"]
    for field in ("cpu", "cpu_signature", "cpu_flags", "kernels", "aten_cpu_capability", "onednn", "nnpack",
                  "mkl_cbwr", "sqrt", "torch", "onednn_version", "mkl_version", "numpy_version", "threads", "code_version",
                  "date", "python", "device"):
        assert field in prov, field
    assert prov["cpu"] == numerics.cpu_model() and "avx2" in prov["cpu_flags"]
    assert prov["cpu_signature"] == numerics.cpu_signature() != "unknown"
    assert prov["kernels"] == "pinned" and prov["threads"] == 1
    assert prov["code_version"].endswith("-dirty") == ("diff_sha1" in prov)


def test_a_dirty_tree_is_named_by_the_hash_of_its_diff(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f.py").write_text("x = 1\n")
    git("add", "f.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    assert numerics.tree_diff_hash(tmp_path) is None
    (tmp_path / "f.py").write_text("x = 2\n")
    first = numerics.tree_diff_hash(tmp_path)
    (tmp_path / "f.py").write_text("x = 3\n")
    assert first and len(first) == 12 and numerics.tree_diff_hash(tmp_path) not in (None, first)


# --- verify: identical, changed, collapse flipped --------------------------------------------------
def _verify(capsys, root: Path, *keys: str, extra: tuple[str, ...] = ()) -> tuple[int, str]:
    """`verify --kernels pinned` of `keys` in a process of its own (pinned kernels must be selected
    before torch computes): its exit status and output."""
    proc = subprocess.run([sys.executable, "-m", "fedsteer_lib", "verify", "--kernels", "pinned", "--profile", "quick",
                           "--results", str(root), *[a for k in keys for a in ("--key", k)], *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout


def test_verify_says_bit_identical_for_a_pinned_run(cache, capsys):
    tmp_path = cache
    code, out = _verify(capsys, tmp_path, SMALL.key())
    assert code == 0 and f"{SMALL.key()}  fedavg" in out and ": bit-identical" in out and "1 of 1 bit-identical" in out
    assert "1 of 1 done in " in out and " left" not in out


def test_verify_estimates_the_time_left_from_the_stored_runs_own_times():
    from fedsteer_lib.experiments.verify import Progress

    now = [0.0]
    progress = Progress({"short": 60.0, "long": 600.0, "skipped": 60.0}, clock=lambda: now[0])
    now[0] = 120.0  # this machine takes twice the stored time
    assert progress.finish("short") == "1 of 3 done in 2 min, about 22 min left"
    assert progress.finish("skipped", computed=False) == "2 of 3 done in 2 min, about 20 min left"
    now[0] = 1320.0
    assert progress.finish("long") == "3 of 3 done in 22 min"
    counted_alike = Progress({"a": 0.0, "b": 50.0}, clock=lambda: 0.0)  # a run without a stored time
    assert counted_alike.costs == {"a": 1.0, "b": 1.0}


def test_verify_fails_when_a_pinned_run_does_not_come_back(cache, capsys):
    tmp_path = cache
    path = run_path(SMALL, tmp_path)
    payload = json.loads(path.read_text())
    payload["history"][-1]["update_norm"] *= 1 + 1e-7  # one bit-level change in the last round
    payload["summary"]["final_accuracy"] -= 0.01
    payload["history"][-1]["accuracy"] -= 0.01
    path.write_text(json.dumps(payload))
    code, out = _verify(capsys, tmp_path, SMALL.key())
    assert code == 1 and "NOT REPRODUCED (a pinned run must come back bit for bit)" in out
    assert "(+0.0100); collapse unchanged" in out and "0 of 1 bit-identical" in out


def test_verify_does_not_demand_the_bits_of_a_run_pinned_to_mkls_avx2_branch(cache, capsys):
    # The first pin (MKL_CBWR=AVX2,STRICT) gave other bits on an AMD EPYC than on an Intel Xeon:
    # MKL serves its AVX2 branch on Intel CPUs only. Such a run is reported, never a failure.
    tmp_path = cache
    path = run_path(SMALL, tmp_path)
    payload = json.loads(path.read_text())
    payload["provenance"].update(mkl_cbwr=numerics.FIRST_PIN_MKL_CBWR, cpu="AMD EPYC", cpu_signature="AuthenticAMD 25/1/1")
    payload["history"][-1]["update_norm"] *= 1 + 1e-7
    path.write_text(json.dumps(payload))
    code, out = _verify(capsys, tmp_path, SMALL.key())
    assert code == 2 and "NOT REPRODUCED" not in out and "0 of 1 bit-identical" in out
    assert "(its bits are not demanded: pinned to MKL's AVX2 branch)" in out
    assert "stored on AMD EPYC (AuthenticAMD 25/1/1), pinned (MKL AVX2,STRICT) kernels" in out
    assert f"pinned (MKL {numerics.PINNED_ENV['MKL_CBWR']}) kernels" in out


def test_verify_reports_a_flipped_collapse_of_an_unpinned_run_without_failing(cache, capsys):
    tmp_path = cache
    path = run_path(SMALL, tmp_path)
    payload = json.loads(path.read_text())
    payload["provenance"] = {"cpu": "Some Other CPU", "code_version": "abc1234"}  # computed before pinning existed
    payload["summary"].update(collapsed=True, collapse_round=2, accuracy_before_collapse=0.3,
                              final_accuracy=0.1)
    payload["history"][-1]["accuracy"] = 0.1
    path.write_text(json.dumps(payload))
    code, out = _verify(capsys, tmp_path, SMALL.key())
    assert code == 2 and "collapse flipped (collapsed -> ran)" in out and "1 collapses flipped" in out
    assert "stored on Some Other CPU, native (before pinning existed) kernels, code abc1234" in out


def test_verify_replaces_an_unpinned_result_with_the_pinned_one(cache, capsys):
    tmp_path = cache
    path = run_path(SMALL, tmp_path)
    payload = json.loads(path.read_text())
    payload["provenance"] = {"cpu": "Some Other CPU"}
    path.write_text(json.dumps(payload))
    log = tmp_path / "log.jsonl"
    code, _ = _verify(capsys, tmp_path, SMALL.key(), extra=("--replace-unpinned", "--log", str(log)))
    assert code == 0 and json.loads(path.read_text())["provenance"]["kernels"] == "pinned"
    record = json.loads(log.read_text().splitlines()[0])
    assert record["key"] == SMALL.key() and record["identical"] and record["stored_kernels"] == "native"
    code, out = _verify(capsys, tmp_path, SMALL.key(), extra=("--replace-unpinned",))
    assert code == 0 and "nothing to verify" in out  # already pinned: not recomputed again


def test_verify_log_keeps_a_record_when_the_log_file_is_replaced_mid_run(cache):
    """A log file replaced while runs compute (a `git stash` or checkout of the committed log)
    still gets every record: verify opens the log per record, not once for the whole run."""
    from fedsteer_lib.experiments.results import load_run
    from fedsteer_lib.experiments.verify import verify_runs

    log = cache / "log.jsonl"
    log.write_text('{"key": "earlier"}\n')

    def replace_log(line: str) -> None:  # runs after the comparison, before its record is written
        replacement = cache / "replacement.jsonl"
        replacement.write_text('{"key": "earlier"}\n')
        os.replace(replacement, log)

    verify_runs([(SMALL, load_run(SMALL, cache))], cache, log=log, on_result=replace_log)
    keys = [json.loads(line)["key"] for line in log.read_text().splitlines()]
    assert keys == ["earlier", SMALL.key()]


def test_the_committed_pinned_reference_run_reproduces_bit_for_bit():
    """CI's check that a committed pinned run comes back bit for bit on the machine CI runs on."""
    proc = subprocess.run([sys.executable, "-m", "fedsteer_lib", "verify", "--what", "reference", "--kernels", "pinned"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "1 of 1 bit-identical" in proc.stdout, proc.stdout + proc.stderr
    assert "stored on" in proc.stdout and "pinned kernels" in proc.stdout


def test_every_committed_table_1_run_is_pinned():
    """Table 1 (the `main` group: both γ, 8 seeds, every method) is stored in the pinned mode
    that `verify` demands bit for bit (issue 33): MKL's compatible branch, and for FedSteer
    correctly rounded square roots; none is native, first-pin or vector-sqrt pinned."""
    from fedsteer_lib.experiments.groups import paper_grid
    from fedsteer_lib.experiments.results import load_run, results_root
    from fedsteer_lib.experiments.verify import stored_kernels

    root = results_root("paper")
    configs = paper_grid("fmnist", "paper")
    kernels = {c.key(): stored_kernels(load_run(c, root)) for c in configs}
    assert len(kernels) == 224
    assert {k: v for k, v in kernels.items() if v != "pinned"} == {}


def test_square_roots_are_correctly_rounded():
    """`numerics.sqrt` gives the correctly rounded root (math.sqrt's, by IEEE 754 the same on any
    CPU) for every value, in float64 and float32, where torch.sqrt on a CPU with MKL may be 1 ulp
    off (12 of 1,000 float64 values on an AMD EPYC)."""
    import math

    import torch

    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(20000, generator=gen, dtype=torch.float64) * 100,
                   torch.rand(2000, generator=gen, dtype=torch.float64) * 1e-300,
                   torch.tensor([0.0, 1e-310, 4.0, 2.0, 1e300], dtype=torch.float64)])
    exact = torch.tensor([math.sqrt(v) for v in x.tolist()], dtype=torch.float64)
    assert torch.equal(numerics.sqrt(x), exact)
    x32 = x[:20000].float()
    exact32 = torch.tensor([math.sqrt(v) for v in x32.tolist()], dtype=torch.float64).float()  # sqrt rounds once
    root32 = numerics.sqrt(x32)
    assert root32.dtype == torch.float32 and torch.equal(root32, exact32)
    assert torch.equal(numerics.sqrt(x[2::7]), exact[2::7])  # a strided view


def test_verify_does_not_demand_the_bits_of_fedsteer_runs_pinned_before_square_roots_were_rounded():
    """A FedSteer run pinned while its server took torch.sqrt (no ``sqrt`` in its provenance)
    has CPU-dependent bits: reported and recomputed by --replace-unpinned, never demanded. A
    baseline pinned then never took a square root: still pinned."""
    from fedsteer_lib.experiments.verify import VECTOR_SQRT_PIN, stored_kernels

    def payload(name: str, **prov) -> dict:
        return {"config": {"method": {"name": name}}, "provenance": {"kernels": "pinned", **prov}}

    assert stored_kernels(payload("fedsteer")) == VECTOR_SQRT_PIN
    assert stored_kernels(payload("fedsteer", sqrt=numerics.SQRT)) == "pinned"
    assert stored_kernels(payload("fedvarp")) == "pinned"
    assert stored_kernels({"config": {"method": {"name": "fedsteer"}}, "provenance": {"kernels": "native"}}) == "native"


def test_the_cpu_signature_names_vendor_family_model_and_stepping(monkeypatch):
    info = {"vendor_id": "GenuineIntel", "cpu family": "6", "model": "207", "stepping": "2"}
    monkeypatch.setattr(numerics, "_cpuinfo", lambda: info)
    assert numerics.cpu_signature() == "GenuineIntel 6/207/2"
    monkeypatch.setattr(numerics, "_cpuinfo", lambda: {"model name": "Apple M2"})
    assert numerics.cpu_signature() == "unknown"


def test_a_stratified_sample_takes_every_strata_first_draw_before_any_second(monkeypatch):
    from fedsteer_lib.experiments import results
    from fedsteer_lib.experiments.verify import select

    monkeypatch.setattr(results, "has_run", lambda config, root: True)
    configs = [SMALL.replace(method=method(m), system=FLSystem(num_clients=20, gamma=g, validation_size=1000), seed=s)
               for m in ("fedavg", "fedvarp") for g in (0.9, 0.7) for s in range(4)]
    drawn = select({"g": configs}, "unused", sample=2, seed=0, stratify=True)
    strata = [(c.method.label, c.system.gamma) for c in drawn]
    assert len(drawn) == 8 and len(set(strata[:4])) == 4 and len(set(strata[4:])) == 4
    assert set(strata[:4]) == set(strata[4:]) and len({c.key() for c in drawn}) == 8


def test_verify_skip_logged_leaves_out_the_runs_its_log_has(cache, capsys, tmp_path):
    log = tmp_path / "done.jsonl"
    log.write_text(json.dumps({"key": SMALL.key()}) + "\n")
    args = ["verify", "--profile", "quick", "--results", str(cache), "--key", SMALL.key(), "--log", str(log)]
    assert cli.main([*args, "--skip-logged"]) == 0
    out = capsys.readouterr().out
    assert f"leaving out 1 runs already in {log}" in out and "nothing to verify" in out
    with pytest.raises(SystemExit):
        cli.main(["verify", "--profile", "quick", "--results", str(cache), "--key", SMALL.key(), "--skip-logged"])
    assert "--skip-logged goes with --log FILE" in capsys.readouterr().err
