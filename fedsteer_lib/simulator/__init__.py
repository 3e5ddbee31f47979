"""The FL simulator: the baselines, the engine (a loop over one round) and its recorder,
local training, the federation (partition and participation), the models and the data sets.
It drives any `fedsteer_lib.strategy.Strategy` and imports nothing from `experiments` or `book`."""
