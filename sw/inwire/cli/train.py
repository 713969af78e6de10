"""Train islands on digits with local SGD, averaging their models through inwire under the strategies
given (no averaging, one global clique, ring, the optimized schedule); writes train.json and train.png.
Needs the torch extra."""

import json
import pathlib

from .options import parse_simulator

STRATEGIES = ("none", "global", "ring", "schedule")


def add_arguments(parser):
    parser.add_argument("--topology", default="doublezero9", help="doublezero9 or a topology file")
    parser.add_argument("--islands", default="", help="comma-separated cities (default: all)")
    parser.add_argument("--steps", type=int, default=300, help="local SGD steps per island")
    parser.add_argument("--period", type=int, default=10, help="local steps between averaging rounds")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma-separated among {', '.join(STRATEGIES)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sim", default="", metavar="SIMULATOR[:WIDTH]",
                        help="average through the gateware in co-simulation (icarus or verilator) "
                             "instead of the golden model")
    parser.add_argument("--model-mb", type=float, default=0.0,
                        help="plan and charge communication for a model of this size (default: the MLP's own)")
    parser.add_argument("--out-dir", default="train", help="where train.json and train.png go")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args):
    try:
        from .. import training
    except ImportError as error:
        raise ValueError(f"needs the torch extra (pip install 'inwire[torch]'): {error}") from None
    config = training.TrainConfig(
        topology=args.topology, islands=tuple(filter(None, args.islands.split(","))), steps=args.steps,
        period=args.period, seed=args.seed, strategies=tuple(filter(None, args.strategies.split(","))),
        model_bytes=round(args.model_mb * 1e6), sim=parse_simulator(args.sim) if args.sim else ())
    report = training.run_training(config)
    training.write_report(report, pathlib.Path(args.out_dir))
    print(json.dumps(report) if args.json else training.format_report(report))
    return 0
