"""The one base class of errors a user can cause: the `inwire` command prints their message as one line."""


class InwireError(Exception):
    """A run cannot start or go on for a reason the user can fix; the message is one line for them."""
