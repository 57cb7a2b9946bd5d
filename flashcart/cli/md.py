"""``flashcart-md CONFIG [KEY=VALUE ...]``: molecular dynamics with a trained model (ASE or OpenMM)."""

from __future__ import annotations

import argparse
import sys

from ..config import ConfigError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="flashcart-md",
        description="Molecular dynamics of a structure with a trained FlashCart model; every key is in the packaged configs/md.yaml.",
    )
    parser.add_argument("config", help="YAML configuration file (keys of configs/md.yaml)")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides (e.g. steps=100 engine=openmm)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_intermixed_args(argv)
    from ..simulation.md import load_md_config, run_md

    try:
        cfg = load_md_config(args.config, args.overrides)
        run_md(cfg, progress=not args.no_progress)
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"flashcart-md: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
