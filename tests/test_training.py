"""The training study: deterministic time, the equal-budget control, statistics over seeds, the command."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from inwire.cli import main  # noqa: E402
from inwire.train import stats  # noqa: E402
from inwire.train.training import (  # noqa: E402
    Strategy,
    TrainConfig,
    cell_title,
    format_study,
    format_verdicts,
    gossip_rounds,
    plan_strategies,
    random_rounds,
    run_study,
    run_training,
    split_data,
    time_to_accuracy_ms,
)

ISLANDS = ("LON", "AMS", "FRA", "NYC")


def partitions(rounds):
    """Rounds as sets of member sets: the planner's evaluation may put a clique's members in another order."""
    return [{frozenset(members) for members in round_} for round_ in rounds]
SMALL = dict(islands=ISLANDS, steps=40, local_steps=10, model_bytes=100_000_000, step_ms=50.0)


def test_identical_work_is_charged_identical_compute_time():
    report = run_training(TrainConfig(**SMALL))
    curves = report["curves"]
    steps = [point["step"] for point in curves["none"]]
    for name, curve in curves.items():
        assert [point["step"] for point in curve] == steps, name
        assert [point["compute_ms"] for point in curve] == [50.0 * step for step in steps], name
        for point in curve:
            assert point["time_ms"] == point["compute_ms"] + point["communication_ms"], name
    assert all(point["communication_ms"] == 0 for point in curves["none"])
    # global and ring do the same training (the same exact average) and differ only in what a sync costs.
    assert [p["accuracy"] for p in curves["global"]] == [p["accuracy"] for p in curves["ring"]]
    assert curves["ring"][-1]["communication_ms"] > curves["global"][-1]["communication_ms"]


def test_time_is_reproducible_run_to_run():
    """The planner's seeded search, the charged time and the training itself repeat: both caches are cleared,
    so the second run plans and trains again."""
    from inwire.train import training

    first = run_training(TrainConfig(**SMALL, strategies=("schedule", "random")))["curves"]
    plan_strategies.cache_clear()
    training._simulate_cached.cache_clear()
    second = run_training(TrainConfig(**SMALL, strategies=("schedule", "random")))["curves"]
    assert first == second


def test_equal_budget_control_spends_what_the_schedule_spends():
    islands, strategies, _ = plan_strategies("doublezero9", (), 100_000_000, 1e-3, 300, 10, 100.0, "ideal", 0)
    schedule, equal, plain = strategies["schedule"], strategies["global-equal"], strategies["global"]
    budget = schedule.communication_ms(300 // 10)
    spent = equal.communication_ms(300 // equal.period)
    assert equal.groups == plain.groups and equal.period > plain.period
    assert abs(spent - budget) <= plain.round_times_ms[0] / 2, "within half a global round of the budget"
    assert equal.detail["budget_ms"] == budget


def test_the_seed_draws_the_random_partitions_and_seeds_the_planner(monkeypatch):
    from inwire.train import training

    seeds = []

    def plan_schedule(*args, seed, **kwargs):
        seeds.append(seed)
        return planner(*args, seed=seed, **kwargs)

    planner = training.plan_schedule
    monkeypatch.setattr(training, "plan_schedule", plan_schedule)
    plan_strategies.cache_clear()
    randoms = []
    for seed in (3, 4):
        report = run_training(TrainConfig(**SMALL, seed=seed, strategies=("random",)))
        randoms.append(partitions(report["strategies"]["random"]["rounds"]))
        assert randoms[-1] == partitions(random_rounds(list(ISLANDS), seed))
    assert randoms[0] != randoms[1]
    assert seeds == [3, 3, 4, 4], "both plans (schedule and schedule-h) of each seed are searched with that seed"
    plan_strategies.cache_clear()


def test_the_study_reports_what_varies_by_seed_and_none_in_every_verdict_table():
    study = run_study(TrainConfig(**SMALL), seeds=(0, 1))
    (cell,) = study["cells"]
    assert list(cell["schedule_vs"]) == ["none", "global", "global-equal", "hierarchical", "ring", "gossip",
                                         "random", "schedule-h"]
    header = format_verdicts(study).splitlines()[0]
    assert header.split(" | ")[7:9] == ["none", "global"], "none is the first verdict column"
    # The random strategy draws other partitions per seed: reported per seed, never one seed's for all.
    random = cell["strategies"]["random"]
    assert "rounds" not in random
    assert list(map(partitions, random["per_seed"]["rounds"])) == [partitions(random_rounds(list(ISLANDS), seed))
                                                                    for seed in (0, 1)]
    assert random["period"] == 10
    # Where the planner's search gives other rounds per seed, the verdicts name every kind and the cell's
    # table the range of its objectives.
    schedule = cell["strategies"]["schedule"]
    schedule["per_seed"] = {"rounds": [schedule.pop("rounds"), [[list(ISLANDS[:2]), list(ISLANDS[2:])]]]}
    assert "| 1 round of 2+2; global clique |" in format_verdicts(study)
    cell["summary"]["schedule"]["local_step_objective_ms_per_seed"] = [1234.0, 2500.0]
    (row,) = [line for line in format_study(study).splitlines() if line.startswith("| schedule |")]
    assert "| 1.23–2.50 |" in row


def test_communication_follows_the_rounds_in_order():
    strategy = Strategy("x", (((0, 1),), ((1, 2),), ((0, 2),)), (1.0, 10.0, 100.0), 5)
    assert [strategy.communication_ms(k) for k in range(5)] == [0.0, 1.0, 11.0, 111.0, 112.0]


def test_gossip_pairs_everyone_across_rotations():
    islands = list("ABCDEFGHI")
    rounds = gossip_rounds(islands)
    partners = {island: set() for island in islands}
    for pairs in rounds:
        assert len({m for pair in pairs for m in pair}) == 2 * len(pairs), "a partition into pairs"
        for a, b in pairs:
            partners[a].add(b)
            partners[b].add(a)
    assert all(partners.values()), "no island is left without partners over a period"


def test_islands_get_disjoint_skewed_or_iid_shares():
    shards, (test_x, test_y) = split_data(0.3, 0, 4)
    assert sum(len(y) for _, y in shards) + len(test_y) == 1797
    assert min(len(set(y.tolist())) for _, y in shards) < 10, "a small alpha leaves some island without a class"
    iid, _ = split_data(None, 0, 4)
    assert min(len(set(y.tolist())) for _, y in iid) == 10


def test_a_ten_seed_cell_judges_the_schedule_by_the_paired_statistics():
    """Four islands, 40 steps, 10 seeds. At 50 ms a step the schedule (here the global clique) spends the
    first of its 2 s of compute talking: over the time both cover, `none` (no communication) scores higher on
    every seed, and the equal-budget control, syncing every 9 steps instead of 10, lower. Neither reaches 85 %,
    so the old count (0↑ 0↓) could not tell them apart. Every p is corrected over the study's comparisons."""
    study = run_study(TrainConfig(**{**SMALL, "strategies": ("none", "global", "global-equal", "schedule")}),
                      seeds=range(10))
    (cell,) = study["cells"]
    versus = cell["schedule_vs"]
    assert [versus[name]["verdict"] for name in ("none", "global", "global-equal")] == ["loss", "tie", "win"]
    assert versus["global"]["ci"] == [0.0, 0.0] and versus["global"]["p"] == 1.0, "the schedule is the global clique"
    assert versus["none"]["ci"][1] < 0 < versus["global-equal"]["ci"][0]
    assert [versus[name]["p_holm"] for name in versus] == stats.holm([versus[name]["p"] for name in versus])
    assert versus["none"]["time_to_target"] == {"sooner": 0, "later": 0, "both_reached": 0,
                                                "mean_difference_ms": None}
    text = format_study(study)
    assert "Holm-corrected over every comparison of the table" in text and "3 comparisons" in text
    (header,) = [line for line in text.splitlines() if line.startswith("| strategy |")]
    assert header.endswith("| schedule − row: time-averaged score [95 % CI] | Holm p | verdict | time to target: "
                           "seeds schedule sooner, later |")
    (row,) = [line for line in text.splitlines() if line.startswith("| global-equal |")]
    difference = versus["global-equal"]
    assert row.endswith(f"| {stats.format_difference(difference, 2, 100)} | {stats.format_p(difference['p_holm'])} "
                        "| win | 0↑ 0↓ of 10 |")
    assert f"| win {stats.format_difference(difference, 2, 100)} p=" in format_verdicts(study)


def test_train_seeds_prints_mean_and_std_per_strategy_with_the_control(tmp_path, capsys):
    argv = ["train", "--islands", ",".join(ISLANDS), "--steps", "40", "--seeds", "3", "--model-mb", "100",
            "--strategies", "global,global-equal,schedule", "--out-dir", str(tmp_path), "--json"]
    assert main(argv) == 0
    study = json.loads(capsys.readouterr().out)
    assert study == json.loads((tmp_path / "study.json").read_text())
    (cell,) = study["cells"]
    assert cell["seeds"] == [0, 1, 2]
    for name in ("global", "global-equal", "schedule"):
        accuracy = cell["summary"][name]["accuracy"]
        assert accuracy["n"] == 3 and 0 < accuracy["mean"] <= 1 and accuracy["std"] > 0, name
    assert cell["strategies"]["global-equal"]["matches"] == "schedule"
    assert set(cell["schedule_vs"]) == {"global", "global-equal"}
    assert (tmp_path / "ideal-alpha0.3-100mb-100ms-avg.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| schedule |" in (tmp_path / "study.md").read_text()


@pytest.mark.parametrize("argv", [["train", "--steps", "0"], ["train", "--strategies", "gossiping"],
                                  ["train", "--islands", "LON,XYZ", "--steps", "5"], ["train", "--seeds", "0"],
                                  ["train", "--outer", "adam"], ["train", "--alpha", "x"]])
def test_train_rejects_bad_settings_in_one_line(argv, capsys, tmp_path):
    assert main(argv + ["--out-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("inwire train: ") and error.count("\n") == 1


def test_time_to_accuracy_is_the_first_point_at_the_target():
    curve = [{"time_ms": 10.0, "accuracy": 0.5}, {"time_ms": 20.0, "accuracy": 0.9},
             {"time_ms": 30.0, "accuracy": 0.8}, {"time_ms": 40.0, "accuracy": 0.95}]
    assert time_to_accuracy_ms(curve, 0.85) == 20.0
    assert time_to_accuracy_ms(curve, 0.99) is None


def test_train_help_does_not_import_torch():
    """The command's module is loaded for its options; torch, sklearn and the study wait for a run."""
    import subprocess
    import sys

    code = ("import sys\nfrom inwire.cli import main\ntry:\n    main(['train', '--help'])\nexcept SystemExit:\n"
            "    pass\nprint(sorted({'torch', 'sklearn', 'inwire.train.training'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stderr


def test_simulated_average_is_the_codec_average():
    """The study averages with clique_average: members of a clique end equal, the others keep theirs."""
    from inwire.codec_average import clique_average
    from inwire.train.training import Islands

    islands = Islands(3, 8, seed=0)
    vectors = islands.vectors() + np.random.default_rng(0).normal(size=islands.vectors().shape).astype(np.float32)
    for i in range(3):
        islands.load(i, vectors[i])
    assert np.array_equal(islands.vectors(), vectors)
    average = clique_average([vectors[0], vectors[2]])
    assert not np.array_equal(average, (vectors[0] + vectors[2]) / 2), "quantized, not the float average"
    assert np.abs(average - (vectors[0] + vectors[2]) / 2).max() < 1e-6


def test_train_prints_a_line_per_cell_and_where_the_whole_study_went(tmp_path, capsys):
    """The terminal gets each strategy's time to target per cell, not the study's tables (study.md has them)."""
    argv = ["train", "--islands", ",".join(ISLANDS), "--steps", "20", "--local-steps", "5", "--alpha", "iid,0.3",
            "--strategies", "none,schedule", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    study = json.loads((tmp_path / "study.json").read_text())
    assert len(lines) == len(study["cells"]) + 1 == 3
    for line, cell in zip(lines, study["cells"]):
        assert line.startswith(cell_title(cell) + ": time to 85% in s, mean over seeds: ")
        assert all(f"{name} " in line for name in ("none", "schedule"))
    assert lines[-1].startswith(f"wrote the whole study to {tmp_path / 'study.json'} and {tmp_path / 'study.md'}")
    assert "| schedule |" in (tmp_path / "study.md").read_text()
