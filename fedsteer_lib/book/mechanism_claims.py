"""The claims ledger's mechanism and memory rows (`fedsteer_lib.book.ledger` assembles them):
what probes measured during training (alignment of the steered estimate, paper §2.2 and Fig. 1;
Theorem 1's variance and Theorem 2's variance term, §3), coordinate stability (§8.5, Fig. 8) and
the server's memory (§8.2)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..experiments import groups
from ..experiments.config import DATASET_DEFAULTS
from ..experiments.results import load_run
from . import paper
from .ledger import Claim
from .table_display import fmt_pct

__all__ = ["alignment_by_run", "variance_claims", "stability_claim", "memory_claims"]


def _payloads(book, configs) -> list[tuple[Any, dict]]:
    book.ensure(configs, desc="probe runs")
    return [(c, load_run(c, book.root)) for c in configs]


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


def _probe_means(payloads, field: str) -> pd.DataFrame:
    """Per run (method, γ, seed): the mean of `field` over its probe rounds (client -1 rows)."""
    rows = []
    for c, p in payloads:
        vals = [r[field] for r in p["extras"].get("probes", []) if r["client"] == -1 and r.get(field) is not None]
        rows.append({"method": c.method.label, "name": c.method.name, "refresh": c.method.get("refresh_every"),
                     "gamma": c.system.gamma, "seed": c.seed, "value": float(np.mean(vals)) if vals else np.nan})
    return pd.DataFrame(rows)


def variance_claims(book, only: Sequence[str] | None = None) -> list[Claim]:
    """The mechanism claims measured by probes during training. `only` (claim ids, for `quote`):
    compute just those and the runs they need (variance-thm1 needs FedSteer's and FedVARP's)."""
    want = set(only) if only is not None else {"alignment", "variance-thm1", "variance-term-thm2"}
    name = paper.DATASET_NAMES[book.dataset]
    out = []
    if "alignment" in want:
        align = alignment_by_run(_payloads(book, groups.alignment_grid(book.dataset, book.profile, seeds=book.seeds,
                                                                        device=book.device)))
        out.append(Claim("alignment", "mechanism", "The steered estimate Q_t s_i points closer to the true update than "
                         "the stale h_i", "§2.2, Fig. 1", f"{name}, probe rounds during training", "closer (no number)",
                         "02_corrective_projection", align, unit="runs",
                         ours=f"{np.mean(align):+.3f} in cosine" if align else "—"))
    if not want & {"variance-thm1", "variance-term-thm2"}:
        return out
    configs = groups.convergence_grid(book.dataset, book.profile, seeds=book.seeds, device=book.device)
    if "variance-term-thm2" not in want:
        configs = [c for c in configs if c.method.name == "fedvarp"
                   or (c.method.name == "fedsteer" and c.method.get("refresh_every") == 1)]
    probes = _payloads(book, configs)
    var = _probe_means(probes, "exact_variance")
    term = _probe_means(probes, "mse_to_mean")
    steer = lambda t: t[(t["name"] == "fedsteer") & (t["refresh"] == 1)]  # noqa: E731
    ratios, term_ratios = [], []
    for (gamma, seed), s in steer(var).groupby(["gamma", "seed"]):
        at = var[(var["gamma"] == gamma) & (var["seed"] == seed) & (var["name"] == "fedvarp")]
        if len(at) and s["value"].iloc[0] == s["value"].iloc[0]:
            ratios.append(float(s["value"].iloc[0] / at["value"].iloc[0] - 1))
    for (gamma, seed), s in steer(term).groupby(["gamma", "seed"]):
        others = term[(term["gamma"] == gamma) & (term["seed"] == seed) & ~term.index.isin(s.index)]["value"].dropna()
        if len(others):
            term_ratios.append(float(s["value"].iloc[0] / others.min() - 1))
    out.append(Claim("variance-thm1", "mechanism", "FedSteer's aggregation has a lower variance than FedVARP's",
                     "§2.3, Theorem 1", f"{name}, probe rounds during training", "minimised (no number)",
                     "03_variance_minimization", ratios, unit="runs", direction=-1,
                     ours=f"{fmt_pct(np.mean(ratios))} (FedSteer over FedVARP)" if ratios else "—"))
    out.append(Claim("variance-term-thm2", "mechanism", "FedSteer has the smallest partial-update variance term",
                     "§3, Theorem 2", f"{name}, probe rounds during training", "smallest (no number)", "05_convergence",
                     term_ratios, unit="runs", direction=-1,
                     ours=f"{fmt_pct(np.mean(term_ratios))} (FedSteer over the smallest other)" if term_ratios else "—"))
    return out


def stability_claim(book) -> list[Claim]:
    from .coordinates import coordinate_stability

    configs = groups.stability_grid(book.dataset, book.profile, seeds=book.seeds, device=book.device)
    medians = []
    for _, (c, p) in zip(configs, _payloads(book, list(configs.values()))):
        cos = coordinate_stability(p, c.method.get("refresh_every"))["cosine"].dropna()
        if len(cos):
            medians.append(float(cos.median()))
    return [Claim("coordinates-stable", "mechanism", "A client's coordinates s_i change little between refreshes",
                  "§8.5, Fig. 8", f"{paper.DATASET_NAMES[book.dataset]}, γ = {max(book.profile.gammas):g}, "
                  "|X| ∈ {10, 40}, λ ∈ {0, 0.5}", "stable (no number)", "08_coordinate_stability", medians,
                  unit="settings of one seed", target=0.9,
                  ours=f"median cosine at a refresh {np.median(medians):.2f}" if medians else "—")]


def memory_claims(book, main: pd.DataFrame) -> list[Claim]:
    from ..simulator.models import build_model, num_parameters
    from .server_memory import memory_formula

    d = num_parameters(build_model(book.dataset, paper.NUM_CLASSES[book.dataset], 3 if book.dataset == "cifar10" else 1))
    ratio10 = memory_formula("fedvarp", 100, d) / memory_formula("fedsteer", 100, d, 10)
    out = [Claim("memory-k10", "memory", "About 10 times less server memory at |X| = 10, N = 100", "§8.2",
                 f"{paper.DATASET_NAMES[book.dataset]} CNN (d = {d:,}), |X| = 10", "about 10 ×", "04_core_set_selection",
                 exact=ratio10, exact_holds=bool(8 <= ratio10 <= 12), ours=f"{ratio10:.1f} ×")]
    k = DATASET_DEFAULTS[book.dataset]["core_size"]
    mem = main[main["role"].isin(["fedsteer", "fedvarp"])].groupby("role")["server_memory_bytes"].median()
    if {"fedsteer", "fedvarp"} <= set(mem.index):
        r = float(mem["fedvarp"] / mem["fedsteer"])
        out.append(Claim(f"memory-k{k}", "memory", f"The saving at the |X| = {k} this data set's runs use", "§4.2, §8.2",
                         f"{paper.DATASET_NAMES[book.dataset]}, |X| = {k}", "not stated", "04_core_set_selection",
                         exact=r, exact_holds=None, ours=f"{r:.1f} ×"))
    return out
