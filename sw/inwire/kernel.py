"""The compiled kernel (`inwire._kernel`), or None where it was not built: every user takes it from here and
runs its Python path without it. `make setup` builds it from the C files beside the modules they speed up:
_codec.c (codec), _transport.c (transport), _fastpath.c (fastpath, serve) and _client.c (client)."""

try:
    from . import _kernel as compiled
except ImportError:  # the extension is optional
    compiled = None
