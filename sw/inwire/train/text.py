"""The study's text workload: a byte-level decoder-only transformer on the Python standard library's sources.

The corpus is on every machine that runs Python, with no download: the `*.py` files of the families below,
under `sysconfig.get_paths()["stdlib"]`, sorted by path, test folders left out. Which bytes those are depends
on the Python build, so every run records each file's SHA-256 and one hash of the whole list.

Islands are non-IID by construction: family f goes to island f mod n, so with nine islands each trains on
one family alone (asyncio code, email code, tkinter code...); with a seed, the families are first put in
that seed's random order, so which city trains on which family varies with the seed too. The validation
split is common to all: the last tenth of every file's bytes, which no island trains on; its loss is the
mean over families of the mean next-byte cross-entropy on a fixed set of windows spread evenly over each
family's held-out bytes.

The islands' models are stacked (torch.func.stack_module_state) and trained in one batched step
(torch.func.functional_call under torch.vmap), each with its own AdamW state; one island's flattened
parameters, in `named_parameters` order, are the vector an averager would send for the same nn.Module.
"""

from __future__ import annotations

import functools
import hashlib
import math
import pathlib
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

FAMILIES = (
    ("asyncio", ("asyncio",)),
    ("email", ("email", "mailbox", "smtplib", "imaplib", "poplib", "mimetypes")),
    ("markup", ("xml", "html")),
    ("web", ("http", "urllib", "xmlrpc", "wsgiref", "socketserver", "ftplib")),
    ("concurrency", ("multiprocessing", "concurrent", "threading", "queue", "subprocess", "sched", "selectors")),
    ("imports", ("importlib", "pkgutil", "zipimport", "runpy", "modulefinder", "zipfile")),
    ("tkinter", ("tkinter", "turtle")),
    ("debugging", ("unittest", "doctest", "pdb", "bdb", "trace", "cProfile", "profile", "pstats", "timeit")),
    ("text", ("json", "csv", "re", "string", "textwrap", "difflib", "pprint", "argparse", "configparser", "shlex")),
)
"""Module families: top-level packages (every `*.py` below them) or modules of the standard library."""
SKIPPED_FOLDERS = frozenset({"test", "tests", "idle_test"})
"""Test suites are left out: their fixtures and long literal tables are not the families' own code."""
VALIDATION_FRACTION = 0.1
VALIDATION_WINDOWS = 8
"""Windows per family in the validation batch (fixed offsets, the same for every run)."""
VOCABULARY = 256


def family_files(names: Iterable[str], root: str | pathlib.Path | None = None) -> list[pathlib.Path]:
    """The family's files, sorted by their path relative to the standard library."""
    folder = pathlib.Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for name in names:
        if (folder / name).is_dir():
            files += [path for path in (folder / name).rglob("*.py")
                      if not SKIPPED_FOLDERS & set(path.relative_to(folder).parts)]
        elif (folder / f"{name}.py").is_file():
            files.append(folder / f"{name}.py")
    return sorted(files, key=lambda path: path.relative_to(folder).as_posix())


@dataclass(frozen=True)
class Corpus:
    root: str
    families: tuple[tuple[str, bytes, bytes], ...]
    """Per family: (name, training bytes, validation bytes)."""
    files: tuple[tuple[str, str, int, str], ...]
    """(family, path relative to the standard library, bytes, SHA-256) of every file, in order."""

    @property
    def list_sha256(self) -> str:
        """One hash of the file list with every file's size and hash: equal lists, equal corpora."""
        text = "".join(f"{family}\t{path}\t{size}\t{digest}\n" for family, path, size, digest in self.files)
        return hashlib.sha256(text.encode()).hexdigest()

    def describe(self) -> dict[str, Any]:
        return {"root": self.root, "list_sha256": self.list_sha256,
                "validation_fraction": VALIDATION_FRACTION,
                "families": {name: {"train_bytes": len(train), "validation_bytes": len(validation)}
                             for name, train, validation in self.families},
                "files": [{"family": family, "path": path, "bytes": size, "sha256": digest}
                          for family, path, size, digest in self.files]}


@functools.lru_cache(maxsize=4)
def load_corpus(root: str | pathlib.Path | None = None) -> Corpus:
    """Every family's bytes, each file split into its first nine tenths (training) and last tenth
    (validation)."""
    folder = pathlib.Path(root or sysconfig.get_paths()["stdlib"])
    families: list[tuple[str, bytes, bytes]] = []
    files: list[tuple[str, str, int, str]] = []
    for name, modules in FAMILIES:
        train, validation = bytearray(), bytearray()
        for path in family_files(modules, folder):
            data = path.read_bytes()
            cut = len(data) - int(len(data) * VALIDATION_FRACTION)
            train += data[:cut]
            validation += data[cut:]
            files.append((name, path.relative_to(folder).as_posix(), len(data), hashlib.sha256(data).hexdigest()))
        if not train:
            raise ValueError(f"the standard library at {folder} has none of the files of family {name!r}: "
                             f"{', '.join(modules)}")
        families.append((name, bytes(train), bytes(validation)))
    return Corpus(str(folder), tuple(families), tuple(files))


def island_families(islands_count: int, seed: int | None = None) -> list[list[str]]:
    """Family names per island: family f trains island f mod n (disjoint; with n > 9 some islands get none),
    the families in their listed order, or with a seed in that seed's permutation of it."""
    names = [name for name, _ in FAMILIES]
    if seed is not None:
        names = [names[i] for i in np.random.default_rng(seed).permutation(len(names))]
    return [[name for f, name in enumerate(names) if f % islands_count == i] for i in range(islands_count)]


# ---------------------------------------------------------------------------------------------------
# The model

def build_model(width: int, layers: int, heads: int, context: int) -> torch.nn.Module:
    """A GPT-style decoder: byte and position embeddings, pre-norm blocks of causal self-attention and a 4x
    GELU MLP, a final norm and an untied output layer."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            t = x.shape[-2]
            q, k, v = self.qkv(self.norm1(x)).reshape(-1, t, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
            # Attention written out: it runs under vmap on every torch build.
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(width // heads)
            attention = torch.softmax(scores.masked_fill(mask[:t, :t], float("-inf")), dim=-1) @ v
            x = x + self.proj(attention.transpose(1, 2).reshape(-1, t, width))
            return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))

    class Decoder(nn.Module):
        mask: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.embed, self.position = nn.Embedding(VOCABULARY, width), nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, VOCABULARY)
            self.register_buffer("mask", torch.ones(context, context, dtype=torch.bool).triu(1), persistent=False)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() > 1:
                    # GPT-2's initialization: residual projections shrunk with depth.
                    scaled = name.endswith(("proj.weight", "down.weight"))
                    nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers) if scaled else 0.02)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embed(tokens) + self.position.weight[:tokens.shape[-1]]
            for block in self.blocks:
                x = block(x, self.mask)
            return self.head(self.norm(x))

    if width % heads:
        raise ValueError(f"the width ({width}) must be a multiple of the heads ({heads})")
    return Decoder()


def parameter_count(width: int, layers: int, context: int) -> int:
    """Parameters of build_model(width, layers, heads, context), counted from its layers."""
    block = 2 * 2 * width + (3 * width * width + 3 * width) + (width * width + width) + 2 * (4 * width * width) \
        + 4 * width + width
    return VOCABULARY * width + context * width + layers * block + 2 * width + width * VOCABULARY + VOCABULARY


class TextSettings(Protocol):
    """What `TextIslands` reads of its configuration (`training.TrainConfig`, which imports this module, or
    the training cache's key)."""

    @property
    def seed(self) -> int: ...
    @property
    def text_width(self) -> int: ...
    @property
    def text_layers(self) -> int: ...
    @property
    def text_heads(self) -> int: ...
    @property
    def text_context(self) -> int: ...
    @property
    def text_batch(self) -> int: ...
    @property
    def text_learning_rate(self) -> float: ...
    @property
    def text_weight_decay(self) -> float: ...
    @property
    def text_shuffle_families(self) -> bool: ...


class TextIslands:
    """n copies of one decoder, stacked; each island samples windows of its own families' training bytes."""

    def __init__(self, n: int, config: TextSettings) -> None:
        import torch

        self.n, self.context, self.batch = n, config.text_context, config.text_batch
        torch.manual_seed(config.seed)
        self.base = build_model(config.text_width, config.text_layers, config.text_heads, config.text_context)
        params, _ = torch.func.stack_module_state([self.base] * n)
        self.params = {name: p.detach().clone().requires_grad_() for name, p in params.items()}
        decayed = [p for p in self.params.values() if p.dim() > 2]
        kept = [p for p in self.params.values() if p.dim() <= 2]
        self.optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": config.text_weight_decay},
                                            {"params": kept, "weight_decay": 0.0}],
                                           lr=config.text_learning_rate, betas=(0.9, 0.95))
        corpus = load_corpus()
        by_name = {name: (train, validation) for name, train, validation in corpus.families}
        self.streams = [torch.frombuffer(bytearray(b"".join(by_name[f][0] for f in families)), dtype=torch.uint8)
                        for families in island_families(n, config.seed if config.text_shuffle_families else None)]
        self.generators = [torch.Generator().manual_seed(config.seed * 1000 + i) for i in range(n)]
        windows = []
        for _, _, validation in corpus.families:
            data = torch.frombuffer(bytearray(validation), dtype=torch.uint8)
            for start in np.linspace(0, len(data) - self.context - 1, VALIDATION_WINDOWS).astype(np.int64):
                windows.append(data[int(start):int(start) + self.context + 1])
        self.validation = torch.stack(windows).long()
        self._losses = torch.vmap(self._loss)

    def _loss(self, params: dict[str, torch.Tensor], windows: torch.Tensor) -> torch.Tensor:
        import torch

        logits = torch.func.functional_call(self.base, params, (windows[..., :-1],))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCABULARY), windows[..., 1:].reshape(-1))

    def step(self) -> None:
        """One AdamW step of every island on a batch of its own windows."""
        import torch

        batches = []
        for stream, generator in zip(self.streams, self.generators):
            if len(stream) <= self.context:
                batches.append(torch.zeros(self.batch, self.context + 1, dtype=torch.uint8))
                continue
            starts = torch.randint(len(stream) - self.context, (self.batch,), generator=generator)
            batches.append(stream[starts.unsqueeze(1) + torch.arange(self.context + 1)])
        has_data = torch.tensor([len(s) > self.context for s in self.streams], dtype=torch.float32)
        losses = self._losses(self.params, torch.stack(batches).long())
        self.optimizer.zero_grad()
        # Per-island mean losses summed: each island gets exactly its own gradient; islands without data idle.
        (losses * has_data).sum().backward()
        self.optimizer.step()

    def evaluate(self) -> dict[str, float]:
        """Mean island validation loss, the best single island's, and the validation loss of the islands' exact
        mean model."""
        import torch

        with torch.no_grad():
            windows = self.validation.unsqueeze(0).expand(self.n, -1, -1)
            losses = self._losses(self.params, windows)
            mean = {name: p.mean(0) for name, p in self.params.items()}
            averaged = self._loss(mean, self.validation)
        return {"loss": float(losses.mean()), "best_island_loss": float(losses.min()), "averaged_loss": float(averaged)}

    def vectors(self) -> np.ndarray:
        """(n, parameters) float32 array, each row one island's parameters in named_parameters order."""
        return np.concatenate([p.detach().reshape(self.n, -1).numpy() for p in self.params.values()], axis=1)

    def load(self, index: int, vector: np.ndarray) -> None:
        import torch

        offset = 0
        with torch.no_grad():
            for p in self.params.values():
                size = p[index].numel()
                p[index].copy_(torch.from_numpy(vector[offset:offset + size]).reshape(p[index].shape))
                offset += size
