"""`make mutate`, software half: mutmut 3 over the golden model and the fast path, each against its own tests.

Each target runs in its own folder, build/mutation/<target>/, for two reasons: mutmut reads one
configuration per folder (`[tool.mutmut]` in its pyproject.toml), and each file must be held to its own
tests (the fast path's differential tests would kill model mutants only because the fast path then
disagrees, which says nothing about the model's own tests). mutmut imports a package's mutated copy only
from `src/` or the folder itself, so the folder holds sw/inwire and hdl/inwire_hdl as src/inwire and
src/inwire_hdl beside copies of tests/ and tb/: the run tests the tree it is started in, whatever the
editable install points to.

Prints killed / survived per file and lists the survivors (mutants that no selected test reaches, "no
tests", only counted per function); build/mutation/<target>/report.md has the survivors' diffs,
mutmut.log mutmut's output. Run from the repository's root: `python tb/mutation/software.py [target ...]`.
"""

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

TARGETS = {
    "model": {
        "file": "sw/inwire/model.py",
        "tests": ["tests/test_model.py", "tests/test_tree_model.py", "tests/test_model_order.py",
                  "tests/test_lease.py", "tests/test_model_rules.py"],
        "env": {},
    },
    "fastpath": {
        "file": "sw/inwire/fastpath.py",
        "tests": ["tests/test_fastpath.py"],
        # Shorter streams than the default 4000 that still reach every counter their tests assert on (2000 do not).
        "env": {"INWIRE_FUZZ_FRAMES": "3000"},
    },
}
# Tests that tamper with the code themselves (they show that a test can fail): a mutant changes nothing
# they check, and `inspect.getsource` of a mutated function reads mutmut's trampoline.
DESELECT = "not tampered"
BUILD = Path("build/mutation")
SKIPPED = ("__pycache__", "*.pyc", "*.egg-info", "sim_build")


def prepare(name, target):
    """A fresh work folder for `target`: src/inwire, tests, tb and a pyproject.toml with its [tool.mutmut]."""
    work = BUILD / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for package in ("sw/inwire", "hdl/inwire_hdl"):
        shutil.copytree(package, work / "src" / Path(package).name, ignore=shutil.ignore_patterns(*SKIPPED))
    for folder in ("tests", "tb"):
        shutil.copytree(folder, work / folder, ignore=shutil.ignore_patterns(*SKIPPED, "mutation"))
    mutated = "src/" + Path(target["file"]).relative_to("sw").as_posix()
    section = {
        "source_paths": ["src"],
        "only_mutate": [mutated],
        "also_copy": ["tb"],
        "pytest_add_cli_args_test_selection": target["tests"] + ["-k", DESELECT],
        "pytest_add_cli_args": ["-p", "no:cacheprovider"],
    }
    lines = ["", "[tool.mutmut]"] + [f"{key} = {json.dumps(value)}" for key, value in section.items()]
    (work / "pyproject.toml").write_text(Path("pyproject.toml").read_text() + "\n".join(lines) + "\n")
    return work, mutated


def run(name, target, jobs):
    work, mutated = prepare(name, target)
    env = {**os.environ, **target["env"]}
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    with open(work / "mutmut.log", "w") as log:
        subprocess.run([mutmut, "run", "--max-children", str(jobs)], cwd=work, env=env, stdout=log,
                       stderr=subprocess.STDOUT, check=True)
    from mutmut.stats import status_by_exit_code

    meta = json.loads((work / "mutants" / (mutated + ".meta")).read_text())
    statuses = {key: status_by_exit_code[code] for key, code in meta["exit_code_by_key"].items()}
    survivors = sorted(key for key, status in statuses.items() if status not in ("killed", "no tests"))
    diffs = {key: subprocess.run([mutmut, "show", key], cwd=work, env=env, capture_output=True, text=True).stdout
             for key in survivors}
    return statuses, diffs


def summary(file, statuses, diffs):
    counts = Counter(statuses.values())
    untested = Counter(key.rsplit("__mutmut_", 1)[0] for key, status in statuses.items() if status == "no tests")
    killed = counts["killed"]
    lines = [f"## {file}: {killed} killed, {counts['survived']} survived of {len(statuses)} "
             f"({100 * killed / max(len(statuses), 1):.1f} %)", ""]
    lines += [f"- {status}: {count}" for status, count in sorted(counts.items()) if status != "killed"]
    lines += [f"- no tests reach {function}: {count}" for function, count in sorted(untested.items())]
    for key, diff in diffs.items():
        lines += ["", f"### {key} ({statuses[key]})", "", "```diff", diff.strip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv):
    names = argv or list(TARGETS)
    unknown = set(names) - set(TARGETS)
    if unknown:
        sys.exit(f"unknown target(s) {', '.join(sorted(unknown))}; choose from {', '.join(TARGETS)}")
    if not Path("sw/inwire").is_dir():
        sys.exit("run from the repository's root")
    jobs = os.cpu_count() or 1
    for name in names:
        statuses, diffs = run(name, TARGETS[name], jobs)
        report = summary(TARGETS[name]["file"], statuses, diffs)
        (BUILD / name / "report.md").write_text(report)
        print(report.split("\n", 1)[0].removeprefix("## "))
        for line in report.split("\n\n### ", 1)[0].splitlines()[2:]:
            print(f"    {line.removeprefix('- ')}")
        for key in diffs:
            print(f"    {statuses[key]}: {key}")
        print(f"    diffs: {BUILD / name / 'report.md'}")


if __name__ == "__main__":
    main(sys.argv[1:])
