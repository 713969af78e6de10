"""The outer step of DiLoCo-style training, shared by the averager and the study (numpy only).

Between syncs an island takes H local steps from its anchor (its parameters after the previous sync). At a
sync its clique averages the parameters through inwire; the outer gradient is anchor - average (what DiLoCo
calls the averaged delta when every member starts from the same anchor, as in a global clique), and an
SGD step with momentum moves the anchor. Learning rate 1 without momentum is plain model averaging.
In rotating cliques members' anchors differ, so the outer gradient also carries their disagreement; the
momentum then speeds up mixing as well as descent. Float32 throughout, so every rank of an island, and the
study, compute the same bits.
"""

from dataclasses import dataclass

import numpy as np

STEP_BLOCK = 1 << 16
"""Elements `step_in_place` computes at a time: its float32 temporaries (256 KiB each) stay in cache."""


@dataclass(frozen=True)
class OuterOptimizer:
    lr: float = 1.0
    momentum: float = 0.0
    nesterov: bool = True

    def __post_init__(self) -> None:
        if not self.lr > 0 or not 0 <= self.momentum < 1:
            raise ValueError(f"outer lr must be positive and momentum in [0, 1), got {self.lr}, {self.momentum}")

    @property
    def plain(self) -> bool:
        """True when the outer step is plain averaging (the new parameters are the average itself)."""
        return self.lr == 1.0 and self.momentum == 0.0

    def step(self, anchor: np.ndarray, buffer: np.ndarray | None,
             average: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(new parameters, new momentum buffer) from the anchor, the buffer and the clique's average."""
        if self.plain:
            return np.array(average, dtype=np.float32), buffer
        lr, momentum = np.float32(self.lr), np.float32(self.momentum)
        gradient = (anchor - average).astype(np.float32)
        buffer = gradient if buffer is None else (momentum * buffer + gradient).astype(np.float32)
        direction = (gradient + momentum * buffer) if self.nesterov else buffer
        return (anchor - lr * direction).astype(np.float32), buffer

    def step_in_place(self, anchor: np.ndarray, buffer: np.ndarray | None, average: np.ndarray) -> np.ndarray | None:
        """`step`, bit for bit (the same float32 operations on each element), written into `anchor` (which
        becomes the new parameters) and `buffer` (the new momentum; made when None), block by block: no
        temporary the size of the vector. Returns the new buffer."""
        if self.plain:
            np.copyto(anchor, average)
            return buffer
        lr, momentum = np.float32(self.lr), np.float32(self.momentum)
        first_step = buffer is None
        if buffer is None:
            buffer = np.empty_like(anchor)
        size = min(len(anchor), STEP_BLOCK)
        gradient_scratch, scratch = np.empty(size, dtype=np.float32), np.empty(size, dtype=np.float32)
        for first in range(0, len(anchor), STEP_BLOCK):
            block = slice(first, first + STEP_BLOCK)
            anchors, buffers = anchor[block], buffer[block]
            count = len(anchors)
            gradient, product = gradient_scratch[:count], scratch[:count]
            np.subtract(anchors, average[block], out=gradient)
            if first_step:
                np.copyto(buffers, gradient)
            else:
                np.add(np.multiply(momentum, buffers, out=product), gradient, out=buffers)
            direction = buffers
            if self.nesterov:
                direction = np.add(gradient, np.multiply(momentum, buffers, out=product), out=product)
            np.subtract(anchors, np.multiply(lr, direction, out=product), out=anchors)
        return buffer
