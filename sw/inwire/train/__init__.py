"""Training through inwire (needs the `torch` extra).

- `averaging`: `CliqueAverager`, a drop-in for PyTorch's `PeriodicModelAverager`, optionally with a DiLoCo-style
  outer step, and `InwireExchange`, which carries one averaging to an aggregator over UDP;
- `training`: the study behind `inwire train`, islands simulated in one process with deterministic time;
- `island`, `dist`: islands as torchrun jobs (gloo or NCCL inside, inwire between), `make train-dist`.

The `inwire train` command is `inwire.cli.train`.

The arithmetic of one clique averaging (numpy only) is `inwire.codec_average`, beside the member client that
sends it. Importing this package does not import torch; its modules that need it do.
"""
