"""python -m pydemo_runner --weights DIR: the py-demo model as a Resin runner.

It speaks Resin's runner protocol on stdin/stdout (the runtime starts it so), or on a Unix
socket with --listen unix:PATH (then `resin serve --runner unix:PATH` connects to it).
Everything it prints goes to stderr: stdout carries the protocol.
"""

import argparse
import sys

from resin_runner.runner import serve_spec

from .model import Model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pydemo_runner", description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", required=True, help="directory with config.json and *.safetensors (none: seeded random weights)")
    ap.add_argument("--page-tokens", type=int, default=16, help="cache block size in tokens")
    ap.add_argument("--max-context", type=int, default=0, help="longest sequence (default: min(max_position_embeddings, 4096))")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random weights used without safetensors")
    ap.add_argument("--listen", default=None, help="unix:PATH to listen on instead of stdin/stdout")
    args = ap.parse_args(argv)
    if args.page_tokens <= 0:
        print(f"--page-tokens {args.page_tokens} must be positive", file=sys.stderr)
        return 2
    try:
        model = Model(args.weights, args.page_tokens, args.max_context, args.seed)
    except (OSError, ValueError, KeyError) as e:
        print(f"pydemo_runner: {e}", file=sys.stderr)
        return 1
    return serve_spec(model, args.listen)


if __name__ == "__main__":
    sys.exit(main())
