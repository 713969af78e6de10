"""The compiled kernel (`inwire._kernel`), or None where it was not built: every user takes it from here and
runs its Python path without it. `make setup` builds it from the C files beside the modules they speed up:
_codec.c (codec), _transport.c (transport), _fastpath.c (fastpath, serve) and _client.c (client)."""

from importlib import import_module
from typing import Any

compiled: Any
"""`Any`: the extension ships no stubs, so its calls are checked by the tests that drive both paths, not by mypy."""
try:
    compiled = import_module("._kernel", __package__)
except ImportError:  # the extension is optional
    compiled = None
