"""Print the protocol reference, docs/protocol.md, generated from the field tables of inwire.protocol."""

import sys

from ..docs import protocol_markdown


def add_arguments(parser):
    pass


def run(_args):
    sys.stdout.write(protocol_markdown())
    return 0
