"""The claims ledger: every claim of the paper that the book can test, checked once, in one family.

Every page that states a verdict quotes a row of this one table (the intro, chapters 2-8 for
their mechanism, chapter 6 for accuracy, chapter 10 for all of it); `make book` writes it to
`book/_generated/claims.csv`. The rules, fixed before looking at any result:

- **The FedSteer** is the paper's default reading of Algorithm 2 (coordinates refreshed whenever
  a client is active, the unbiased ordering of Eq. 4). The other readings are rows of their own
  (ablations), never the headline.
- **Gain** over a method B, per seed s: (FedSteer_s - B_s) / mean over seeds of B (paired by
  seed, relative to B's mean, as the paper's relative gains are). **The best baseline** at a γ
  is the Table 1 baseline (`registry.BASELINE_ROLES`; FedStale at its best β) with the
  highest mean final test accuracy.
- **Uncertainty**: the 95 % t-interval of the mean over the independent units (seeds, or runs
  where a run is the unit), the same everywhere in the book.
- **Tests**: a t-test of the per-unit values against the claim's target (0 for "higher", the
  paper's size for "at least x %"), two-sided; the p-values of every row with at least
  MIN_UNITS units form ONE family, adjusted by Holm's method. Rows with fewer units are
  "indicative only": their numbers are shown, no verdict is drawn. Rows computed exactly
  (server memory) need no test.
- **Verdict words**: "holds" (Holm p < 0.05, on the claim's side), "does not hold" (Holm p <
  0.05, on the other side), "cannot be decided" (Holm p >= 0.05); for our own checks, which
  claim no direction: "higher", "lower", "no clear difference".
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..experiments import groups
from ..experiments.registry import BASELINE_ROLES, display_name
from . import paper
from .methods import roles
from .stats import holm, mean_ci, one_sample_t_test
from .table_display import fmt_pct

__all__ = ["MIN_UNITS", "ALPHA", "COLUMNS", "Claim", "build", "quote", "row", "display", "best_baseline",
           "gains_by_seed", "at_best_beta", "write"]

MIN_UNITS = 5  # independent units (seeds, runs) a verdict needs; fewer: indicative only
ALPHA = 0.05
COLUMNS = ["id", "kind", "claim", "source", "setting", "paper", "ours", "estimate", "ci_low", "ci_high", "n", "unit",
           "target", "p", "p_holm", "verdict", "evidence"]
KINDS = ("accuracy", "mechanism", "memory", "ablation", "our check", "not run here")


@dataclass
class Claim:
    """One row of the ledger before the family's adjustment. `values` are the per-unit numbers
    whose mean is the estimate; `direction` is +1 (the claim says the estimate exceeds `target`),
    -1 (it says below) or 0 (our own two-sided checks); `exact` rows are computed, not tested."""

    id: str
    kind: str
    claim: str
    source: str
    setting: str
    paper: str
    evidence: str
    values: Sequence[float] = ()
    unit: str = "seeds"
    target: float = 0.0
    direction: int = 1
    ours: str = ""
    exact: float | None = None
    exact_holds: bool | None = None
    words: tuple[str, str, str] = ("higher", "lower", "no clear difference")

    def numbers(self) -> dict[str, Any]:
        if self.exact is not None:
            return {"estimate": self.exact, "ci_low": np.nan, "ci_high": np.nan, "n": np.nan, "p": np.nan}
        mean, half, n = mean_ci(self.values)
        test = one_sample_t_test(self.values, self.target) if n >= 2 else {"p": np.nan}
        return {"estimate": mean, "ci_low": mean - half, "ci_high": mean + half, "n": n, "p": test["p"]}


def _verdict(c: Claim, nums: dict[str, Any], p_holm: float) -> str:
    if c.kind == "not run here":
        return "not run here"
    if c.exact is not None:
        return "holds (computed exactly)" if c.exact_holds else (
            "does not hold (computed exactly)" if c.exact_holds is False else "computed exactly")
    if not nums["n"] or nums["n"] < MIN_UNITS or p_holm != p_holm:
        return "indicative only"
    if p_holm >= ALPHA:
        return "cannot be decided" if c.direction else c.words[2]
    above = nums["estimate"] > c.target
    if c.direction == 0:
        return c.words[0] if above else c.words[1]
    return "holds" if above == (c.direction > 0) else "does not hold"


def _assemble(claims: Sequence[Claim]) -> pd.DataFrame:
    nums = [c.numbers() for c in claims]
    tested = [n["p"] if (n["n"] == n["n"] and n["n"] >= MIN_UNITS and c.exact is None) else np.nan
              for c, n in zip(claims, nums)]
    adjusted = holm(tested)
    rows = []
    for c, n, ph in zip(claims, nums, adjusted):
        rows.append({"id": c.id, "kind": c.kind, "claim": c.claim, "source": c.source, "setting": c.setting,
                     "paper": c.paper, "ours": c.ours, **n, "unit": c.unit if c.exact is None else "",
                     "target": c.target, "p_holm": ph, "verdict": _verdict(c, n, ph), "evidence": c.evidence})
    out = pd.DataFrame(rows, columns=COLUMNS)
    out["n"] = out["n"].astype("Int64")
    return out


# --------------------------------------------------------------------------------- accuracy claims
def _role_table(book, configs) -> pd.DataFrame:
    runs = book.runs(configs, desc="runs")
    return runs.assign(role=roles(runs).values)


def at_best_beta(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with FedStale kept at its best β (highest mean final accuracy) per γ: the
    paper's protocol, which favours FedStale."""
    keep = []
    for gamma, at in runs.groupby("gamma"):
        stale = at[at["role"] == "fedstale"]
        if len(stale):
            best = stale.groupby("label")["final_accuracy"].mean().idxmax()
            at = at[(at["role"] != "fedstale") | (at["label"] == best)]
        keep.append(at)
    return pd.concat(keep) if keep else runs


def best_baseline(per_seed: pd.DataFrame) -> str:
    """The baseline role with the highest mean in `per_seed` (seeds x roles)."""
    present = [b for b in BASELINE_ROLES if b in per_seed]
    return per_seed[present].mean().idxmax()


def gains_by_seed(per_seed: pd.DataFrame, a: str, b: str) -> pd.Series:
    """The book's gain of role `a` over role `b`, per seed: (a_s - b_s) / mean(b)."""
    both = per_seed[[a, b]].dropna()
    return (both[a] - both[b]) / both[b].mean()


def accuracy_claims(book) -> list[Claim]:
    runs = at_best_beta(_role_table(book, groups.paper_grid(book.dataset, book.profile, book.device)))
    name = paper.DATASET_NAMES[book.dataset]
    out = []
    for gamma, at in sorted(runs.groupby("gamma"), key=lambda kv: -kv[0]):  # the extreme setting first
        g = f"{gamma:g}"
        per_seed = at.pivot_table(index="seed", columns="role", values="final_accuracy", aggfunc="first")
        if "fedsteer" not in per_seed:
            continue
        best = best_baseline(per_seed)
        setting = f"{name}, γ = {g} (Table 1)"

        def row(key, claim, source, b, paper_text, target=0.0, direction=1, evidence="06_main_results"):
            gains = gains_by_seed(per_seed, "fedsteer", b)
            ours = (f"{fmt_pct(gains.mean())}: FedSteer {per_seed['fedsteer'].mean():.3f} vs "
                    f"{display_name(b)} {per_seed[b].mean():.3f}")
            out.append(Claim(key, "accuracy", claim, source, setting, paper_text, evidence, gains.tolist(),
                             target=target, direction=direction, ours=ours))

        quote = {p.key: p for p in paper.PAPER}
        if np.isclose(gamma, 0.9):
            row(f"gain-fedavg-{g}", "FedSteer ends above FedAvg", "§4.2", "fedavg",
                f"{fmt_pct(quote['fmnist/0.9/gain_vs_fedavg'].value)} ({quote['fmnist/0.9/fedsteer'].text} vs {quote['fmnist/0.9/fedavg'].text})" if book.dataset == "fmnist" else "—")
            if "full" in per_seed:
                row(f"below-full-{g}", "FedSteer is second only to full participation", "§8.4", "full",
                    "below full participation, above every baseline", direction=-1)
        paper_gain = {0.9: "fmnist/0.9/gain_vs_best", 0.7: "fmnist/0.7/gain_vs_best"}.get(round(float(gamma), 1))
        row(f"gain-best-{g}", "FedSteer ends above the best baseline", "§4.2", best,
            fmt_pct(quote[paper_gain].value) + (" (next-best: FedAvg)" if np.isclose(gamma, 0.9) else "")
            if paper_gain and book.dataset == "fmnist" else "—")
        row(f"margin-{g}", "FedSteer's gain over the next-best method is at least 7.9 %", "§1", best, "at least +7.9 %",
            target=0.079)
    return out


# ------------------------------------------------------------------------------ the paper's ablations
def _ablation_runs(book) -> dict[str, pd.DataFrame]:
    ab = groups.ablation_grid(book.dataset, book.profile, book.device)
    return {name: _role_table(book, configs) for name, configs in ab.items()}


def _paired(a: pd.DataFrame, b: pd.DataFrame, gamma: float) -> pd.Series:
    """(a_s - b_s) / mean(b) per seed at γ, from two runs tables of one method each."""
    sel = lambda t: t[np.isclose(t["gamma"], gamma)].set_index("seed")["final_accuracy"]  # noqa: E731
    both = pd.concat([sel(a).rename("a"), sel(b).rename("b")], axis=1).dropna()
    return (both["a"] - both["b"]) / both["b"].mean()


def ablation_claims(book, main: pd.DataFrame, ablations: dict[str, pd.DataFrame]) -> list[Claim]:
    name = paper.DATASET_NAMES[book.dataset]
    steer = main[main["role"] == "fedsteer"]
    out = []
    for gamma in sorted(main["gamma"].unique()):
        g, setting = f"{gamma:g}", f"{name}, γ = {gamma:g}"
        rnd = _paired(steer, ablations["random_core"], gamma)
        out.append(Claim(f"greedy-core-{g}", "ablation", "The greedy core set beats a random one", "§2.4", setting,
                         "a representative core set (no number)", "07_ablations", rnd.tolist(),
                         ours=f"{fmt_pct(rnd.mean())} (greedy over random)"))
        sub = ablations["subsampled"]
        drop = _paired(sub, steer, gamma)
        out.append(Claim(f"subsample-drop-{g}", "ablation", "Subsampled selection costs only about 2.5 %", "§8.3, Table 3",
                         setting, "about −2.5 %", "07_ablations", drop.tolist(), target=-0.025, direction=1,
                         ours=f"{fmt_pct(drop.mean())} (subsampled over full search)"))
        at = at_best_beta(pd.concat([main[np.isclose(main["gamma"], gamma)], sub[np.isclose(sub["gamma"], gamma)]
                                     .assign(role="fedsteer_subsampled")]))
        per_seed = at.pivot_table(index="seed", columns="role", values="final_accuracy", aggfunc="first")
        best = best_baseline(per_seed)
        over = gains_by_seed(per_seed, "fedsteer_subsampled", best)
        out.append(Claim(f"subsample-beats-baselines-{g}", "ablation", "Subsampled FedSteer still beats every baseline",
                         "§8.3, Table 3", setting, "above all baselines", "07_ablations", over.tolist(),
                         ours=f"{fmt_pct(over.mean())} over {display_name(best)}"))
        # our own checks: two-sided, no direction claimed
        for key, other, words in (("enforce5", main[main["role"] == "fedsteer_enforce5"], "FedSteer (enforce=5)"),
                                  ("as-written", ablations["ordering"], "FedSteer (as written)")):
            d = _paired(other, steer, gamma)
            out.append(Claim(f"{key}-vs-default-{g}", "our check", f"{words} against the default FedSteer", "§4.2, Alg. 2",
                             setting, "not compared by the paper", "07_ablations", d.tolist(), direction=0,
                             ours=f"{fmt_pct(d.mean())}"))
        fair = ablations["fair_start"]
        for m in ("fedvarp", "mifa"):
            base = main[main["role"] == m]
            d = _paired(fair[fair["method"] == m], base, gamma)
            out.append(Claim(f"fair-start-{m}-{g}", "our check", f"{display_name(m)} started from the warm-up's updates",
                             "§4.1, footnote 3", setting, "not run by the paper", "07_ablations", d.tolist(),
                             direction=0, ours=fmt_pct(d.mean())))
    return out


def fig5_claims(book, coreset: pd.DataFrame) -> list[Claim]:
    """Fig. 5's reading (EMNIST in the paper, this data set here): λ = 0.5 vs λ = 0 per |X|, units
    (γ, seed) pairs."""
    specs = coreset.assign(core_size=[int(c) for c in coreset["core_size"]], lam=[float(v) for v in coreset["lam"]])
    out = []
    for k in sorted(specs["core_size"].unique()):
        sign = 1 if k <= 30 else -1 if 40 <= k <= 80 else 0
        if not sign:
            continue
        at = specs[specs["core_size"] == k]
        values = []
        for gamma in sorted(at["gamma"].unique()):
            values += _paired(at[at["lam"] == 0.5], at[at["lam"] == 0.0], gamma).tolist()
        out.append(Claim(f"fig5-k{k}", "ablation",
                         "Regularisation helps a small core set" if sign > 0 else "A medium core set does better without it",
                         "§4.3, Fig. 5", f"{paper.DATASET_NAMES[book.dataset]}, |X| = {k}, both γ",
                         "λ = 0.5 better" if sign > 0 else "λ = 0 better", "07_ablations", values,
                         unit="(γ, seed) pairs", direction=sign, ours=f"{fmt_pct(float(np.mean(values)) if values else np.nan)} (λ = 0.5 over λ = 0)"))
    return out


def not_run_rows(book) -> list[Claim]:
    """The paper's numbers for the data sets this build did not run: stated, not checked."""
    out = []
    for p in paper.PAPER:
        if p.dataset and p.dataset != book.dataset:
            out.append(Claim(f"{p.dataset}-{p.gamma:g}-{p.role}", "not run here",
                             f"{display_name(p.role)} reaches {p.text}", p.section,
                             f"{paper.DATASET_NAMES[p.dataset]}, γ = {p.gamma:g}", p.text, "10_reproduction_report",
                             ours="not run here"))
    return out


def build(book) -> pd.DataFrame:
    """The whole ledger of `book`'s data set and profile (computing any missing run first, as a
    chapter does): one row per claim (`COLUMNS`), in the book's order, one Holm family."""
    from .mechanism_claims import memory_claims, stability_claim, variance_claims

    main = at_best_beta(_role_table(book, groups.paper_grid(book.dataset, book.profile, book.device)))
    ablations = _ablation_runs(book)
    claims = (accuracy_claims(book) + variance_claims(book) + stability_claim(book) + memory_claims(book, main)
              + ablation_claims(book, main, ablations) + fig5_claims(book, ablations["coreset_lambda"])
              + not_run_rows(book))
    order = {k: i for i, k in enumerate(KINDS)}
    claims = sorted(claims, key=lambda c: order[c.kind])  # stable: each kind keeps its own order
    return _assemble(claims)


def display(rows: pd.DataFrame, links: bool = True) -> "pd.io.formats.style.Styler":
    """Ledger rows for reading: the claim, where the paper makes it, the setting, the paper's
    number, ours, the estimate with its 95 % interval over n units, the Holm-adjusted p of the
    book's one family, the verdict and (with `links`) the chapter that shows the evidence."""
    from .table_display import MISSING, fmt_interval, fmt_p, readable_table

    def estimate(r: pd.Series) -> str:
        if r["kind"] == "not run here":
            return MISSING
        if r["unit"] == "":
            return r["ours"]
        pct = not str(r["id"]).startswith(("alignment", "coordinates"))
        interval = fmt_interval(r["ci_low"], r["ci_high"], pct) if pct else (
            MISSING if r["ci_low"] != r["ci_low"] else f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]".replace("-", "−"))
        return f"{r['ours']}; 95 % interval {interval}, n = {r['n']} {r['unit']}"

    shown = pd.DataFrame({
        "claim": rows["claim"], "paper (§)": [f"{p} ({s})" for p, s in zip(rows["paper"], rows["source"])],
        "setting": rows["setting"], "ours": [estimate(r) for _, r in rows.iterrows()],
        "p (Holm, whole book)": [fmt_p(p) for p in rows["p_holm"]], "verdict": rows["verdict"]})
    if links:
        shown["evidence"] = [f'<a href="{e}.html">{_CHAPTER_NAMES.get(e, e)}</a>' for e in rows["evidence"]]
    return readable_table(shown)


_CHAPTER_NAMES = {"01_problem_formulation": "ch. 1", "02_corrective_projection": "ch. 2",
                  "03_variance_minimization": "ch. 3", "04_core_set_selection": "ch. 4", "05_convergence": "ch. 5",
                  "06_main_results": "ch. 6", "07_ablations": "ch. 7", "08_coordinate_stability": "ch. 8",
                  "09_baseline_conventions": "appendix A", "10_reproduction_report": "ch. 9"}


def quote(book, ids: Sequence[str]) -> pd.DataFrame:
    """The rows `ids` exactly as `build(book)` has them, for a chapter that quotes its claims.

    A row's Holm-adjusted p depends on every tested row of the family, so the whole ledger is built
    when one of the rows asked for is tested (at least MIN_UNITS units) or is not a mechanism or
    memory claim. Otherwise (e.g. one seed) no other row can change them: only their own claims
    are computed, from the runs they need, so a chapter executed alone computes no other chapter's
    runs."""
    from .mechanism_claims import memory_claims, stability_claim, variance_claims

    ids = list(ids)
    mechanism = [i for i in ids if i in ("alignment", "variance-thm1", "variance-term-thm2")]
    claims = variance_claims(book, only=mechanism) if mechanism else []
    if "coordinates-stable" in ids:
        claims += stability_claim(book)
    if any(i.startswith("memory-") for i in ids):
        from .methods import role

        mains = [c for c in groups.paper_grid(book.dataset, book.profile, book.device)
                 if role(c.method, c.dataset) in ("fedsteer", "fedvarp")]  # all the memory rows read
        claims += memory_claims(book, at_best_beta(_role_table(book, mains)))
    claims = [c for c in claims if c.id in ids]
    if {c.id for c in claims} != set(ids) or any(c.exact is None and c.numbers()["n"] >= MIN_UNITS for c in claims):
        rows = build(book)
    else:
        rows = _assemble(claims)
    return rows.set_index("id").loc[ids].reset_index()


def row(ledger: pd.DataFrame, claim_id: str) -> pd.Series:
    """One row of the ledger by its id (KeyError naming the ids there are)."""
    hit = ledger[ledger["id"] == claim_id]
    if hit.empty:
        raise KeyError(f"no claim {claim_id!r} in the ledger; there are {list(ledger['id'])}")
    return hit.iloc[0]


def write(ledger: pd.DataFrame, out_dir: str | Path) -> Path:
    """Write the ledger to `out_dir`/claims.csv (only if its content changed); returns the path."""
    path = Path(out_dir) / "claims.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = ledger.to_csv(index=False, float_format="%.6g")
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def _main(argv: Sequence[str] | None = None) -> None:
    from .context import setup

    parser = argparse.ArgumentParser(prog="python -m fedsteer_lib.book.ledger", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder for claims.csv (the Makefile: book/_generated)")
    parser.add_argument("--profile", default="paper")
    parser.add_argument("--dataset", default="fmnist")
    args = parser.parse_args(argv)
    print(f"wrote {write(build(setup(args.profile, args.dataset)), args.out_dir)}")


if __name__ == "__main__":
    _main()
