"""The text workload's study (`make train-study`) at a tiny size: reruns write the same bytes, on one worker
process or two, the outer rate kept is the grid's best on the tuning seed, the target is one no island reaches
alone, and every verdict table holds `none`, `sync` and the host tree."""

import json
import math

import pytest

torch = pytest.importorskip("torch")

from inwire.train import stats, text_study  # noqa: E402
from inwire.train.training import _simulate_cached  # noqa: E402

TINY = ["--islands", "LON,AMS,FRA,NYC", "--steps", "40", "--local-steps", "5,20", "--outer", "avg,1",
        "--tuning-seed", "0", "--seeds", "1,2", "--strategies", ",".join(text_study.STRATEGIES), "--text-width", "16",
        "--text-layers", "1", "--text-context", "16", "--text-batch", "2"]


@pytest.fixture(scope="module")
def reruns(tmp_path_factory):
    outputs = []
    for run, workers in (("first", "1"), ("second", "2")):
        _simulate_cached.cache_clear()
        out = tmp_path_factory.mktemp(run)
        assert text_study.main([*TINY, "--workers", workers, "--out-dir", str(out)]) == 0
        outputs.append({name: (out / name).read_bytes() for name in ("study.json", "study.md", "text-h5.png")})
    return outputs


def test_a_rerun_on_two_worker_processes_writes_the_files_of_one(reruns):
    assert reruns[0] == reruns[1]
    assert reruns[0]["text-h5.png"][:4] == b"\x89PNG"


def test_each_strategy_keeps_the_outer_step_with_the_lowest_tuning_loss(reruns):
    study = json.loads(reruns[0]["study.json"])
    tuning = study["tuning"]
    assert set(tuning["final_loss"]) == set(text_study.STRATEGIES) - {"none"}
    for name, by_h in tuning["final_loss"].items():
        for h, losses in by_h.items():
            assert set(losses) == {"avg", "nesterov 1"}
            assert tuning["chosen"][name][h] == min(losses, key=losses.get), (name, h)
            cell = next(c for c in study["cells"] if str(c["local_steps"]) == h)
            strategy = cell["strategies"][name]
            assert text_study.outer_label((strategy["outer_lr"], strategy["outer_momentum"])) == \
                tuning["chosen"][name][h]
    # Strategies computing the same exact average train alike, so they choose alike.
    assert tuning["chosen"]["global"] == tuning["chosen"]["ring"] == tuning["chosen"]["host-tree"]


def test_the_target_is_below_every_lone_island_and_every_table_has_none_sync_and_the_host_tree(reruns):
    study = json.loads(reruns[0]["study.json"])
    target = study["target"]
    assert target["loss"] <= min(target["best_single_island_alone"]) - text_study.MARGIN + 1e-9
    assert round(target["loss"] * 100, 6) == int(round(target["loss"] * 100, 6))
    for cell in study["cells"]:
        assert {"none", "sync", "host-tree", "global"} <= set(cell["schedule_vs"])
        assert cell["summary"]["none"]["time_to_target_ms"]["n"] == 0, "no island alone reaches the target"
        assert cell["strategies"]["sync"]["period"] == 1
    text = reruns[0]["study.md"].decode()
    header = next(line for line in text.splitlines() if line.startswith("| H | schedule's rounds |"))
    assert all(f" {name} " in header for name in ("none", "sync", "host-tree", "global", "gossip", "random"))


def test_the_verdicts_are_the_paired_statistics_corrected_over_every_h(reruns):
    """Two seeds (the fewest the study takes): no p can be below 0.5, so every verdict is a tie, and the
    caption says so; the exact averages sync every H steps like the schedule (the equal-communication
    control)."""
    study = json.loads(reruns[0]["study.json"])
    table = [versus for cell in study["cells"] for versus in cell["schedule_vs"].values()]
    assert [versus["p_holm"] for versus in table] == stats.holm([versus["p"] for versus in table])
    assert {versus["verdict"] for versus in table} == {"tie"}
    assert all(versus["measure"] == "time-averaged loss" and not versus["higher_is_better"] for versus in table)
    for cell in study["cells"]:
        for control in ("global", "ring", "host-tree"):
            assert cell["strategies"][control]["period"] == cell["strategies"]["schedule"]["period"]
    text = reruns[0]["study.md"].decode()
    assert f"over the table's {len(table)} comparisons" in text and "other than a tie" in text
    cell = study["cells"][0]
    versus = cell["schedule_vs"]["host-tree"]
    (row,) = [line for line in text.splitlines() if line.startswith("| host-tree | 5 |")]
    assert row.endswith(f"| {stats.format_difference(versus, 3)} | {stats.format_p(versus['p_holm'])} | tie | "
                        f"{versus['time_to_target']['sooner']}↑ {versus['time_to_target']['later']}↓ of 2 |")
    verdicts = next(line for line in text.splitlines() if line.startswith("| 5 |"))
    assert f"| tie {stats.format_difference(versus, 3)} p={stats.format_p(versus['p_holm'])} |" in verdicts


def test_the_target_rule_on_made_up_curves():
    """Best lone island 2.5432 -> 2.53; a lone island at exactly 2.54 leaves 2.53 too (0.01 below, not less)."""
    def curve(*losses, best=None):
        return [{"loss": loss, "best_island_loss": best or loss, "time_ms": 100.0 * i}
                for i, loss in enumerate(losses)]

    none = [curve(3.0, 2.6, best=2.5432), curve(3.0, 2.7, best=2.6)]
    sync = [curve(3.0, 2.4), curve(3.0, 2.535)]
    target = text_study.choose_target(none, sync)
    assert target["loss"] == 2.53 and target["sync_reaches"] == 1 and target["seeds"] == 2
    assert text_study.choose_target([curve(3.0, best=2.54)], sync)["loss"] == 2.53
    assert not math.isclose(text_study.choose_target([curve(3.0, best=2.5399)], sync)["loss"], 2.53)


def test_the_estimate_counts_the_workers_and_the_phases():
    """Runs go longest first onto the first free worker; the evaluation phase waits for the tuning phase."""
    assert text_study.makespan([[3, 2, 2, 1]], 1) == 8
    assert text_study.makespan([[3, 2, 2, 1]], 2) == 4
    assert text_study.makespan([[3], [2, 2]], 2) == 5
    assert text_study.makespan([[2, 2]], 2, busy=[1.5]) == 3.5
    assert text_study.makespan([], 2, busy=[1.5]) == 1.5


@pytest.mark.parametrize("change", [{"seeds": (0, 1)}, {"seeds": (1,)}, {"local_steps": (500,)},
                                    {"strategies": ("none", "global")}, {"outer_steps": ((0.0, 0.9),)},
                                    {"text_width": 18}])
def test_settings_that_cannot_make_a_study_are_refused(change):
    with pytest.raises(ValueError):
        text_study.StudySettings(**change)
