"""The claims ledger: every claim of the paper that the book can test, checked once, in one family.

Every page that states a verdict quotes a row of this one table; `make book` writes it to
`book/_generated/claims.csv`. The rules, fixed before looking at any result (`claims` has the
verdict words and the family):

- **Two readings of Algorithm 2**, both in the headline. The *default* reading (coordinates
  refreshed whenever a client is active, the unbiased ordering of Eq. 4, which the proof of
  Theorem 1 needs) was fixed in commit `PREREGISTERED_COMMIT`, before any result existed. The
  *literal* reading follows the text of §2.2 (Q_t already refreshed by this round's core
  clients, fresh s_i). Every accuracy claim is tested for each.
- **Gain** over a method B, per seed s: (FedSteer_s - B_s) / mean over seeds of B (paired by
  seed, relative to B's mean, as the paper's relative gains are). **The best baseline** at a γ
  is the Table 1 baseline (`registry.BASELINE_ROLES`; FedStale at its best β) with the highest
  mean final test accuracy.
- **Two tests per accuracy claim**: its direction (FedSteer ahead or behind, target 0), and the
  paper's own number (is it outside our interval?).
- **One family**: the paper's claims (accuracy for both readings, mechanism, ablations), Holm's
  method; the book's own checks are exploratory, shown with intervals and no verdict.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from ..experiments import groups
from ..experiments.results import runs_table
from ..experiments.registry import BASELINE_ROLES, display_name
from . import paper
from .claims import KINDS, Claim, assemble
from .stats import MIN_UNITS
from .mechanism_claims import MECHANISM_IDS, memory_claims, stability_claim, variance_claims
from .methods import role, roles
from .table_display import MISSING, fmt_interval, fmt_p, fmt_num, fmt_pct, readable_table

__all__ = ["PREREGISTERED_COMMIT", "READINGS", "build", "quote", "row", "display", "best_baseline", "gains_by_seed",
           "at_best_beta", "reading_runs", "accuracy_claims", "write"]

PREREGISTERED_COMMIT = "d4cb27a"  # fixed the default reading (`ordering="unbiased"`) before any result existed
# The two readings of Algorithm 2: the Table 1 role of each, and how the book names it.
READINGS: dict[str, str] = {"default": "fedsteer", "literal": "fedsteer_as_written"}
READING_NAMES: dict[str, str] = {"default": "default reading (pre-registered)", "literal": "literal reading (§2.2)"}
_PAPER_MARGIN = 0.079  # §1: "at least 7.9 % over the next-best method"


# --------------------------------------------------------------------------------- accuracy claims
def _role_table(book, configs, group: str) -> pd.DataFrame:
    """The runs of `group` that `book` can show (`Book.available`: a group still being computed
    shows its cached runs), one row each with its `role`."""
    shown, _ = book.available(configs, group, desc=group)
    runs = runs_table(shown, book.root)
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


def reading_runs(book) -> pd.DataFrame:
    """Table 1's runs (FedStale at its best β) and the literal reading's (the ordering ablation),
    one row per run with its `role`: every run the accuracy claims compare."""
    main = _role_table(book, groups.paper_grid(book.dataset, book.profile, book.device), "main")
    literal = _role_table(book, groups.ablation_grid(book.dataset, book.profile, book.device)["ordering"], "ordering")
    return at_best_beta(pd.concat([main, literal], ignore_index=True))


def accuracy_claims(book, runs: pd.DataFrame) -> list[Claim]:
    """Per reading and γ (the extreme setting first): FedSteer against the best baseline, against
    FedAvg (γ = 0.9, the paper's next-best there), below full participation (§8.4) and the
    "at least 7.9 %" margin (§1); each gain tested for its direction and against the paper's number."""
    name = paper.DATASET_NAMES[book.dataset]
    quoted = {p.key: p for p in paper.PAPER} if book.dataset == "fmnist" else {}
    out = []
    for reading, steer in READINGS.items():
        for gamma, at in sorted(runs.groupby("gamma"), key=lambda kv: -kv[0]):
            g = f"{gamma:g}"
            per_seed = at.pivot_table(index="seed", columns="role", values="final_accuracy", aggfunc="first")
            if steer not in per_seed or not set(BASELINE_ROLES) & set(per_seed):
                continue
            setting = f"{name}, γ = {g}, {READING_NAMES[reading]}"

            def gain(key: str, claim: str, source: str, b: str, paper_number: paper.PaperNumber | None,
                     paper_text: str | None = None, target: float = 0.0, direction: int = 1) -> None:
                values = gains_by_seed(per_seed, steer, b)
                ours = (f"{fmt_pct(values.mean())}: {display_name(steer)} {per_seed[steer].mean():.3f} vs "
                        f"{display_name(b)} {per_seed[b].mean():.3f}")
                words = ((f"gain above {fmt_pct(target)}", f"gain below {fmt_pct(target)}") if target else
                         ("FedSteer ahead", "FedSteer behind")) if direction > 0 else ("FedSteer above", "FedSteer below")
                text = paper_text or (fmt_pct(paper_number.value) if paper_number else "not stated")
                common = dict(kind="accuracy", source=source, setting=setting, evidence="06_main_results",
                              values=values.tolist(), statistic="mean over seeds of the paired gain",
                              bounds=(-1.0, np.inf), reading=reading, ours=ours)
                out.append(Claim(f"{key}-{reading}-{g}", claim=claim, paper=text, target=target, direction=direction,
                                 words=words, **common))
                if paper_number is not None:
                    p = fmt_pct(paper_number.value)
                    out.append(Claim(f"paper-{key}-{reading}-{g}", claim=f"{claim}: by the paper's {p}", paper=p,
                                     target=paper_number.value, direction=0,
                                     words=(f"the paper's {p} lies below our interval",
                                            f"the paper's {p} lies above our interval",
                                            f"the paper's {p} cannot be ruled out"), **common))

            best = best_baseline(per_seed)
            gain("gain-best", "FedSteer ends above the best baseline", "§4.2", best,
                 quoted.get(f"{book.dataset}/{g}/gain_vs_best"))
            if np.isclose(gamma, 0.9):
                gain("gain-fedavg", "FedSteer ends above FedAvg", "§4.2", "fedavg",
                     quoted.get(f"{book.dataset}/0.9/gain_vs_fedavg"))
                if "full" in per_seed:
                    gain("below-full", "FedSteer is second only to full participation", "§8.4", "full", None,
                         "below full participation, above every baseline", direction=-1)
            gain("margin", "FedSteer's gain over the next-best method is at least 7.9 %", "§1", best, None,
                 f"at least {fmt_pct(_PAPER_MARGIN)}", target=_PAPER_MARGIN)
    return out


# ------------------------------------------------------------------------------ the paper's ablations
def _ablation_runs(book) -> dict[str, pd.DataFrame]:
    ab = groups.ablation_grid(book.dataset, book.profile, book.device)
    return {name: _role_table(book, configs, name) for name, configs in ab.items()}


def _paired(a: pd.DataFrame, b: pd.DataFrame, gamma: float) -> pd.Series:
    """(a_s - b_s) / mean(b) per seed at γ, from two runs tables of one method each."""
    sel = lambda t: t[np.isclose(t["gamma"], gamma)].set_index("seed")["final_accuracy"]  # noqa: E731
    both = pd.concat([sel(a).rename("a"), sel(b).rename("b")], axis=1).dropna()
    return (both["a"] - both["b"]) / both["b"].mean()


_GAIN = dict(statistic="mean over seeds of the paired gain", bounds=(-1.0, np.inf))


def ablation_claims(book, main: pd.DataFrame, ablations: dict[str, pd.DataFrame]) -> list[Claim]:
    """The paper's ablation claims (§2.4, §8.3) and the book's own checks (exploratory), per γ."""
    name = paper.DATASET_NAMES[book.dataset]
    steer = main[main["role"] == "fedsteer"]
    out = []
    for gamma in sorted(main["gamma"].unique()):
        g, setting = f"{gamma:g}", f"{name}, γ = {gamma:g}"
        rnd = _paired(steer, ablations["random_core"], gamma)
        out.append(Claim(f"greedy-core-{g}", "ablation", "The greedy core set beats a random one", "§2.4", setting,
                         "a representative core set (no number)", "07_ablations", rnd.tolist(),
                         words=("greedy ahead", "random ahead"), ours=f"{fmt_pct(rnd.mean())} (greedy over random)",
                         **_GAIN))
        sub = ablations["subsampled"]
        drop = _paired(sub, steer, gamma)
        out.append(Claim(f"subsample-drop-{g}", "ablation", "Subsampled selection costs only about 2.5 %",
                         "§8.3, Table 3", setting, "about −2.5 %", "07_ablations", drop.tolist(), target=-0.025,
                         direction=1, words=("a smaller drop", "a larger drop"),
                         ours=f"{fmt_pct(drop.mean())} (subsampled over full search)", **_GAIN))
        at = at_best_beta(pd.concat([main[np.isclose(main["gamma"], gamma)], sub[np.isclose(sub["gamma"], gamma)]
                                     .assign(role="fedsteer_subsampled")]))
        per_seed = at.pivot_table(index="seed", columns="role", values="final_accuracy", aggfunc="first")
        best = best_baseline(per_seed)
        over = gains_by_seed(per_seed, "fedsteer_subsampled", best)
        out.append(Claim(f"subsample-beats-baselines-{g}", "ablation", "Subsampled FedSteer still beats every baseline",
                         "§8.3, Table 3", setting, "above all baselines", "07_ablations", over.tolist(),
                         words=("subsampled FedSteer ahead", "subsampled FedSteer behind"),
                         ours=f"{fmt_pct(over.mean())} over {display_name(best)}", **_GAIN))
        # our own checks: exploratory, no direction claimed
        for key, other, words in (("enforce5", main[main["role"] == "fedsteer_enforce5"], "FedSteer (enforce=5)"),
                                  ("as-written", ablations["ordering"], "FedSteer (as written)")):
            d = _paired(other, steer, gamma)
            out.append(Claim(f"{key}-vs-default-{g}", "our check", f"{words} against the default FedSteer", "§4.2, Alg. 2",
                             setting, "not compared by the paper", "07_ablations", d.tolist(), direction=0,
                             ours=fmt_pct(d.mean()), **_GAIN))
        fair = ablations["fair_start"]
        for m in ("fedvarp", "mifa"):
            d = _paired(fair[fair["method"] == m], main[main["role"] == m], gamma)
            out.append(Claim(f"fair-start-{m}-{g}", "our check", f"{display_name(m)} started from the warm-up's updates",
                             "§4.1, footnote 3", setting, "not run by the paper", "07_ablations", d.tolist(),
                             direction=0, ours=fmt_pct(d.mean()), **_GAIN))
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
                         unit="(γ, seed) pairs", direction=sign, words=("λ = 0.5 better", "λ = 0 better"),
                         statistic="mean over (γ, seed) of the paired gain of λ = 0.5 over λ = 0",
                         bounds=(-1.0, np.inf),
                         ours=f"{fmt_pct(float(np.mean(values)) if values else np.nan)} (λ = 0.5 over λ = 0)"))
    return out


def not_run_rows(book) -> list[Claim]:
    """The paper's numbers for the data sets this build did not run: stated, not checked."""
    out = []
    for p in paper.PAPER:
        if p.dataset and p.dataset != book.dataset:
            out.append(Claim(f"{p.dataset}-{p.gamma:g}-{p.role}", "not run here",
                             f"{display_name(p.role)} reaches {p.text}", p.section,
                             f"{paper.DATASET_NAMES[p.dataset]}, γ = {p.gamma:g}", p.text, "09_reproduction_report",
                             ours="not run here", percent=False))
    return out


def build(book) -> pd.DataFrame:
    """The whole ledger of `book`'s data set and profile (computing any missing run first, as a
    chapter does): one row per claim (`claims.COLUMNS`), in the book's order, one Holm family."""
    runs = reading_runs(book)
    main = runs[runs["role"] != READINGS["literal"]]
    ablations = _ablation_runs(book)
    claims = (accuracy_claims(book, runs) + variance_claims(book) + stability_claim(book) + memory_claims(book, main)
              + ablation_claims(book, main, ablations) + fig5_claims(book, ablations["coreset_lambda"])
              + not_run_rows(book))
    order = {k: i for i, k in enumerate(KINDS)}
    return assemble(sorted(claims, key=lambda c: order[c.kind]))  # stable: each kind keeps its own order


def _number(r: pd.Series, value: float) -> str:
    return fmt_pct(value) if r["percent"] else fmt_num(value)


def display(rows: pd.DataFrame, links: bool = True) -> "pd.io.formats.style.Styler":
    """Ledger rows for reading: the claim, where the paper makes it, the setting, the paper's
    number, ours with its statistic, its 95 % interval and its family-level interval over n units,
    the Holm-adjusted p of the book's one family, the verdict and (with `links`) the chapter that
    shows the evidence."""
    def ours(r: pd.Series) -> str:
        if r["kind"] == "not run here":
            return MISSING
        if r["unit"] == "":
            return r["ours"]
        text = f"{_number(r, r['estimate'])} ({r['statistic']}); 95 % interval " + fmt_interval(
            r["ci_low"], r["ci_high"], pct=r["percent"])
        if r["family_low"] == r["family_low"]:
            text += "; family-level interval " + fmt_interval(r["family_low"], r["family_high"], pct=r["percent"])
        return text + f"; n = {r['n']} {r['unit']}"

    shown = pd.DataFrame({
        "claim": rows["claim"], "paper (§)": [f"{p} ({s})" for p, s in zip(rows["paper"], rows["source"])],
        "setting": rows["setting"], "ours": [ours(r) for _, r in rows.iterrows()],
        "p (Holm)": [fmt_p(p, prefix=False) for p in rows["p_holm"]], "verdict": rows["verdict"]})
    if links:
        shown["evidence"] = [f'<a href="{e}.html">{CHAPTER_NAMES.get(e, e)}</a>' for e in rows["evidence"]]
    return readable_table(shown)


CHAPTER_NAMES = {"01_problem_formulation": "ch. 1", "02_corrective_projection": "ch. 2",
                 "03_variance_minimization": "ch. 3", "04_core_set_selection": "ch. 4", "05_convergence": "ch. 5",
                 "06_main_results": "ch. 6", "07_ablations": "ch. 7", "08_coordinate_stability": "ch. 8",
                 "09_reproduction_report": "ch. 9", "A_baseline_conventions": "appendix A"}


_ACCURACY = ("gain-best-", "paper-gain-", "gain-fedavg-", "below-full-", "margin-")
_ABLATION = ("greedy-core-", "subsample-", "fig5-", "enforce5-", "as-written-", "fair-start-")


def quote(book, ids: Sequence[str]) -> pd.DataFrame:
    """The rows `ids` exactly as `build(book)` has them, for a chapter that quotes its claims.

    A row's Holm-adjusted p depends on every tested row of the family, so the whole ledger is
    built when the family can be tested (at least MIN_UNITS seeds). Otherwise (the quick
    profile's one seed) no row is tested and only the kinds of claims asked for are computed,
    from the runs they need: a chapter computes no other chapter's runs."""
    ids = list(ids)
    if len(book.seeds) >= MIN_UNITS:
        return build(book).set_index("id").loc[ids].reset_index()
    claims: list[Claim] = []
    if any(i.startswith(_ACCURACY) for i in ids):
        claims += accuracy_claims(book, reading_runs(book))
    if any(i in MECHANISM_IDS for i in ids):
        claims += variance_claims(book, only=[i for i in ids if i in MECHANISM_IDS])
    if "coordinates-stable" in ids:
        claims += stability_claim(book)
    if any(i.startswith("memory-") for i in ids):
        mains = [c for c in groups.paper_grid(book.dataset, book.profile, book.device)
                 if role(c.method, c.dataset) in ("fedsteer", "fedvarp")]  # all the memory rows read
        claims += memory_claims(book, at_best_beta(_role_table(book, mains, "main")))
    if any(i.startswith(_ABLATION) for i in ids):
        main = at_best_beta(_role_table(book, groups.paper_grid(book.dataset, book.profile, book.device), "main"))
        ablations = _ablation_runs(book)
        claims += ablation_claims(book, main, ablations) + fig5_claims(book, ablations["coreset_lambda"])
    if any(i.startswith(("emnist-", "cifar10-", "fmnist-")) for i in ids):
        claims += not_run_rows(book)
    missing = set(ids) - {c.id for c in claims}
    if missing:
        raise KeyError(f"no claims {sorted(missing)} in the ledger of {book.dataset}")
    return assemble([c for c in claims if c.id in ids]).set_index("id").loc[ids].reset_index()


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
