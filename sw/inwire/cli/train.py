"""`inwire train`: the training study (islands simulated in one process, deterministic time), over seeds,
data splits, charged model sizes and outer optimizers; writes study.json, study.md and a plot per table.
Two workloads: `digits` (an MLP, the quick cell) and `text` (a byte-level transformer on the standard
library's sources). Needs the torch extra. Islands as torchrun jobs through a real aggregator: `make train-dist`."""

import math
import pathlib
import sys

from .. import extras
from ..output import check_outputs_apart
from .options import MAX_MODEL_MB, check_integer, check_seed, decimal, parse_decimal, topology_file, whole

STRATEGY_NAMES = ("none", "global", "global-equal", "hierarchical", "ring", "gossip", "random", "schedule",
                  "schedule-h")
OUTERS = ("avg", "nesterov")
WORKLOADS = ("digits", "text")
DEFAULTS = {"digits": {"steps": 300, "learning_rate": 0.2, "outer": "avg"},
            "text": {"steps": 200, "learning_rate": 2e-3, "outer": "nesterov"}}
"""Per workload: local steps, the inner optimizer's learning rate (digits SGD, text AdamW) and the outer step
(text: DiLoCo's Nesterov)."""
MAX_STEPS = 10_000
"""Most local steps: 10,000 steps of 32 samples pass about 2,000 times over an island's share of the digits
(some 160 samples with 9 islands; the default 300 steps pass about 60 times)."""
MAX_SEEDS = 1_000
"""Most seeds: each is a training run per strategy and cell, about 10 s for the default study here, so that
1,000 seeds already take hours."""
MAX_STEP_MS = 86_400_000
"""A day per local step: far beyond any real step, and within what the study's clock and plots take (1e308
ms makes the clock infinite)."""


def add_arguments(parser):
    parser.add_argument("--topology", default="doublezero9", help="doublezero9 or a topology file")
    parser.add_argument("--islands", default="", help="comma-separated cities (default: all)")
    parser.add_argument("--workload", choices=WORKLOADS, default="digits",
                        help="digits (64-32-10 MLP, SGD, scored by test accuracy) or text (byte-level transformer "
                             "on the standard library's sources, AdamW, scored by validation loss)")
    parser.add_argument("--steps", type=whole("--steps"), default=None,
                        help="local steps per island (digits 300, text 200)")
    parser.add_argument("--local-steps", "--period", dest="local_steps", type=whole("--local-steps"), default=10,
                        metavar="H", help="local steps between syncs")
    parser.add_argument("--strategies", default=",".join(STRATEGY_NAMES),
                        help=f"comma-separated among {', '.join(STRATEGY_NAMES)}")
    parser.add_argument("--seeds", type=whole("--seeds"), default=1, help="number of seeds, from --seed on")
    parser.add_argument("--seed", type=whole("--seed"), default=0, help="first seed")
    parser.add_argument("--alpha", default=None,
                        help="digits: comma-separated Dirichlet concentrations of the class split (default 0.3); "
                             "'iid' for an IID split. The text workload is split by module family")
    parser.add_argument("--model-mb", default="0",
                        help="comma-separated model sizes (MB) communication is planned and charged for; "
                             "0 is the workload model's own size")
    parser.add_argument("--aggregator", default="ideal",
                        help="comma-separated aggregator profiles the planner charges rounds with (ideal, port10g, "
                             "versa_ecp5, alveo_u200)")
    parser.add_argument("--step-ms", default="100", help="comma-separated compute times (ms) charged per local step")
    parser.add_argument("--device-tflops", type=decimal("--device-tflops"), default=0.0,
                        help="instead of --step-ms: charge 6 FLOPs per parameter of the charged model and sample "
                             "at this sustained rate (needs one --model-mb)")
    parser.add_argument("--outer", default=None,
                        help="comma-separated among avg (plain model averaging) and nesterov (DiLoCo outer step); "
                             "default digits avg, text nesterov")
    parser.add_argument("--outer-lr", type=decimal("--outer-lr"), default=0.7, help="outer learning rate of nesterov")
    parser.add_argument("--outer-momentum", type=decimal("--outer-momentum"), default=0.9,
                        help="outer momentum of nesterov")
    parser.add_argument("--learning-rate", type=decimal("--learning-rate"), default=None,
                        help="inner learning rate (digits SGD 0.2, text AdamW 0.002)")
    parser.add_argument("--target", type=decimal("--target"), default=0.85, help="digits: accuracy for time-to-target")
    parser.add_argument("--target-loss", type=decimal("--target-loss"), default=2.85,
                        help="text: mean island validation loss (nats per byte) for time-to-target")
    parser.add_argument("--text-width", type=whole("--text-width"), default=128, help="text: model width")
    parser.add_argument("--text-layers", type=whole("--text-layers"), default=5, help="text: transformer blocks")
    parser.add_argument("--text-context", type=whole("--text-context"), default=64, help="text: bytes per window")
    parser.add_argument("--text-batch", type=whole("--text-batch"), default=4, help="text: windows per island and step")
    parser.add_argument("--out-dir", default="train", help="where study.json, study.md and the plots go")
    parser.add_argument("--json", action="store_true", help="print the study as JSON")


def _list(text, parse, name):
    try:
        values = [parse(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"--{name}: cannot read {text!r}") from None
    if any(isinstance(v, float) and not math.isfinite(v) for v in values):
        raise ValueError(f"--{name} must list finite numbers, got {text!r}")
    if not values:
        raise ValueError(f"--{name} needs at least one value")
    return values


def run(args):
    defaults = DEFAULTS[args.workload]
    args.steps = defaults["steps"] if args.steps is None else args.steps
    args.learning_rate = defaults["learning_rate"] if args.learning_rate is None else args.learning_rate
    args.outer = defaults["outer"] if args.outer is None else args.outer
    check_integer("--steps", args.steps, 1, MAX_STEPS, "2,000 passes over an island's share of the digits")
    for option in ("text_width", "text_layers", "text_context", "text_batch"):
        check_integer(f"--{option.replace('_', '-')}", getattr(args, option), 1, 4096, "a small model")
    check_integer("--seeds", args.seeds, 1, MAX_SEEDS, "each is a training run per strategy and cell")
    check_integer("--local-steps", args.local_steps, 1, MAX_STEPS, "as many as --steps may be")
    check_seed(args.seed)
    for option in ("device_tflops", "outer_lr", "outer_momentum", "learning_rate", "target", "target_loss"):
        if not math.isfinite(getattr(args, option)) or getattr(args, option) < 0:
            raise ValueError(f"--{option.replace('_', '-')} must be a finite number of 0 or more, "
                             f"got {getattr(args, option)}")
    if args.workload == "text" and args.alpha is not None:
        raise ValueError("--alpha splits the digits; the text workload is split by module family")
    alphas = [None] if args.workload == "text" else _list(
        args.alpha or "0.3", lambda a: None if a.strip().lower() == "iid" else parse_decimal("--alpha", a.strip()),
        "alpha")
    sizes_mb = _list(args.model_mb, lambda size: parse_decimal("--model-mb", size.strip()), "model-mb")
    if any(not 0 <= mb <= MAX_MODEL_MB for mb in sizes_mb):
        raise ValueError(f"--model-mb must list sizes in [0, {MAX_MODEL_MB:,.0f}] MB (a petabyte), got "
                         f"{args.model_mb}")
    sizes = [round(mb * 1e6) for mb in sizes_mb]
    outers = _list(args.outer, str.strip, "outer")
    if set(outers) - set(OUTERS):
        raise ValueError(f"--outer must be among {', '.join(OUTERS)}, got {args.outer}")
    outer_settings = [(1.0, 0.0) if o == "avg" else (args.outer_lr, args.outer_momentum) for o in outers]
    step_times = _list(args.step_ms, lambda step: parse_decimal("--step-ms", step.strip()), "step-ms")
    if any(not 0 <= step <= MAX_STEP_MS for step in step_times):
        raise ValueError(f"--step-ms must list compute times of 0 to {MAX_STEP_MS:,} ms (a day) per local step, "
                         f"got {args.step_ms!r}")
    aggregators = _list(args.aggregator, str.strip, "aggregator")
    from ..plan.aggregator import PROFILES

    if set(aggregators) - set(PROFILES):
        raise ValueError(f"--aggregator must be among {', '.join(PROFILES)}, got {args.aggregator}")
    check_outputs_apart([("--out-dir", pathlib.Path(args.out_dir) / name) for name in ("study.json", "study.md")],
                        {"--topology": topology_file(args.topology)})
    extras.require("torch", "the training study")
    # Imported once the options are checked: torch takes seconds to load.
    from ..train import training

    if args.device_tflops:
        if len(sizes) != 1 or not sizes[0]:
            raise ValueError("--device-tflops derives the step time from one charged --model-mb")
        # Samples per step: digits images, text bytes (6 FLOPs per parameter and token).
        samples = args.text_batch * args.text_context if args.workload == "text" else 32
        step_times = [training.step_ms_from_flops(sizes[0], samples, args.device_tflops)]
        if step_times[0] > MAX_STEP_MS:
            raise ValueError(f"--device-tflops {args.device_tflops:g} makes a local step of {step_times[0]:,.0f} ms, "
                             f"more than {MAX_STEP_MS:,} (a day); raise --device-tflops")
    rate = "text_learning_rate" if args.workload == "text" else "learning_rate"
    config = training.TrainConfig(
        topology=args.topology, islands=tuple(filter(None, args.islands.split(","))), steps=args.steps,
        local_steps=args.local_steps, seed=args.seed, strategies=tuple(_list(args.strategies, str.strip, "strategies")),
        step_ms=step_times[0], target=args.target, alpha=alphas[0],
        model_bytes=sizes[0], outer_lr=outer_settings[0][0], outer_momentum=outer_settings[0][1],
        aggregator=aggregators[0], workload=args.workload, target_loss=args.target_loss,
        text_width=args.text_width, text_layers=args.text_layers, text_context=args.text_context,
        text_batch=args.text_batch, **{rate: args.learning_rate})
    study = training.run_study(config, range(args.seed, args.seed + args.seeds), alphas, sizes, outer_settings,
                               step_times, aggregators)
    written = training.write_study(study, pathlib.Path(args.out_dir))
    # The terminal gets a line per cell; the whole study (every strategy's figures) is in the files.
    print(training.study_json(study) if args.json else training.format_summary(study),
          end="" if not args.json else "\n")
    plots = [str(path) for path in written if path.suffix == ".png"]
    # With --json stdout is the study alone; where the files went is then said on stderr.
    print(f"wrote the whole study to {written[0]} and {written[1]}, and {len(plots)} "
          f"plot{'s' if len(plots) != 1 else ''}: {', '.join(plots)}", file=sys.stderr if args.json else sys.stdout)
    return 0
