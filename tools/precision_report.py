"""The rerun page's "Running faster": bfloat16 against float32, its measured speed
(`data/results/bench/precision.json`, written by `bench/precision.py`) and its accuracy parity
(the `precision_parity` group, paired by seed with its committed fp32 twins). bf16 results are
never mixed into a float32 table: this report is the one place they are compared.
`tools/generated.py` writes it to `book/_generated/precision.md`."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from fedsteer_lib.book.ledger import at_best_beta, best_baseline, gains_by_seed
from fedsteer_lib.book.stats import MIN_UNITS, holm, mean_ci, one_sample_t_test, paired_t_test
from fedsteer_lib.book.table_display import fmt_p
from fedsteer_lib.experiments.config import DATASET_DEFAULTS
from fedsteer_lib.experiments.groups import PARITY_ROLES, paper_grid, precision_parity_grid
from fedsteer_lib.experiments.registry import display_name, role_of
from fedsteer_lib.experiments.results import has_run, load_run, results_root, runs_table
from tools.provenance import REPO_ROOT, cached_configs, markdown_table

__all__ = ["parity_runs", "parity_table", "parity_verdicts", "precision_markdown"]

PRECISION_FILE = REPO_ROOT / "data" / "results" / "bench" / "precision.json"


def parity_runs(dataset: str, profile: str, root: str | os.PathLike) -> pd.DataFrame:
    """The cached runs of the `precision_parity` group (bf16) and of their fp32 twins (same
    config, fp32: committed Table 1 and ablation runs), one row each: gamma, role, seed,
    precision, final accuracy, collapsed."""
    dd = {k: v for k, v in DATASET_DEFAULTS[dataset].items() if k in ("core_size", "lam")}
    rows = []
    for c in precision_parity_grid(dataset, profile):
        for run in (c, c.replace(precision="fp32")):
            if has_run(run, root):
                payload = load_run(run, root)
                s, prov = payload["summary"], payload.get("provenance", {})
                rows.append({"gamma": run.system.gamma, "role": role_of(run.method.name, dict(run.method.params), dd),
                             "seed": run.seed, "precision": run.precision, "final_accuracy": s["final_accuracy"],
                             "collapsed": bool(s["collapsed"]),
                             "machine": f"{prov.get('device', '?')}, {prov.get('cpu', 'CPU not recorded')}, "
                                        f"{prov.get('kernels', 'native')} kernels"})
    return pd.DataFrame(rows, columns=["gamma", "role", "seed", "precision", "final_accuracy", "collapsed", "machine"])


def _complete(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[int]]:
    """The runs of the seeds that have both precisions of every (gamma, role) in `runs`."""
    cells = runs.groupby(["gamma", "role"]).ngroups * 2
    per_seed = runs.groupby("seed").apply(lambda g: len(g.drop_duplicates(["gamma", "role", "precision"])),
                                          include_groups=False) if len(runs) else pd.Series(dtype=int)
    seeds = sorted(int(s) for s, n in per_seed.items() if n == cells)
    return runs[runs["seed"].isin(seeds)], seeds


def parity_table(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[int]]:
    """bf16 against fp32, paired by seed, on the complete seeds only (`parity_runs`' rows): per
    gamma and role, the seeds, both means, the mean difference bf16 - fp32 with the half-width of
    its 95 % t-interval, the paired t-test's p, that p Holm-adjusted over the table's rows (one
    family: "does bf16 change the accuracy of any of them?") and the collapsed runs of each
    precision. Returns (the table, the complete seeds)."""
    runs, seeds = _complete(runs)
    rows = []
    for (gamma, role), at in runs.groupby(["gamma", "role"], sort=False):
        wide = at.pivot_table(index="seed", columns="precision", values="final_accuracy", aggfunc="first")
        diffs = (wide["bf16"] - wide["fp32"]).tolist()
        mean, ci, n = mean_ci(diffs)
        collapsed = at.groupby("precision")["collapsed"].sum()
        rows.append({"gamma": gamma, "role": role, "seeds": n, "fp32": wide["fp32"].mean(), "bf16": wide["bf16"].mean(),
                     "difference": mean, "ci": ci, "p": paired_t_test(diffs)["p"],
                     "collapsed_fp32": int(collapsed.get("fp32", 0)), "collapsed_bf16": int(collapsed.get("bf16", 0))})
    table = pd.DataFrame(rows, columns=["gamma", "role", "seeds", "fp32", "bf16", "difference", "ci", "p",
                                        "collapsed_fp32", "collapsed_bf16"])
    table.insert(table.columns.get_loc("p") + 1, "p_holm", holm(table["p"].tolist()))
    return table.sort_values(["gamma", "role"], ascending=[False, True], kind="stable").reset_index(drop=True), seeds


def parity_verdicts(runs: pd.DataFrame) -> pd.DataFrame:
    """FedSteer's (both orderings) paired gains over FedAvg and over the best baseline of the group,
    computed once from the fp32 runs and once from the bf16 runs of the same complete seeds, with
    the word each allows (the ledger's rule: a t-test of the per-seed gains against 0, a word
    only from `stats.MIN_UNITS` seeds on, unadjusted here) and whether the two words agree."""
    runs, _ = _complete(runs)
    rows = []
    for gamma, at in runs.groupby("gamma", sort=False):
        for a in ("fedsteer", "fedsteer_as_written"):
            for b in ("fedavg", "mifa"):
                row = {"gamma": gamma, "method": a, "against": b}
                for precision in ("fp32", "bf16"):
                    wide = at[at["precision"] == precision].pivot_table(index="seed", columns="role",
                                                                        values="final_accuracy", aggfunc="first")
                    if a not in wide or b not in wide:
                        continue
                    gains = gains_by_seed(wide, a, b)
                    test = one_sample_t_test(gains.tolist())
                    word = (f"no verdict (n < {MIN_UNITS})" if test["n"] < MIN_UNITS else
                            "no clear difference" if not test["p"] < 0.05 else "higher" if test["mean"] > 0 else "lower")
                    row.update({f"gain_{precision}": test["mean"], f"p_{precision}": test["p"], f"word_{precision}": word,
                                "seeds": test["n"]})
                if "word_bf16" in row and "word_fp32" in row:
                    row["same"] = row["word_bf16"] == row["word_fp32"]
                    rows.append(row)
    return pd.DataFrame(rows)


def _best_table1_baselines(dataset: str, profile: str, root: str | os.PathLike) -> dict[float, str]:
    """The best Table 1 baseline per gamma from the cached fp32 runs (the ledger's rule)."""
    dd = {k: v for k, v in DATASET_DEFAULTS[dataset].items() if k in ("core_size", "lam")}
    configs = cached_configs(paper_grid(dataset, profile), root)
    if not configs:
        return {}
    runs = runs_table(configs, root)
    runs["role"] = [role_of(c.method.name, dict(c.method.params), dd) for c in configs]
    runs = at_best_beta(runs)
    return {g: best_baseline(at.pivot_table(index="seed", columns="role", values="final_accuracy", aggfunc="first"))
            for g, at in runs.groupby("gamma")}


def _speed_lines(bench: dict) -> list[str]:
    """The benchmark (`bench/precision.py`) as a sentence and a table."""
    load = bench["load"]
    units = ("has bfloat16 units" if bench["bf16_units"] else
             "has no bfloat16 units (no AMX, no AVX512-BF16): torch computes bfloat16 in software there")
    times = "once" if bench["repeats"] == 1 else f"{bench['repeats']} times each"
    lines = [f"Measured by `bench/precision.py` on {bench['cpu']} ({', '.join(bench['cpu_flags'])}), which {units}: "
             f"one thread, fp32 and bf16 alternating in one process, {times} (medians of the "
             f"process CPU time), {bench['date'][:10]}, with the machine shared (load average "
             f"{load['start'][0]:.1f} at the start, {load['end'][0]:.1f} at the end, on {os.cpu_count()} cores). Speed "
             "ratio: bf16's speed over fp32's (above 1: bf16 faster).", ""]
    peak = bench["peaks"]
    table = [{"what": "matrix multiply, peak (GFLOP/s)", "fp32": f"{peak['fp32']['gflops']:.1f}",
              "bf16": f"{peak['bf16']['gflops']:.1f}", "speed ratio": f"{peak['bf16']['gflops'] / peak['fp32']['gflops']:.2f}"}]
    for dataset, row in bench["training"].items():
        table.append({"what": f"client training, {dataset} model (samples/s; share of the precision's peak)",
                      **{p: f"{row[p]['samples_per_s']:.0f} ({100 * row[p]['share_of_peak']:.0f} %)" for p in ("fp32", "bf16")},
                      "speed ratio": f"{row['bf16_speedup']:.2f}"})
    ev = bench["evaluation"]
    table.append({"what": f"evaluation of {ev['images']:,} test images (s)", "fp32": f"{ev['fp32']['cpu_s']:.2f}",
                  "bf16": f"{ev['bf16']['cpu_s']:.2f}", "speed ratio": f"{ev['bf16_speedup']:.2f}"})
    for name, row in bench.get("runs", {}).items():
        table.append({"what": f"whole run, {display_name(name)}, {row['rounds']} rounds (s)",
                      "fp32": f"{row['fp32']['cpu_s']:.0f}", "bf16": f"{row['bf16']['cpu_s']:.0f}",
                      "speed ratio": f"{row['bf16_speedup']:.2f}"})
    lines += markdown_table(pd.DataFrame(table), ["what", "fp32", "bf16", "speed ratio"], {})
    for name, row in bench.get("runs", {}).items():
        phases = [k for k in ("warmup", "client", "eval", "server") if row["fp32"]["timing"].get(k)]
        lines += ["", f"{display_name(name)}'s run by phase, fp32 → bf16 (wall seconds, the machine shared): "
                  + ", ".join(f"{k} {row['fp32']['timing'][k]:.0f} → {row['bf16']['timing'][k]:.0f}" for k in phases)
                  + "."]
    over = [d for d, r in bench["training"].items() if r["bf16"]["share_of_peak"] > 1]
    if over:
        lines += ["", "bf16 training above 100 % of the bf16 matmul peak means that this CPU's bfloat16 matrix "
                  "multiply (torch's fallback) is slower than its bfloat16 convolutions: without bfloat16 units "
                  "there is no bf16 peak to reach."]
    goals, ratios = bench["goals"], [r["bf16_speedup"] for r in bench["training"].values()]
    met = all(r >= goals["client_training"] for r in ratios)
    span = f"{min(ratios):.2f}" + (f"–{max(ratios):.2f}" if f"{max(ratios):.2f}" != f"{min(ratios):.2f}" else "")
    lines += ["", f"The goal for client training, {goals['client_training']:g} × faster in bf16, is "
              + ("met on this machine." if met else
                 f"not met on this machine: bf16 trains at {span} × the speed of fp32 here"
                 + ("" if bench["bf16_units"] else ", as expected without bfloat16 units: the speed-up needs a CPU with "
                    "AMX or AVX512-BF16, or a GPU (`bench/gpu_session.sh` measures both precisions there)") + ".")]
    if bench.get("variants"):
        lines += ["", "Tried besides autocast, as speed over the chosen bf16 path: "
                  + "; ".join(f"{name} {v['vs_chosen_bf16']:.2f} ×" for name, v in bench["variants"].items()) + "."]
    return lines


def precision_markdown(dataset: str = "fmnist", profile: str = "paper", root: str | os.PathLike | None = None,
                       bench_path: str | os.PathLike = PRECISION_FILE) -> str:
    """The rerun page's "Running faster": the measured speed of bf16 against fp32 and the
    accuracy parity of the `precision_parity` group, with the number of seeds it rests on."""
    root = results_root(profile) if root is None else Path(root)
    lines = ["**Speed.**", ""]
    if Path(bench_path).is_file():
        lines += _speed_lines(json.loads(Path(bench_path).read_text()))
    else:
        lines += ["bf16 has not been measured on this machine yet (`bench/precision.py`)."]
    group = precision_parity_grid(dataset, profile)
    runs = parity_runs(dataset, profile, root)
    table, seeds = parity_table(runs)
    n_bf16 = int((runs["precision"] == "bf16").sum())
    all_seeds = sorted({c.seed for c in group})
    lines += ["", "**Accuracy parity.**", "",
              f"{n_bf16} of the {len(group)} bf16 runs of the parity group are computed "
              f"(`python -m fedsteer_lib sweep --what precision`); complete seeds (all "
              f"{len(group) // len(all_seeds)} runs of the seed, both γ): "
              f"{len(seeds)} of {len(all_seeds)}" + (f" ({', '.join(map(str, seeds))})." if seeds else ".")]
    if not seeds:
        lines += ["", "No seed is complete yet, so there is no parity figure."]
        return "\n".join(lines) + "\n"
    partial = len(seeds) < len(all_seeds)
    machines = runs[(runs["precision"] == "bf16") & runs["seed"].isin(seeds)]["machine"].value_counts()
    lines += ["", "The bf16 runs were computed on " + "; ".join(f"{m} ({n} runs)" for m, n in machines.items()) + "."]
    lines += ["", f"Final test accuracy, bf16 against the committed fp32 run of the same configuration, paired by seed, "
              f"over {len(seeds)} seed{'s' if len(seeds) > 1 else ''}"
              + (f": a reduced set, not the full parity test of {len(all_seeds)} seeds" if partial else "")
              + " (difference: bf16 − fp32, mean ± half-width of its 95 % interval; p: paired t-test; p (Holm): "
              "the same, Holm-adjusted over the table's rows):", ""]
    shown = pd.DataFrame([{
        "γ": f"{r.gamma:g}", "method": display_name(r.role), "seeds": r.seeds, "fp32": f"{r.fp32:.4f}",
        "bf16": f"{r.bf16:.4f}",
        "difference": (f"{r.difference:+.4f}" + (f" ± {r.ci:.4f}" if r.ci == r.ci else " (one seed: no interval)")
                       ).replace("-", "−"),
        "p": fmt_p(r.p) if r.p == r.p else "–",
        "p (Holm)": fmt_p(r.p_holm) if r.p_holm == r.p_holm else "–",
        "collapsed (fp32 / bf16)": f"{r.collapsed_fp32} / {r.collapsed_bf16}"} for r in table.itertuples()])
    lines += markdown_table(shown, list(shown.columns), {})
    verdicts = parity_verdicts(runs)
    if len(verdicts):
        changed = verdicts[~verdicts["same"]]
        words = verdicts[~verdicts["word_fp32"].str.startswith("no verdict")]
        if words.empty:
            lines += ["", f"Whether bf16 changes a verdict of the book cannot be said yet: a verdict needs at least "
                      f"{MIN_UNITS} seeds."]
        elif changed.empty:
            lines += ["", f"FedSteer's gains over {display_name('fedavg')} and {display_name('mifa')}, recomputed from "
                      f"the bf16 runs of these seeds, give the same words as the fp32 runs of the same seeds in all "
                      f"{len(verdicts)} comparisons: bf16 changes no verdict here."]
        else:
            lines += ["", "bf16 changes the word of " + "; ".join(
                f"{display_name(r.method)} against {display_name(r.against)} at γ = {r.gamma:g} ({r.word_fp32} in "
                f"fp32, {r.word_bf16} in bf16)" for r in changed.itertuples()) + "."]
    best = _best_table1_baselines(dataset, profile, root)
    baseline = next(r for r in PARITY_ROLES if r not in ("fedavg", "fedsteer", "fedsteer_as_written"))
    off = {g: b for g, b in best.items() if b != baseline}
    if off:
        lines += ["", f"The group's baseline, {display_name(baseline)}, is no longer the best Table 1 baseline at "
                  + ", ".join(f"γ = {g:g} ({display_name(b)} is)" for g, b in off.items()) + "."]
    return "\n".join(lines) + "\n"
