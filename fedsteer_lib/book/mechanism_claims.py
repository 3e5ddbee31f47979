"""The ledger's mechanism and memory claims: what probes measured during training (alignment of
the steered estimate, paper §2.2 and Fig. 1; Theorem 1's variance and Theorem 2's variance term,
§3), coordinate stability (§8.5, Fig. 8) and the server's memory (§8.2).

Every probe group has the profile's seeds at each of its gammas (8 x 2 in the paper profile).
The unit of a claim is one run (alignment) or one (γ, seed) pair, whose runs share their data
and participation draws (the variance ratios, the coordinates' stability). Ratios of variances
are estimated on the log scale, cosines with a bootstrap over the units (`stats.estimate`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..experiments import groups
from ..experiments.config import DATASET_DEFAULTS
from ..experiments.results import load_run
from . import paper
from .claims import Claim
from .coordinates import coordinate_stability
from .table_display import fmt_pct

__all__ = ["MECHANISM_IDS", "probe_payloads", "alignment_by_run", "probe_means", "variance_ratios",
           "stability_by_unit", "variance_claims", "stability_claim", "memory_claims"]

MECHANISM_IDS = ("alignment", "variance-thm1", "variance-term-thm2")


def probe_payloads(book, configs) -> list[tuple[Any, dict]]:
    """(config, stored run) of every config whose run `book` can show (a group still being
    computed shows the runs cached so far)."""
    shown, _ = book.available(configs, "convergence_probes", desc="probe runs")
    return [(c, load_run(c, book.root)) for c in shown]


def alignment_by_run(payloads) -> list[float]:
    """Per run: the mean over its probe rows (inactive clients seen before) of cos(Q_t s_i, g_i) -
    cos(h_i, g_i): how much better the steered estimate points than the stale update. One value
    per run: rows of one run are not independent."""
    out = []
    for _, p in payloads:
        rows = pd.DataFrame([r for r in p["extras"].get("probes", []) if r["client"] >= 0])
        ok = rows[(rows["staleness"] >= 1) & rows["cos_stale"].notna() & rows["cos_estimate"].notna()] if len(rows) else rows
        if len(ok):
            out.append(float((ok["cos_estimate"] - ok["cos_stale"]).mean()))
    return out


def probe_means(payloads, field: str) -> pd.DataFrame:
    """Per run (method, γ, seed): the mean of `field` over its probe rounds (client -1 rows)."""
    rows = []
    for c, p in payloads:
        vals = [r[field] for r in p["extras"].get("probes", []) if r["client"] == -1 and r.get(field) is not None]
        rows.append({"method": c.method.label, "name": c.method.name, "refresh": c.method.get("refresh_every"),
                     "gamma": c.system.gamma, "seed": c.seed, "value": float(np.mean(vals)) if vals else np.nan})
    return pd.DataFrame(rows, columns=["method", "name", "refresh", "gamma", "seed", "value"])


def _is_steer(t: pd.DataFrame) -> pd.Series:
    return (t["name"] == "fedsteer") & (t["refresh"] == 1)


def variance_ratios(means: pd.DataFrame, against: str | None) -> pd.DataFrame:
    """Per (γ, seed): FedSteer's value over FedVARP's (`against="fedvarp"`) or over the smallest
    of every other method's (`against=None`: only pairs with a run of every method), from `probe_means`."""
    rows = []
    for (gamma, seed), at in means.groupby(["gamma", "seed"]):
        steer = at[_is_steer(at)]["value"].dropna()
        others = at[~_is_steer(at) & ((at["name"] == against) if against else True)]["value"].dropna()
        complete = against or at["method"].nunique() == means["method"].nunique()  # fewer would favour FedSteer
        if complete and len(steer) and len(others):
            rows.append({"gamma": gamma, "seed": seed, "ratio": float(steer.iloc[0] / others.min())})
    return pd.DataFrame(rows, columns=["gamma", "seed", "ratio"])


def variance_claims(book, only: Sequence[str] | None = None) -> list[Claim]:
    """The mechanism claims measured by probes during training, both gammas, every seed. `only`
    (claim ids): compute just those and the runs they need."""
    want = set(only) if only is not None else set(MECHANISM_IDS)
    name = paper.DATASET_NAMES[book.dataset]
    setting = f"{name}, γ ∈ {{{', '.join(f'{g:g}' for g in book.profile.gammas)}}}, probe rounds during training"
    out = []
    if "alignment" in want:
        align = alignment_by_run(probe_payloads(book, groups.alignment_grid(book.dataset, book.profile, seeds=book.seeds,
                                                                               device=book.device)))
        out.append(Claim("alignment", "mechanism", "The steered estimate Q_t s_i points closer to the true update than "
                         "the stale h_i", "§2.2, Fig. 1", setting, "closer (no number)", "02_corrective_projection",
                         align, unit="runs", statistic="mean over runs of cos(Q_t s_i, g_i) − cos(h_i, g_i)",
                         scale="bootstrap", bounds=(-2.0, 2.0), percent=False,
                         words=("the steered estimate closer", "the stale update closer"),
                         ours=f"{np.mean(align):+.3f} in cosine" if align else "—"))
    if not want & {"variance-thm1", "variance-term-thm2"}:
        return out
    configs = groups.convergence_grid(book.dataset, book.profile, seeds=book.seeds, device=book.device)
    if "variance-term-thm2" not in want:
        configs = [c for c in configs if c.method.name == "fedvarp"
                   or (c.method.name == "fedsteer" and c.method.get("refresh_every") == 1)]
    probes = probe_payloads(book, configs)
    if "variance-thm1" in want:
        ratios = variance_ratios(probe_means(probes, "exact_variance"), "fedvarp")["ratio"].tolist()
        out.append(Claim("variance-thm1", "mechanism", "FedSteer's aggregation has a lower variance than FedVARP's",
                         "§2.3, Theorem 1", setting, "minimised (no number)", "03_variance_minimization", ratios,
                         unit="(γ, seed) pairs", statistic="geometric mean over (γ, seed) of FedSteer's variance over "
                         "FedVARP's, as a change", scale="log_ratio", bounds=(-1.0, np.inf), direction=-1,
                         words=("FedSteer's variance higher", "FedSteer's variance lower"),
                         ours=f"{fmt_pct(np.exp(np.mean(np.log(ratios))) - 1)} (FedSteer over FedVARP)" if ratios else "—"))
    if "variance-term-thm2" in want:
        terms = variance_ratios(probe_means(probes, "mse_to_mean"), None)["ratio"].tolist()
        out.append(Claim("variance-term-thm2", "mechanism", "FedSteer has the smallest partial-update variance term",
                         "§3, Theorem 2", setting, "smallest (no number)", "05_convergence", terms,
                         unit="(γ, seed) pairs", statistic="geometric mean over (γ, seed) of FedSteer's term over the "
                         "smallest other method's, as a change", scale="log_ratio", bounds=(-1.0, np.inf),
                         direction=-1, words=("FedSteer's term larger", "FedSteer's term the smallest"),
                         ours=f"{fmt_pct(np.exp(np.mean(np.log(terms))) - 1)} (FedSteer over the smallest other)"
                         if terms else "—"))
    return out


STABILITY_TARGET = 0.9  # "stable": the coordinates keep a cosine above 0.9 across a refresh (the book's reading)


def stability_by_unit(book) -> pd.DataFrame:
    """Per stability run (setting, γ, seed): the median over its tracked clients' refreshes of the
    cosine between s_i just before and just after (`coordinates.coordinate_stability`)."""
    configs = groups.stability_grid(book.dataset, book.profile, seeds=book.seeds, device=book.device)
    shown, _ = book.available(list(configs.values()), "coordinate_stability", desc="stability runs")
    keys, rows = {c.key() for c in shown}, []
    for (setting, gamma, seed), c in configs.items():
        if c.key() not in keys:
            continue
        cos = coordinate_stability(load_run(c, book.root), c.method.get("refresh_every"))["cosine"].dropna()
        rows.append({"setting": setting, "gamma": gamma, "seed": seed,
                     "median_cosine": float(cos.median()) if len(cos) else np.nan})
    return pd.DataFrame(rows, columns=["setting", "gamma", "seed", "median_cosine"])


def stability_claim(book) -> list[Claim]:
    runs = stability_by_unit(book).dropna()
    units = runs.groupby(["gamma", "seed"])["median_cosine"].mean().tolist()
    gammas = ", ".join(f"{g:g}" for g in book.profile.gammas)
    return [Claim("coordinates-stable", "mechanism", "A client's coordinates s_i change little between refreshes",
                  "§8.5, Fig. 8", f"{paper.DATASET_NAMES[book.dataset]}, γ ∈ {{{gammas}}}, |X| ∈ {{10, 40}}, "
                  "λ ∈ {0, 0.5}", "stable (no number)", "08_coordinate_stability", units, unit="(γ, seed) pairs",
                  statistic="mean over (γ, seed) of the median cosine of s_i across a refresh (averaged over the "
                  "four settings)", scale="bootstrap", bounds=(-1.0, 1.0), percent=False, target=STABILITY_TARGET,
                  words=("stable (above 0.9)", "not that stable (below 0.9)"),
                  ours=f"mean of the median cosines {np.mean(units):.2f}" if units else "—")]


def memory_claims(book, main: pd.DataFrame) -> list[Claim]:
    from ..simulator.models import build_model, num_parameters
    from .server_memory import memory_formula

    d = num_parameters(build_model(book.dataset, paper.NUM_CLASSES[book.dataset], 3 if book.dataset == "cifar10" else 1))
    ratio10 = memory_formula("fedvarp", 100, d) / memory_formula("fedsteer", 100, d, 10)
    out = [Claim("memory-k10", "memory", "About 10 times less server memory at |X| = 10, N = 100", "§8.2",
                 f"{paper.DATASET_NAMES[book.dataset]} CNN (d = {d:,}), |X| = 10", "about 10 ×", "04_core_set_selection",
                 exact=ratio10, exact_holds=bool(8 <= ratio10 <= 12), ours=f"{ratio10:.1f} ×", percent=False)]
    k = DATASET_DEFAULTS[book.dataset]["core_size"]
    mem = main[main["role"].isin(["fedsteer", "fedvarp"])].groupby("role")["server_memory_bytes"].median()
    if {"fedsteer", "fedvarp"} <= set(mem.index):
        r = float(mem["fedvarp"] / mem["fedsteer"])
        out.append(Claim(f"memory-k{k}", "memory", f"The saving at the |X| = {k} this data set's runs use", "§4.2, §8.2",
                         f"{paper.DATASET_NAMES[book.dataset]}, |X| = {k}", "not stated", "04_core_set_selection",
                         exact=r, exact_holds=None, ours=f"{r:.1f} ×", percent=False))
    return out
