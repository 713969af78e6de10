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
