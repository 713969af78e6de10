"""A tiny training run through the software aggregator: islands learn, and the report holds together."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from inwire.cli import main  # noqa: E402
from inwire.train.training import TrainConfig, run_training, split_data, time_to_accuracy_ms  # noqa: E402

ISLANDS = ("LON", "AMS", "FRA", "NYC")


def test_tiny_run_lowers_the_loss_and_reports_every_strategy():
    config = TrainConfig(islands=ISLANDS, steps=60, period=10, strategies=("none", "schedule"))
    report = run_training(config)
    assert set(report["curves"]) == {"none", "schedule"}
    for name, curve in report["curves"].items():
        assert [point["step"] for point in curve] == list(range(10, 61, 10)), name
        assert curve[-1]["loss"] < curve[0]["loss"], name
        times = [point["time_ms"] for point in curve]
        assert times == sorted(times) and times[0] > 0


def test_islands_get_disjoint_skewed_shares():
    config = TrainConfig(islands=ISLANDS)
    shards, (test_x, test_y) = split_data(config, list(ISLANDS))
    sizes = [len(labels) for _, labels in shards.values()]
    assert sum(sizes) + len(test_y) == 1797
    class_counts = [len(set(labels.tolist())) for _, labels in shards.values()]
    assert min(class_counts) < 10, "a small Dirichlet alpha leaves some island without some classes"


@pytest.mark.parametrize("argv", [["train", "--steps", "0"], ["train", "--strategies", "gossip"],
                                  ["train", "--islands", "LON,XYZ", "--steps", "5"]])
def test_train_rejects_bad_settings_in_one_line(argv, capsys, tmp_path):
    assert main(argv + ["--out-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("inwire train: ") and error.count("\n") == 1


def test_train_command_writes_json_and_plot(tmp_path, capsys):
    argv = ["train", "--islands", "LON,AMS,FRA", "--steps", "20", "--period", "10", "--strategies", "global",
            "--out-dir", str(tmp_path), "--json"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "train.json").read_text())
    assert (tmp_path / "train.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_time_to_accuracy_is_the_first_point_at_the_target():
    curve = [{"time_ms": 10.0, "accuracy": 0.5}, {"time_ms": 20.0, "accuracy": 0.9},
             {"time_ms": 30.0, "accuracy": 0.8}, {"time_ms": 40.0, "accuracy": 0.95}]
    assert time_to_accuracy_ms(curve, 0.85) == 20.0
    assert time_to_accuracy_ms(curve, 0.99) is None
