"""`inwire run`, the README's first command: the main job on built-in defaults, without root, to
`bit_exact: true` on the software aggregator and on the simulated gateware."""

import json

import pytest

from inwire.cli import main


@pytest.mark.sim
def test_the_main_job_runs_end_to_end_on_defaults(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--sim", "icarus", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["bit_exact"] is True
    for name, kind in (("software", "udp://127.0.0.1:"), ("gateware", "sim:icarus")):
        assert report[name]["bit_exact"] and report[name]["target"].startswith(kind), name
        assert report[name]["results_checked"] == len(report[name]["islands"]) * 2 * 2  # 2 rounds of 2 chunks
    assert (tmp_path / "run" / "schedule.json").is_file()
    assert [line.split(" ", 3)[2] for line in captured.err.splitlines() if line.startswith("inwire run: ")
            and line.split(" ")[2] in ("1/3", "2/3", "3/3")] == ["1/3", "2/3", "3/3"]
