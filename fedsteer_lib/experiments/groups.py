"""The run groups: ONE definition of every set of runs the book shows.

`status`, `sweep` and every chapter iterate `run_groups(...)` (or one of its builders), so a
group cannot be assembled twice in two different ways. Each builder takes the data set, the
profile and the device and returns RunConfigs; which seeds and gammas come from the profile.
The groups derived from other runs (the calibrated point, the reruns at each method's own
server step) also take the results cache they are derived from, `root`: always passed by the
caller, never a default, so that `--results DIR` reaches every group.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable, Sequence

import pandas as pd

from .config import (CALIBRATION_TARGET, DATASET_DEFAULTS, REGIME_GAMMAS, REGIME_SEEDS, TUNED, Diagnostics, FLSystem, MethodSpec,
                     Profile, RunConfig, framework_methods, get_profile, method, paper_methods, regime_methods,
                     server_step_methods)
from .registry import role_of
from .sweep import grid
from .tuning import VALIDATION_SIZE, calibrated_cell, select_server_steps, tuning_configs

__all__ = ["paper_grid", "ablation_grid", "framework_grid", "regime_grid", "convergence_methods", "convergence_grid",
           "alignment_grid", "stability_grid", "GROUP_TITLES", "server_step_grid", "server_step_choices", "own_step_grid", "calibration_cell", "calibrated_grid", "reference_grid", "TRACKED_CLIENTS", "GROUP_SETS", "IN_PROGRESS", "run_groups",
           "PARITY_ROLES", "PARITY_PRECISION", "precision_parity_grid"]


def paper_grid(dataset: str = "fmnist", profile: str = "paper", device: str = "cpu") -> list[RunConfig]:
    """Table 1 / Fig. 4: every method of the paper, the profile's gammas and seeds."""
    return grid(dataset, paper_methods(dataset), profile, device=device)


FEW_SEED_GROUPS = ("forced_refresh",)  # a check of ours, run on the profile's first `ablation_seeds` seeds


def ablation_grid(dataset: str = "fmnist", profile: str | Profile = "paper", device: str = "cpu") -> dict[str, list[RunConfig]]:
    """The ablations of the book's chapter 7, by name."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    dd = DATASET_DEFAULTS[dataset]
    k, lam = dd["core_size"], dd["lam"]
    few = prof.seeds[: prof.ablation_seeds]  # FEW_SEED_GROUPS use fewer seeds (stated in the book)
    kw = dict(profile=prof, device=device)
    return {
        # Fig. 5 (|X| x lambda), every seed of the profile: a claim of the paper, decided like the others.
        "coreset_lambda": grid(dataset, [method("fedsteer", core_size=s, lam=l, refresh_every=5)
                                         for s in prof.coreset_sizes for l in (0.0, 0.5)], **kw),
        "subsampled": grid(dataset, [method("fedsteer", core_size=k, lam=lam, subsample=20)], **kw),
        "random_core": grid(dataset, [method("fedsteer", core_size=k, lam=lam, selection="random")], **kw),
        "ordering": grid(dataset, [method("fedsteer", core_size=k, lam=lam, ordering="as_written")], **kw),
        "fair_start": grid(dataset, [method("fedvarp", warmup_cycles=5), method("mifa", warmup_cycles=5)], **kw),
        # The other reading of "enforce=5": every 5th round all clients refresh their coordinates.
        "forced_refresh": grid(dataset, [method("fedsteer", core_size=k, lam=lam, enforce_every=5)], seeds=few, **kw),
    }


def framework_grid(dataset: str = "fmnist", profile: str | Profile = "paper", device: str = "cpu") -> list[RunConfig]:
    """The baselines in the FedStale code base's conventions (`config.framework_methods`) that
    Table 1 does not already hold, at the profile's gammas and seeds."""
    return grid(dataset, framework_methods(dataset), profile, device=device)


def regime_grid(dataset: str = "fmnist", profile: str | Profile = "paper", device: str = "cpu") -> list[RunConfig]:
    """The regime map: client lr x local epochs (the profile's axes; the paper profile's are
    `config.REGIME_GRID`) at gamma = 0.9, on the map's seeds (the profile's, where it has
    fewer). The cell of the frozen settings reuses Table 1's runs (same keys)."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    seeds = [s for s in prof.seeds if s in REGIME_SEEDS] or list(prof.seeds[:1])
    gammas = [g for g in prof.gammas if g in REGIME_GAMMAS] or list(prof.gammas[-1:])
    configs = []
    for lr in prof.regime_client_lrs:
        for epochs in prof.regime_local_epochs:
            configs += grid(dataset, regime_methods(dataset), prof, gammas=gammas, seeds=seeds, device=device,
                            client_lr=lr, local_epochs=epochs)
    return configs



def _with_roles(methods: Sequence[MethodSpec], roles: Sequence[str], dataset: str) -> list[MethodSpec]:
    """The methods whose role (`registry.role_of`) is one of `roles` (a profile's smaller grid)."""
    dd = {k: v for k, v in DATASET_DEFAULTS[dataset].items() if k in ("core_size", "lam")}
    return [m for m in methods if role_of(m.name, dict(m.params), dd) in roles]


def calibration_cell(dataset: str, profile: str | Profile, root: str | os.PathLike) -> dict | None:
    """The paper-calibrated cell of the regime map (`config.CALIBRATION_TARGET`,
    `tuning.calibrated_cell`), from the cached runs of the calibration method in every cell of
    the map; None until all of them are cached (the rule is over the map's seeds)."""
    from .results import load_run
    from .sweep import missing

    target = CALIBRATION_TARGET
    if dataset != target["dataset"]:
        return None
    configs = [c for c in regime_grid(dataset, profile) if c.method.name == target["method"]
               and c.system.gamma == target["gamma"]]
    if not configs or missing(configs, root):
        return None
    runs = pd.DataFrame([{"client_lr": c.training.client_lr, "local_epochs": c.training.local_epochs,
                          "final_accuracy": load_run(c, root)["summary"]["final_accuracy"]} for c in configs])
    cells = runs.groupby(["client_lr", "local_epochs"])["final_accuracy"].agg(mean="mean", n="count").reset_index()
    return calibrated_cell(cells, target["paper_accuracy"])


def calibrated_grid(dataset: str, profile: str | Profile, device: str = "cpu", *,
                    root: str | os.PathLike) -> list[RunConfig]:
    """The paper-calibrated point: Table 1's methods (full participation excepted: it is the
    reference, not a competitor, and costs N clients a round), FedSteer as written and the FedStale
    code base's baselines (those of the profile's `calibrated_roles` where it names them), at the
    calibrated cell's client lr and local epochs, the profile's gammas and seeds. Empty until the cell is known (`calibration_cell`)."""
    cell = calibration_cell(dataset, profile, root)
    if cell is None:
        return []
    dd = DATASET_DEFAULTS[dataset]
    methods = [m for m in paper_methods(dataset) if m.name != "full"]
    methods.append(method("fedsteer", ordering="as_written", core_size=dd["core_size"], lam=dd["lam"]))
    methods += [m for m in framework_methods(dataset) if m not in methods]
    prof = get_profile(profile) if isinstance(profile, str) else profile
    if prof.calibrated_roles is not None:
        methods = _with_roles(methods, prof.calibrated_roles, dataset)
    return grid(dataset, methods, profile, device=device, client_lr=cell["client_lr"],
                local_epochs=cell["local_epochs"])


def server_step_grid(dataset: str = "fmnist", profile: str | Profile = "paper", device: str = "cpu") -> list[RunConfig]:
    """The server-step search (the profile's `server_lrs` x `config.server_step_methods`, those of
    its `server_step_roles` where it names them) on the validation split, at the profile's gammas
    and its first seed. The paper profile's steps are `config.SERVER_LRS`, for every method."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    methods = server_step_methods(dataset)
    if prof.server_step_roles is not None:
        methods = _with_roles(methods, prof.server_step_roles, dataset)
    configs = []
    for server_lr in prof.server_lrs:
        configs += grid(dataset, methods, prof, seeds=prof.seeds[:1], device=device,
                        system=FLSystem(validation_size=VALIDATION_SIZE), server_lr=server_lr)
    return configs


def server_step_choices(dataset: str, profile: str | Profile, root: str | os.PathLike) -> dict[MethodSpec, float] | None:
    """Each method of the server-step search and the step it gets (`tuning.select_server_steps`
    over `server_step_grid`'s runs: final-round validation accuracy averaged over the gammas),
    in the search's method order; None until every run of the search is cached."""
    from .results import load_run
    from .sweep import missing

    configs = server_step_grid(dataset, profile)
    if not configs or missing(configs, root):
        return None
    specs = {c.method.label: c.method for c in configs}
    runs = pd.DataFrame([{"label": c.method.label, "server_lr": c.training.server_lr, "gamma": c.system.gamma,
                          "final_accuracy": load_run(c, root)["summary"]["final_accuracy"]} for c in configs])
    chosen = select_server_steps(runs).set_index("label")["server_lr"]
    return {spec: float(chosen[label]) for label, spec in specs.items()}


def own_step_grid(dataset: str, profile: str | Profile, device: str = "cpu", *,
                  root: str | os.PathLike) -> list[RunConfig]:
    """The methods of the server-step search whose chosen step (`server_step_choices`) is not the
    frozen one (`config.TUNED`'s server lr), rerun at that step on the test split, the profile's
    gammas and seeds (the methods at the frozen step reuse Table 1's runs). Empty until the
    search is complete."""
    choices = server_step_choices(dataset, profile, root)
    if choices is None:
        return []
    frozen = TUNED[dataset].server_lr
    return [c for spec, server_lr in choices.items() if server_lr != frozen
            for c in grid(dataset, [spec], profile, device=device, server_lr=server_lr)]


def convergence_methods(dataset: str, profile: str | Profile = "paper") -> list[MethodSpec]:
    """The methods of the variance-term probes: `config.paper_methods` without full
    participation (its partial-update variance is 0 by construction, p_i = 1) and with
    FedStale at beta = 0.7 only (those of the profile's `convergence_roles` where it names them)."""
    methods = [m for m in paper_methods(dataset)
               if m.name != "full" and not (m.name == "fedstale" and m.get("beta") != 0.7)]
    prof = get_profile(profile) if isinstance(profile, str) else profile
    return methods if prof.convergence_roles is None else _with_roles(methods, prof.convergence_roles, dataset)


def convergence_grid(dataset: str, profile: str | Profile, *, seeds: Sequence[int] | None = None,
                     device: str = "cpu") -> list[RunConfig]:
    """The variance probe runs (Theorem 1's variance, Theorem 2's term): `convergence_methods` x
    the profile's gammas x its seeds, with the profile's `probe_every` and `probe_mc_samples` (every
    client's true update and the aggregation's mean squared error to sum_i d_i g_i on every probe
    round)."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    seeds = tuple(seeds) if seeds is not None else prof.seeds
    return grid(dataset, convergence_methods(dataset, prof), prof, gammas=prof.gammas, seeds=seeds, device=device,
                diagnostics=Diagnostics(probe_every=prof.probe_every, probe_mc_samples=prof.probe_mc_samples))


def alignment_grid(dataset: str, profile: str | Profile, *, seeds: Sequence[int] | None = None,
                   device: str = "cpu") -> list[RunConfig]:
    """The alignment probe runs: FedSteer (the data set's |X| and lambda) x the profile's gammas
    x its seeds, probing every `probe_every` rounds (cos of stale and of steered estimates
    against the true updates). They are FedSteer's runs of `convergence_grid` (same keys)."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    dd = DATASET_DEFAULTS[dataset]
    seeds = tuple(seeds) if seeds is not None else prof.seeds
    return grid(dataset, [method("fedsteer", core_size=dd["core_size"], lam=dd["lam"])], prof, seeds=seeds,
                device=device, diagnostics=Diagnostics(probe_every=prof.probe_every, probe_mc_samples=prof.probe_mc_samples))


TRACKED_CLIENTS: tuple[int, ...] = (5, 55, 95)  # the clients of the paper's Fig. 8


STABILITY_REFRESH_EVERY = 5  # Fig. 8's runs: enforce=5 read as refresh_every=5


def stability_grid(dataset: str, profile: str | Profile, *, seeds: Sequence[int] | None = None,
                   device: str = "cpu") -> dict[str, RunConfig]:
    """The coordinate-stability runs (Fig. 8): FedSteer with enforce=5 (refresh_every=5) for
    lambda in {0, 0.5} x |X| in {10, 40}, at the profile's gammas and seeds, with the
    coordinates of clients 5, 55 and 95 recorded every round. Keys name the settings, gamma and
    seed."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    # At least two refresh periods, so that a client can be seen refreshed (the quick profile's
    # 5 rounds are one period; the paper's 150 are unchanged).
    prof = replace(prof, rounds=max(prof.rounds, 2 * STABILITY_REFRESH_EVERY))
    seeds = tuple(seeds) if seeds is not None else prof.seeds
    settings = {f"λ={lam}, |X|={k}": method("fedsteer", core_size=k, lam=lam, refresh_every=STABILITY_REFRESH_EVERY)
                for lam in (0.0, 0.5) for k in (10, 40)}
    out = {}
    for name, spec in settings.items():
        for c in grid(dataset, [spec], prof, gammas=prof.gammas, seeds=seeds, device=device,
                      diagnostics=Diagnostics(track_coords=TRACKED_CLIENTS)):
            out[(name, c.system.gamma, c.seed)] = c
    return out


def reference_grid(dataset: str = "fmnist", profile: str | Profile = "paper", device: str = "cpu") -> list[RunConfig]:
    """A short run that CI recomputes bit for bit (`verify --what reference`): FedSteer with the
    data set's |X| and lambda, one warm-up cycle, 3 rounds of one local epoch at gamma = 0.9,
    seed 0, evaluated on a 2,000-image validation split (about 20 s on one thread). It
    exercises every part of a run (warm-up, core-set search, Eq. 3 and 4, local training,
    evaluation); its committed result was computed with pinned kernels."""
    dd = DATASET_DEFAULTS[dataset]
    spec = method("fedsteer", core_size=dd["core_size"], lam=dd["lam"], warmup_cycles=1)
    training = replace(TUNED[dataset], rounds=3, local_epochs=1, eval_every=3, eval_last=1)
    return [RunConfig(dataset=dataset, method=spec, system=FLSystem(gamma=0.9, validation_size=2000),
                      training=training, seed=0, device=device, emnist_split=dd.get("split", "balanced")).validate()]


# Accuracy parity of bf16 (issue 32): Table 1's setting for FedAvg, FedSteer in both orderings of
# Eq. 4 and the best Table 1 baseline, in bf16, paired by seed with their committed fp32 runs
# (the rerun page's "Running faster"). The best baseline is fixed here, before any bf16 run:
# MIFA, the Table 1 baseline (`registry.BASELINE_ROLES`, FedStale at its best beta) with the
# highest mean final accuracy at both gammas in the committed fp32 results (0.843 at gamma 0.7,
# 0.830 at 0.9); the rerun page checks that it still is and says so if not.
PARITY_ROLES: tuple[str, ...] = ("fedavg", "fedsteer", "fedsteer_as_written", "mifa")
PARITY_PRECISION = "bf16"


def precision_parity_grid(dataset: str = "fmnist", profile: str | Profile = "paper", device: str = "cpu", *,
                          precision: str = PARITY_PRECISION) -> list[RunConfig]:
    """`PARITY_ROLES` at the profile's gammas and seeds with the frozen training settings, at
    `precision` (bf16: the parity group; fp32: the committed runs it is paired with, those of
    Table 1 and of the ordering ablation, same keys)."""
    dd = DATASET_DEFAULTS[dataset]
    steer = dict(core_size=dd["core_size"], lam=dd["lam"])
    specs = {"fedavg": method("fedavg"), "fedsteer": method("fedsteer", **steer),
             "fedsteer_as_written": method("fedsteer", ordering="as_written", **steer), "mifa": method("mifa")}
    return [c.replace(precision=precision) for c in grid(dataset, [specs[r] for r in PARITY_ROLES], profile, device=device)]


def _tuning(dataset: str, profile: str | Profile, device: str, root: str | os.PathLike) -> dict[str, list[RunConfig]]:
    """The FedAvg-only tuning of the training settings (validation split); paper profile only."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    return {"tuning": tuning_configs(dataset, device=device)} if prof.name == "paper" else {}


# What each group is, for a reader (the rerun page's tables name groups by these).
GROUP_TITLES: dict[str, str] = {
    "main": "Table 1", "coreset_lambda": "Fig. 5: core-set size × λ", "subsampled": "subsampled core-set search",
    "random_core": "random core set", "ordering": "FedSteer, literal reading", "fair_start": "fair start",
    "forced_refresh": "enforce=5, the other reading", "framework_conventions": "the FedStale code base's baselines",
    "regime_map": "regime map", "alignment_probes": "alignment probes", "convergence_probes": "variance probes",
    "coordinate_stability": "coordinate stability", "tuning": "FedAvg tuning", "server_step_tuning": "server-step search",
    "own_server_step": "each method's own server step", "calibrated_point": "paper-calibrated cell",
    "pinned_reference": "pinned reference run", "precision_parity": "bf16 parity"}


# Groups still being computed (over several sessions, by `make reproduce` or a sweep): their
# chapters show the runs that are cached and say how many are missing; `make book` never
# computes them. A group leaves this set once it is complete (tests/test_sweep.py checks both).
IN_PROGRESS: frozenset[str] = frozenset({"coreset_lambda"})


# What `--what` selects: each entry returns {group name: configs}, given the data set, the
# profile, the device and the results cache (which the derived groups are computed from).
GROUP_SETS: dict[str, Callable[[str, str | Profile, str, str | os.PathLike], dict[str, list[RunConfig]]]] = {
    "main": lambda d, p, dev, root: {"main": paper_grid(d, p, dev)},
    "ablations": lambda d, p, dev, root: ablation_grid(d, p, dev),
    "conventions": lambda d, p, dev, root: {"framework_conventions": framework_grid(d, p, dev)},
    "regimes": lambda d, p, dev, root: {"regime_map": regime_grid(d, p, dev)},
    "diagnostics": lambda d, p, dev, root: {
        "alignment_probes": alignment_grid(d, p, device=dev),
        "convergence_probes": convergence_grid(d, p, device=dev),
        "coordinate_stability": list(stability_grid(d, p, device=dev).values())},
    "tuning": _tuning,
    "server_step": lambda d, p, dev, root: {"server_step_tuning": server_step_grid(d, p, dev),
                                            "own_server_step": own_step_grid(d, p, dev, root=root)},
    "calibrated": lambda d, p, dev, root: {"calibrated_point": calibrated_grid(d, p, dev, root=root)},
    "reference": lambda d, p, dev, root: {"pinned_reference": reference_grid(d, p, dev)},
    "precision": lambda d, p, dev, root: {"precision_parity": precision_parity_grid(d, p, dev)},
}


def run_groups(dataset: str, profile: str | Profile, device: str = "cpu", what: str = "all", *,
               root: str | os.PathLike) -> dict[str, list[RunConfig]]:
    """Every run group of `what` ("all", or keys of GROUP_SETS, comma-separated), by name, in
    GROUP_SETS' order; the derived groups are read from the results cache `root` (the same cache
    the caller reads and writes)."""
    keys = list(GROUP_SETS) if what == "all" else [k for k in GROUP_SETS if k in what.split(",")]
    out: dict[str, list[RunConfig]] = {}
    for key in keys:
        out.update(GROUP_SETS[key](dataset, profile, device, root))
    return out
