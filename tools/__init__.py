"""The book's build and rerun tooling, beside the Makefile that calls it (not part of the
library: nothing in `fedsteer_lib` imports it). Run from the repository root, e.g.
`python -m tools.generated book/_generated`.

| module | what |
| --- | --- |
| `notebooks` | `make book`, `make test`: the chapters executed as a reader runs them (parameters cell edited); the committed notebooks kept in step with their prose (the JupyterLab reader's cells); chapter times |
| `generated`, `provenance`, `precision_report` | `make book`: the rerun page's generated tables in `book/_generated/` (runtime, verify, numerics cost, bf16 against fp32, the claims ledger) |
| `lab`, `reading_copy` | `make lab`: its index and the reading copies of the executed chapters and of the rerun, numerics and Flower pages; a book page's MyST as Markdown JupyterLab renders |
| `lab_overrides.json` | `make lab`: JupyterLab's settings that differ from its defaults (no news prompt) |
"""
