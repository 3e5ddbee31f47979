"""`python -m fedsteer_lib ...`: the command line (see `experiments.cli`).

`doctor`, `system-packages` and `check-seeds` need only the standard library (they run before
the set-up), so they are dispatched before anything that imports torch."""
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["doctor"], ["system-packages"]) and len(argv) == 1:
        from .experiments import doctor

        return doctor.report() if argv[0] == "doctor" else (1 if doctor.install_system_packages() else 0)
    if argv[:1] == ["check-seeds"]:  # `make book SEEDS=...` checks its value before it deletes anything
        from .experiments.seeds import main as check_seeds_main

        return check_seeds_main(argv[1:])
    from .experiments.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
