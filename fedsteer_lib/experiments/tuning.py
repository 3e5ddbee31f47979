"""Choosing the training hyperparameters the paper does not give (its Table 2 is missing).

Protocol: tune *FedAvg only* (the tables' FedAvg), on a validation split of 10,000 images held
out of the training pool (never the test set), at both gammas with seed 0, over a small
grid of client learning rate x local epochs (batch size 32, server lr 1). The setting with
the best mean validation accuracy over the last 10 rounds (averaged over both gammas) is
frozen in `config.TUNED` for every method.
"""
from __future__ import annotations

import itertools

import pandas as pd

from .config import FLSystem, RunConfig, Training, method

__all__ = ["GRID", "tuning_configs", "tuning_table", "select", "select_server_steps", "calibrated_cell"]

GRID = {"client_lr": (0.01, 0.03, 0.1, 0.3), "local_epochs": (1, 2)}
VALIDATION_SIZE = 10_000


def tuning_configs(dataset: str = "fmnist", rounds: int = 150, gammas=(0.7, 0.9), seed: int = 0,
                   device: str = "cpu") -> list[RunConfig]:
    configs = []
    for lr, epochs in itertools.product(GRID["client_lr"], GRID["local_epochs"]):
        for gamma in gammas:
            configs.append(RunConfig(
                dataset=dataset, method=method("fedavg"), seed=seed, device=device,
                system=FLSystem(gamma=gamma, validation_size=VALIDATION_SIZE),
                training=Training(rounds=rounds, local_epochs=epochs, batch_size=32, client_lr=lr, server_lr=1.0)).validate())
    return configs


def tuning_table(configs: list[RunConfig], root=None) -> pd.DataFrame:
    """Validation accuracy of every grid point (one row per gamma)."""
    from .results import load_run

    rows = []
    for c in configs:
        s = load_run(c, root)["summary"]
        rows.append({"client_lr": c.training.client_lr, "local_epochs": c.training.local_epochs,
                     "gamma": c.system.gamma, "val_accuracy_last10": s["mean_last_accuracy"],
                     "val_accuracy_final": s["final_accuracy"], "collapsed": s["collapsed"]})
    return pd.DataFrame(rows)


def select(table: pd.DataFrame) -> dict:
    """The grid point with the best validation accuracy averaged over the gammas."""
    mean = table.groupby(["client_lr", "local_epochs"])["val_accuracy_last10"].mean()
    lr, epochs = mean.idxmax()
    return {"client_lr": float(lr), "local_epochs": int(epochs), "val_accuracy_last10": float(mean.max())}


def select_server_steps(runs: pd.DataFrame) -> pd.DataFrame:
    """Each method's server step eta_s (`config.SERVER_LRS`): the one with the best final-round
    validation accuracy averaged over the gammas; ties go to the larger step (1.0, the frozen
    setting, when nothing beats it). `runs` has one row per run with columns label, server_lr,
    gamma and final_accuracy (measured on the validation split)."""
    mean = runs.groupby(["label", "server_lr"])["final_accuracy"].mean().reset_index()
    mean = mean.sort_values(["label", "final_accuracy", "server_lr"], ascending=[True, False, False])
    best = mean.groupby("label", sort=False).head(1)
    return best.rename(columns={"final_accuracy": "val_accuracy_final"}).reset_index(drop=True)


def calibrated_cell(cells: pd.DataFrame, paper_accuracy: float) -> dict | None:
    """The paper-calibrated regime cell (`config.CALIBRATION_TARGET`): among `cells` (one row per
    regime cell of the calibration method: client_lr, local_epochs, mean final test accuracy over
    the map's seeds, n), the one whose mean is closest to the paper's `paper_accuracy`; ties go to
    the smaller client lr, then the fewer local epochs. None when `cells` is empty."""
    if cells.empty:
        return None
    ranked = cells.assign(distance=(cells["mean"] - paper_accuracy).abs())
    best = ranked.sort_values(["distance", "client_lr", "local_epochs"]).iloc[0]
    return {"client_lr": float(best["client_lr"]), "local_epochs": int(best["local_epochs"]),
            "mean": float(best["mean"]), "n": int(best["n"]), "paper": paper_accuracy}
