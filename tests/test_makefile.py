"""`make setup` and `make run` on a fresh clone: pip is quiet, so each install step first says what it installs
and roughly how long it takes (nothing was printed for minutes before)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def recipe(target, **variables):
    """The commands `make -n` would run for `target`, continuation lines joined."""
    done = subprocess.run(["make", "-n", "-C", str(ROOT), *(f"{k}={v}" for k, v in variables.items()), target],
                          capture_output=True, text=True, check=True)
    return [line.strip() for line in re.sub(r"\\\n\s*", "", done.stdout).splitlines() if line.strip()]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_every_install_step_says_what_it_installs_and_how_long_before_pip_runs_quietly(tmp_path):
    venv = tmp_path / "venv"
    commands = recipe(f"{venv}/.installed", VENV=venv)
    installs = [i for i, command in enumerate(commands) if "pip install" in command]
    assert len(installs) == 3, commands
    for index in installs:
        command = commands[index]
        assert "--quiet" in command, command
        # What this step installs: the last word of the pip line without quotes and extras ('torch==2.13.0',
        # '.[dev,torch]' is inwire itself, 'pip' for the upgrade).
        package = command.split()[-1].strip("'\"").split("[")[0].split("==")[0]
        name = "inwire" if package == "." else package
        said = [c for c in commands[:index] if c.startswith("echo ")]
        assert said and commands.index(said[-1]) > max([i for i in installs if i < index], default=-1), (
            f"nothing said before {command!r}")
        assert name in said[-1] and re.search(r"~\d+ (s|min)", said[-1]), (name, said[-1])
