"""`make mutate`, software half: mutmut 3 over the golden model, the fast path, the job tables and the control plane,
each against its own tests.

Each target runs in its own folder, build/mutation/<target>/, for two reasons: mutmut reads one
configuration per folder (`[tool.mutmut]` in its pyproject.toml), and each file must be held to its own
tests (the fast path's differential tests would kill model mutants only because the fast path then
disagrees, which says nothing about the model's own tests). mutmut imports a package's mutated copy only
from `src/` or the folder itself, so the folder holds sw/inwire and hdl/inwire_hdl as src/inwire and
src/inwire_hdl beside copies of tests/ and tb/: the run tests the tree it is started in, whatever the
editable install points to.

`--sample N` runs N of a file's mutants, drawn with a fixed seed (`--seed`) from the names mutmut would
generate, so that two runs of the same tree score the same mutants; 0 runs them all. mutmut still runs
the selected tests once to learn which tests reach which function.

Prints killed / survived per file and lists the survivors (mutants that no selected test reaches, "no
tests", only counted per function); build/mutation/<target>/report.md has the survivors' diffs,
mutmut.log mutmut's output. Run from the repository's root:
`python tb/mutation/software.py [--sample N] [--seed S] [target ...]`.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

TARGETS = {
    "model": {
        "file": "sw/inwire/model.py",
        "tests": ["tests/test_model.py", "tests/test_tree_model.py", "tests/test_model_order.py",
                  "tests/test_lease.py", "tests/test_model_rules.py", "tests/test_jobs_model.py"],
        "env": {},
    },
    # A registered job's tables (their bounds, slot ranges, clashes) and the model's version 3 rules over them.
    "jobs": {
        "file": "sw/inwire/jobs.py",
        "tests": ["tests/test_jobs_model.py", "tests/test_model_rules.py", "tests/test_control.py"],
        "env": {},
    },
    "control": {
        "file": "sw/inwire/control.py",
        "tests": ["tests/test_control.py", "tests/test_cli_job.py"],
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


# mutmut's own generation, run in the work folder (it reads its configuration from there): every mutant's name.
LIST_MUTANTS = """
import json, sys
from pathlib import Path
from mutmut.mutation.file_mutation import mutate_file_contents
from mutmut.utils.format_utils import get_mutant_name
path = Path(sys.argv[1])
mutated = mutate_file_contents(str(path), path.read_text())
print(json.dumps([get_mutant_name(path, name) for name in mutated.mutant_names]))
"""


def sampled(work, mutated, env, sample, seed):
    """(names to run, every mutant's count): `sample` of the file's mutants drawn with `seed`; None: all."""
    listing = subprocess.run([sys.executable, "-c", LIST_MUTANTS, mutated], cwd=work, env=env, capture_output=True,
                             text=True, check=True)
    names = sorted(json.loads(listing.stdout))
    if not sample or sample >= len(names):
        return None, len(names)
    return sorted(random.Random(seed).sample(names, sample)), len(names)


def run(name, target, jobs, sample, seed):
    work, mutated = prepare(name, target)
    env = {**os.environ, **target["env"]}
    chosen, total = sampled(work, mutated, env, sample, seed)
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    with open(work / "mutmut.log", "w") as log:
        subprocess.run([mutmut, "run", "--max-children", str(jobs), *(chosen or [])], cwd=work, env=env, stdout=log,
                       stderr=subprocess.STDOUT, check=True)
    from mutmut.stats import status_by_exit_code

    meta = json.loads((work / "mutants" / (mutated + ".meta")).read_text())
    statuses = {key: status_by_exit_code[code] for key, code in meta["exit_code_by_key"].items()
                if chosen is None or key in chosen}
    survivors = sorted(key for key, status in statuses.items() if status not in ("killed", "no tests"))
    diffs = {key: subprocess.run([mutmut, "show", key], cwd=work, env=env, capture_output=True, text=True).stdout
             for key in survivors}
    return statuses, diffs, total


def summary(file, statuses, diffs, total, seed):
    counts = Counter(statuses.values())
    untested = Counter(key.rsplit("__mutmut_", 1)[0] for key, status in statuses.items() if status == "no tests")
    killed = counts["killed"]
    drawn = f", a sample of {total} drawn with seed {seed}" if len(statuses) < total else ""
    lines = [f"## {file}: {killed} killed, {counts['survived']} survived of {len(statuses)}{drawn} "
             f"({100 * killed / max(len(statuses), 1):.1f} %)", ""]
    lines += [f"- {status}: {count}" for status, count in sorted(counts.items()) if status != "killed"]
    lines += [f"- no tests reach {function}: {count}" for function, count in sorted(untested.items())]
    for key, diff in diffs.items():
        lines += ["", f"### {key} ({statuses[key]})", "", "```diff", diff.strip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help=f"files by target name: {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--sample", type=int, default=0, help="mutants run per file, drawn with --seed (0: all)")
    parser.add_argument("--seed", type=int, default=1, help="the sample's seed (default: 1)")
    args = parser.parse_args(argv)
    names = args.targets or list(TARGETS)
    unknown = set(names) - set(TARGETS)
    if unknown:
        sys.exit(f"unknown target(s) {', '.join(sorted(unknown))}; choose from {', '.join(TARGETS)}")
    if args.sample < 0:
        sys.exit(f"--sample must be 0 (all) or a positive count, got {args.sample}")
    if not Path("sw/inwire").is_dir():
        sys.exit("run from the repository's root")
    jobs = os.cpu_count() or 1
    for name in names:
        statuses, diffs, total = run(name, TARGETS[name], jobs, args.sample, args.seed)
        report = summary(TARGETS[name]["file"], statuses, diffs, total, args.seed)
        (BUILD / name / "report.md").write_text(report)
        print(report.split("\n", 1)[0].removeprefix("## "))
        for line in report.split("\n\n### ", 1)[0].splitlines()[2:]:
            print(f"    {line.removeprefix('- ')}")
        for key in diffs:
            print(f"    {statuses[key]}: {key}")
        print(f"    diffs: {BUILD / name / 'report.md'}")


if __name__ == "__main__":
    main(sys.argv[1:])
