"""The compiled kernel (`inwire._fastpath`, built by `make setup` from the C files beside the modules it speeds
up), or None where it was not built: every user takes it from here and falls back to Python without it."""

try:
    from . import _fastpath as compiled
except ImportError:  # the extension is optional
    compiled = None
