"""`python tests/formal_rows.py OUT`: runs the formal rows pickled in OUT/checks.pickle one solver run at a time
(the session's background lane, conftest.py), writes their table to OUT/runs/table.md and the rows to
OUT/rows.pickle. SIGTERM stops the solvers before it exits."""

import pickle
import signal
import sys
from pathlib import Path

from inwire_hdl import formal


def main(out: Path) -> None:
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    checks = pickle.loads((out / "checks.pickle").read_bytes())
    runs = out / "runs"
    rows = formal.run_all(checks, jobs=1, build_root=runs)
    (runs / "table.md").write_text(formal.summary(rows) + "\n")
    (out / "rows.pickle").write_bytes(pickle.dumps(rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
