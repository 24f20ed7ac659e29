"""`memfit explain SNAPSHOT.pickle`: a CUDA memory snapshot as memfit's
report (the table, --json, --html), with the allocator replay held against
it and, with --predict, memfit's own prediction of the same step beside it.

    memfit explain snap.pickle [--json] [--html PAGE] [--device N]
                               [--predict --model NAME --batch B
                                [--optimizer adam] [--iterations 2]
                                [--cuda-workspace SIZE]]

Exit status: 0 done, 1 bad input (one line on stderr)."""

import argparse
import json
import sys

from .._native import native as _memfit
from .snapshot import NotASnapshot, load_snapshot

__all__: list = []


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Usage(message)


class _Usage(Exception):
    pass


def _parser():
    p = _Parser(prog="memfit explain", description=__doc__.split("\n\n")[0])
    p.add_argument("snapshot", help="a pickle from torch.cuda.memory._dump_snapshot")
    p.add_argument("--json", action="store_true", help="the explanation as JSON on stdout")
    p.add_argument("--html", metavar="PAGE", help="write one self-contained HTML page")
    p.add_argument("--device", type=int, help="the device whose trace to explain")
    p.add_argument("--predict", action="store_true",
                   help="memfit's prediction of the same step beside the snapshot: a built-in "
                        "model (--model, --batch) recorded on the CPU for a CUDA card")
    p.add_argument("--model", help="mlp | cnn | gpt | lstm | resnet18 (with --predict)")
    p.add_argument("--batch", type=int, help="the step's batch (with --predict)")
    p.add_argument("--optimizer", default="adam",
                   help=" | ".join(_memfit.optimizer_names()))
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--cuda-workspace", default=None,
                   help="cuBLAS workspace SIZE (default: 8MiB+128KiB; 32MiB on Hopper)")
    return p


def main(argv=None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in args_in):
        _parser().print_help()
        return 0
    try:
        args = _parser().parse_args(args_in)
        if args.predict and (not args.model or args.batch is None):
            raise _Usage("--predict needs --model NAME and --batch B: the step to predict")
        if args.batch is not None and args.batch < 1:
            raise _Usage(f"--batch must be a positive number of samples, got {args.batch}")
        if not args.predict and (args.model or args.batch is not None):
            raise _Usage("--model and --batch are for --predict")
        snap = load_snapshot(args.snapshot, args.device)
        comparison = None
        if args.predict:
            workspace = (_memfit.DEFAULT_CUDA_WORKSPACE if args.cuda_workspace is None
                         else _memfit.parse_size(args.cuda_workspace))
            report, timeline = _memfit.profile_builtin(args.model, args.batch, args.optimizer,
                                                       args.iterations, workspace)
            comparison = snap.compare(report, timeline)
            for note in comparison.notes:
                if note.startswith("warning: "):
                    print(f"memfit explain: {note}", file=sys.stderr)
        if args.html:
            snap.save_html(args.html)
        if args.json:
            d = snap.as_dict()
            if comparison is not None:
                d["comparison"] = comparison.as_dict()
            print(json.dumps(d, indent=2))
        else:
            print(snap.table())
            if comparison is not None:
                print()
                print(comparison.table())
            if args.html:
                print(f"\nwrote {args.html}")
        return 0
    except _Usage as e:
        print(f"memfit explain: {e} (see memfit explain --help)", file=sys.stderr)
    except (NotASnapshot, OSError, ValueError) as e:
        print(f"memfit explain: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
    return 1
