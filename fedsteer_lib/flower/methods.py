"""Every method of the book as a Flower strategy (flwr 1.42, Message API), used like Flower's `FedAvg`.

    strategy = FedSteer(fraction_train=0.2, core_size=10)     # instead of FedAvg(fraction_train=0.2)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=50)

Each class is `driver.MethodStrategy` with its method's registry name and parameters (defaults
from the one registry, `experiments.registry.METHODS`); the Flower names differ where Flower has
its own (`warmup_rounds` for the registry's `warmup_cycles`, FedProx's `proximal_mu` for `mu`).
"""
from __future__ import annotations

from typing import Any

from ..experiments.registry import METHODS
from .driver import MethodStrategy

__all__ = ["FedSteer", "FedAvg", "FedAvgUnbiased", "FedVARP", "FedStale", "MIFA", "Scaffold", "FedProx", "STRATEGIES"]


def _default(method: str, key: str) -> Any:
    """A method parameter's default, from the one registry."""
    return METHODS[method].params[key].default


class FedAvg(MethodStrategy):
    """FedAvg as the book's tables report it: Delta_t = sum_{A_t} d_i g_i / sum_{A_t} d_i, the
    d-weighted mean of the replies' updates; with server_lr = 1 the new model is the
    `num-examples`-weighted mean of the replies' models, which is Flower's FedAvg."""

    method = "fedavg"


class FedAvgUnbiased(MethodStrategy):
    """Unbiased FedAvg: Delta_t = sum_{i in A_t} (d_i / p_i) g_i (importance weighting)."""

    method = "fedavg_unbiased"


class FedSteer(MethodStrategy):
    """FedSteer (paper Algorithm 2): Delta_t = sum_i d_i Q_t s_i + sum_{i in A_t} (d_i / p_i)
    (g_i - Q_t s_i) (Eq. 4), with Q_t the normalised cached updates of the core set X (Eq. 1)
    and s_i each node's ridge coordinates (Eq. 3, lam = lambda), refreshed when it replies; X is
    chosen by greedy swaps (at most `max_swaps` per cycle, among `subsample` random candidates
    if given) in the warm-up's `warmup_rounds` rounds (paper §2.4). `refresh_every`, `ordering`,
    `selection` and `enforce_every` are the simulator's variants (`experiments.registry`). The
    state is O(N k + k d) floats. `core_size` nodes must be connected before the first round."""

    method = "fedsteer"

    def __init__(self, *, core_size: int = _default("fedsteer", "core_size"), lam: float = _default("fedsteer", "lam"),
                 warmup_rounds: int = _default("fedsteer", "warmup_cycles"),
                 max_swaps: int = _default("fedsteer", "max_swaps"), subsample: int | None = None,
                 refresh_every: int = _default("fedsteer", "refresh_every"),
                 ordering: str = _default("fedsteer", "ordering"), selection: str = _default("fedsteer", "selection"),
                 enforce_every: int = _default("fedsteer", "enforce_every"), **kwargs: Any) -> None:
        super().__init__(**kwargs, params={
            "core_size": core_size, "lam": lam, "warmup_cycles": warmup_rounds, "max_swaps": max_swaps,
            "subsample": subsample or 0, "refresh_every": refresh_every, "ordering": ordering,
            "selection": selection, "enforce_every": enforce_every})

    def _min_nodes_to_start(self) -> int:
        return int(self.spec.get("core_size"))


class FedVARP(MethodStrategy):
    """FedVARP: Delta_t = sum_i d_i h_i + sum_{i in A_t} (d_i / p_i) (g_i - h_i), h_i each node's
    last update (O(N d) server memory). `warmup_rounds` > 0: h starts from the warm-up's last
    snapshot (the fair start)."""

    method = "fedvarp"

    def __init__(self, *, warmup_rounds: int = _default("fedvarp", "warmup_cycles"), **kwargs: Any) -> None:
        super().__init__(**kwargs, params={"warmup_cycles": warmup_rounds})


class FedStale(MethodStrategy):
    """FedStale: Delta_t = sum_{A_t} (d_i / p_i) g_i + beta (sum_i d_i h_i - sum_{A_t} (d_i / p_i) h_i);
    beta = 1 is FedVARP, beta = 0 unbiased FedAvg."""

    method = "fedstale"

    def __init__(self, *, beta: float = _default("fedstale", "beta"), **kwargs: Any) -> None:
        super().__init__(**kwargs, params={"beta": beta})


class MIFA(MethodStrategy):
    """MIFA: Delta_t = sum_i d_i h_i after h_i <- g_i for the nodes that replied. start="zero":
    the table starts at zero; "wait_all": no step until every node has replied once, then every
    node's update at that model fills the table (a second exchange in that round)."""

    method = "mifa"

    def __init__(self, *, start: str = _default("mifa", "start"),
                 warmup_rounds: int = _default("mifa", "warmup_cycles"), **kwargs: Any) -> None:
        super().__init__(**kwargs, params={"start": start, "warmup_cycles": warmup_rounds})


class Scaffold(MethodStrategy):
    """SCAFFOLD (option II) with partial participation. Each TRAIN message carries, beside the
    model, the ArrayRecord `scaffold-correction` = c - c_i (the model's floating-point arrays, same
    keys): a client that uses it adds it to every gradient step. Replies must report `num-steps`
    (K) and `lr` (eta_l) in their metrics, for c_i+ = c_i - c + g_i / (K eta_l); a reply without
    them counts as failed. Aggregation: the d-weighted mean of the updates (`weighting`)."""

    method = "scaffold"
    needs_steps = True

    def __init__(self, *, weighting: str = _default("scaffold", "weighting"), **kwargs: Any) -> None:
        super().__init__(**kwargs, params={"weighting": weighting})


class FedProx(MethodStrategy):
    """FedProx: FedAvg's aggregation (`weighting`); the config carries `proximal-mu` (Flower's
    FedProx key) for the local objective + (mu / 2) ||w - w_t||^2."""

    method = "fedprox"

    def __init__(self, *, proximal_mu: float = _default("fedprox", "mu"),
                 weighting: str = _default("fedprox", "weighting"), **kwargs: Any) -> None:
        super().__init__(**kwargs, params={"mu": proximal_mu, "weighting": weighting})


STRATEGIES: dict[str, type[MethodStrategy]] = {cls.method: cls for cls in (
    FedSteer, FedAvg, FedAvgUnbiased, FedVARP, FedStale, MIFA, Scaffold, FedProx)}
