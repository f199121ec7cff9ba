"""`python -m npu_conformance.synthetic <recipe> [--cache DIR]`: build an embedded default model and print its path."""

from __future__ import annotations

import argparse
from pathlib import Path

from npu_conformance.cache import DEFAULT_ROOT
from npu_conformance.synthetic import available_recipes, build_checkpoint


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m npu_conformance.synthetic",
                                     description="Build an embedded default model and print its path.")
    parser.add_argument("recipe", choices=available_recipes())
    # The suite's --cache-dir default (npu_conformance/plugin.py), so the CLI warms the same cache.
    parser.add_argument("--cache", type=Path, default=DEFAULT_ROOT, help=f"cache root (default {DEFAULT_ROOT})")
    args = parser.parse_args(argv)
    print(build_checkpoint(args.recipe, args.cache))


if __name__ == "__main__":
    main()
