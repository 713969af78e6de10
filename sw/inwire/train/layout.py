"""What a clique averages, agreed on before its first sum: a layout digest of every member, compared.

Averaging is element by element: an island whose model registers a submodule in another order (the same
shapes, the same parameter count) would be averaged with the others position by position, its parameters
mixed with other parameters, and no sum would notice. So before a clique's first averaging its members
exchange `layout_words` (through the aggregator, `client.UdpMember.gather`: one small sum, once per clique
and layout) and `check_layouts` raises `LayoutMismatch`, the same one-line message on every member, when
they differ. The words hash, each as two int32 words, what can be told apart in a message: the parameters'
shapes in order and as a multiset (another order of the same shapes), their dtypes, their names (where the
caller gave them: `named_parameters()`), and the schedule as this island sees it.
"""

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ..codec_average import AveragingError

__all__ = ["LAYOUT_WORDS", "LayoutMismatch", "check_layouts", "layout_words", "schedule_text"]

TENSORS = 0
"""Where the words hold the parameter tensors' count; then two words, a 64-bit hash, for each part below."""
SHAPES, SHAPES_SORTED, DTYPES, NAMES, SCHEDULE = (slice(1 + 2 * part, 3 + 2 * part) for part in range(5))
LAYOUT_WORDS = 11
UNNAMED = (0, 0)
"""The names part of parameters given without names (compared with nobody's)."""


class LayoutMismatch(AveragingError):
    """The members of a clique would average different things; nothing was averaged."""


def _hash(text: str) -> list[int]:
    """Two int32 words of a 64-bit hash of `text`."""
    return [int(word) for word in np.frombuffer(hashlib.blake2b(text.encode(), digest_size=8).digest(), dtype=">i4")]


def schedule_text(rounds: Sequence[Sequence[tuple[Sequence[str], str | None]]], trees: Any) -> str:
    """The schedule as one canonical text: every round's cliques (members in order, aggregator) and trees."""
    canonical_trees = [[None if tree is None else sorted(dict(tree).items()) for tree in cliques] for cliques in trees]
    return json.dumps([[[list(members), aggregator] for members, aggregator in cliques] for cliques in rounds] +
                      [canonical_trees])


def layout_words(params: Sequence[torch.Tensor], names: Sequence[str] | None, schedule: str) -> npt.NDArray[np.int32]:
    """This island's LAYOUT_WORDS int32 words of what it averages: parameters `params` (named `names`, or None)
    along schedule `schedule` (`schedule_text`)."""
    shapes = [tuple(p.shape) for p in params]
    words = [min(len(params), 2**31 - 1)]
    words += _hash(repr(shapes)) + _hash(repr(sorted(shapes))) + _hash(repr([str(p.dtype) for p in params]))
    words += list(UNNAMED) if names is None else _hash(json.dumps(list(names)))
    words += _hash(schedule)
    return np.array(words, dtype=np.int32)


def _differences(theirs: npt.NDArray[np.int32], ours: npt.NDArray[np.int32]) -> str:
    """What the words `theirs` hold otherwise than `ours`, in words."""
    def differ(part: slice) -> bool:
        return not np.array_equal(theirs[part], ours[part])

    said = []
    if theirs[TENSORS] != ours[TENSORS]:
        said.append(f"{theirs[TENSORS]} parameter tensors, not {ours[TENSORS]}")
    elif differ(SHAPES) and not differ(SHAPES_SORTED):
        said.append("the same parameter shapes in another order")
    elif differ(SHAPES):
        said.append("parameters of other shapes")
    if differ(DTYPES) and theirs[TENSORS] == ours[TENSORS]:
        said.append("parameters of other dtypes")
    if not said and differ(NAMES):
        said.append("parameters of other names or in another order")
    if differ(SCHEDULE):
        said.append("along another schedule (rounds, cliques, aggregators)")
    return " and ".join(said)  # words that differ differ in one of these parts


def _digest(words: npt.NDArray[np.int32]) -> str:
    """A short name of a member's words, for the message."""
    return hashlib.blake2b(words.astype(">i4").tobytes(), digest_size=4).hexdigest()


def check_layouts(rows: npt.NDArray[np.int32], members: Sequence[str], what: str) -> None:
    """Raises `LayoutMismatch` unless every member's words (row m member m's, `layout_words`) agree; names
    count only when every member gave them. The islands that hold the words most members hold (the first
    member's among equals) are the reference; every other group is named with what it averages otherwise.
    `what` names the averaging (a round and clique): every member computes the same message from the same
    rows."""
    if any(tuple(row[NAMES]) == UNNAMED for row in rows):
        rows = rows.copy()
        rows[:, NAMES] = UNNAMED
    groups: dict[bytes, list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault(row.astype(">i4").tobytes(), []).append(index)
    if len(groups) == 1:
        return
    reference = max(groups.values(), key=lambda group: (len(group), -group[0]))
    ours = rows[reference[0]]
    told = []
    for group in groups.values():
        if group is reference:
            continue
        theirs = rows[group[0]]
        islands = ", ".join(members[index] for index in group)
        verb = "island" if len(group) == 1 else "islands"
        told.append(f"{verb} {islands} average{'s' if len(group) == 1 else ''} {_differences(theirs, ours)}, "
                    f"compared with {', '.join(members[index] for index in reference)} (layout digest "
                    f"{_digest(theirs)} against {_digest(ours)})")
    raise LayoutMismatch(f"{what}: {'; '.join(told)}; every island must build the same model (its submodules "
                         f"registered in the same order) and load the same schedule; nothing was averaged")
