"""Command-line entry points: flashcart-train, flashcart-test, flashcart-plot, flashcart-profile."""

from __future__ import annotations

import argparse
import sys

from ..config import ConfigError, load_config


def _parse(prog: str, description: str, argv):
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("config", help="YAML configuration file")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides (e.g. max_epochs=5 device=cpu)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return parser.parse_intermixed_args(argv)


def _run(fn, argv, prog, description) -> int:
    args = _parse(prog, description, argv)
    try:
        cfg = load_config(args.config, args.overrides)
        fn(cfg, progress=not args.no_progress)
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    return 0


def train_main(argv=None) -> int:
    from ..training.trainer import train

    return _run(
        train,
        argv,
        "flashcart-train",
        "Train a FlashCart potential. strategy=ddp devices=N trains on N GPUs (or N gloo processes with device=cpu) "
        "of this node; with n_nodes=M start it on every node with torchrun (README).",
    )


def test_main(argv=None) -> int:
    from ..training.evaluate import evaluate

    return _run(evaluate, argv, "flashcart-test", "Evaluate best/ on the validation and test sets.")


def plot_main(argv=None) -> int:
    from ..training.plot import plot_learning_curves

    parser = argparse.ArgumentParser(prog="flashcart-plot", description="Learning curves from RUN_DIR/metrics.csv.")
    parser.add_argument("run_dir")
    args = parser.parse_args(argv)
    try:
        print(f"[plot] wrote {plot_learning_curves(args.run_dir)}")
    except (FileNotFoundError, ValueError) as err:
        print(f"flashcart-plot: error: {err}", file=sys.stderr)
        return 2
    return 0


def profile_main(argv=None) -> int:
    from ..profiling import profile

    return _run(profile, argv, "flashcart-profile", "Time inference and training of a freshly initialised model.")
