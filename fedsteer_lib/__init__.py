"""FedSteer and its baselines in a small federated-learning simulator, plus the book's helpers.

The package is four rooms; imports go one way only, book -> experiments -> simulator -> method:

- the paper's method (this folder): `projection` (Eq. 1-4, Theorem 1), `coreset` (J(X) and
  the greedy swap search, Algorithm 3), `strategy` (the server-strategy interface every method
  implements) and `fedsteer` (FedSteer's strategy with its typed state, Algorithm 2);
- `simulator/`: the baselines, the engine (one loop over `_round`) and its recorder, local
  training, partition and participation, models, data sets;
- `experiments/`: the one method `registry`, run `config`urations and profiles, the run
  `groups`, the `results` cache, `sweep`, `tuning`, `doctor` and the command line (`cli`);
- `book/`: what only the book needs (paper numbers, statistics, tables, prose, figures).

Importing the package changes nothing in the process: torch keeps its own kernels and threads.
The project's entry points (the command line, the notebooks' `setup`, sweep and Ray workers)
choose the kernel mode before torch computes (`numerics.select_kernels`).
"""
