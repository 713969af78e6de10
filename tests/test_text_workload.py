"""The study's text workload: the standard-library corpus and its hashes, the islands' module families, the
stacked transformer, and reruns that agree byte for byte."""

import hashlib
import json
import pathlib
import sysconfig

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inwire.cli import main  # noqa: E402
from inwire.train import text  # noqa: E402
from inwire.train.training import TrainConfig, _simulate_cached, plan_strategies  # noqa: E402

TINY = ["--workload", "text", "--islands", "LON,AMS,FRA", "--steps", "20", "--local-steps", "10",
        "--strategies", "none,global,schedule", "--model-mb", "100", "--text-width", "16", "--text-layers", "1",
        "--text-context", "16", "--text-batch", "2"]


def test_corpus_is_a_sorted_documented_file_list_with_every_hash_recorded():
    corpus = text.load_corpus()
    root = sysconfig.get_paths()["stdlib"]
    assert [name for name, _, _ in corpus.families] == [name for name, _ in text.FAMILIES]
    for name, modules in text.FAMILIES:
        paths = [path for family, path, _, _ in corpus.files if family == name]
        assert paths == sorted(paths) and paths, name
        assert paths == [p.relative_to(root).as_posix() for p in text.family_files(modules)]
        assert not any({"test", "tests", "idle_test"} & set(path.split("/")) for path in paths)
    for _, path, size, digest in corpus.files[::20]:
        data = (pathlib.Path(root) / path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest and len(data) == size
    # Training and validation bytes: each file's first nine tenths and last tenth, nothing else.
    for name, train, validation in corpus.families:
        sizes = [size for family, _, size, _ in corpus.files if family == name]
        assert len(train) + len(validation) == sum(sizes)
        assert len(validation) == sum(int(size * text.VALIDATION_FRACTION) for size in sizes)
    text.load_corpus.cache_clear()
    assert text.load_corpus().list_sha256 == corpus.list_sha256


def test_the_list_hash_changes_with_any_byte_of_any_file(tmp_path):
    """A made-up standard library: one module per family, asyncio a package with a test folder."""
    for _, modules in text.FAMILIES[1:]:
        (tmp_path / f"{modules[0]}.py").write_text(f"import {modules[0]}\n" * 40)
    (tmp_path / "asyncio" / "test").mkdir(parents=True)
    (tmp_path / "asyncio" / "events.py").write_text("loop = None\n" * 40)
    (tmp_path / "asyncio" / "test" / "test_events.py").write_text("skipped = True\n")
    first = text.load_corpus(str(tmp_path))
    assert first.root == str(tmp_path) and len(first.files) == len(text.FAMILIES)
    assert first.files[0][1] == "asyncio/events.py", "test folders are left out"
    (tmp_path / "email.py").write_text("import email\n" * 39 + "import emaiL\n")
    text.load_corpus.cache_clear()
    second = text.load_corpus(str(tmp_path))
    assert second.list_sha256 != first.list_sha256
    assert [f[3] for f in second.files if f[0] != "email"] == [f[3] for f in first.files if f[0] != "email"]


def test_islands_train_on_disjoint_module_families():
    for n in (9, 4, 3):
        assigned = text.island_families(n)
        flat = [family for families in assigned for family in families]
        assert sorted(flat) == sorted(name for name, _ in text.FAMILIES) and len(set(flat)) == len(flat), n
    assert text.island_families(9) == [[name] for name, _ in text.FAMILIES]
    files = {}
    for name, modules in text.FAMILIES:
        for path in text.family_files(modules):
            assert path not in files, f"{path} in both {files.get(path)} and {name}"
            files[path] = name


def test_one_islands_vector_is_the_module_s_parameters_and_its_loss_the_module_s_loss():
    config = TrainConfig(workload="text", text_width=16, text_layers=2, text_heads=2, text_context=16, text_batch=2)
    islands = text.TextIslands(3, config)
    for _ in range(2):
        islands.step()
    vector = islands.vectors()[1]
    module = text.build_model(16, 2, 2, 16)
    assert vector.size == sum(p.numel() for p in module.parameters()) == text.parameter_count(16, 2, 16)
    offset = 0
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.from_numpy(vector[offset:offset + p.numel()]).reshape(p.shape))
            offset += p.numel()
        windows = islands.validation
        logits = module(windows[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), windows[:, 1:].reshape(-1))
        stacked = torch.vmap(islands._loss)(islands.params, windows.unsqueeze(0).expand(3, -1, -1))
    assert float(stacked[1]) == pytest.approx(float(loss), abs=1e-5)
    islands.load(0, vector)
    assert np.array_equal(islands.vectors()[0], vector)


def test_a_rerun_writes_byte_identical_json(tmp_path, capsys):
    outputs = []
    for run in ("first", "second"):
        _simulate_cached.cache_clear()
        plan_strategies.cache_clear()
        assert main(["train", *TINY, "--out-dir", str(tmp_path / run)]) == 0
        outputs.append((tmp_path / run / "study.json").read_bytes())
    capsys.readouterr()
    assert outputs[0] == outputs[1]
    study = json.loads(outputs[0])
    assert study["workload"] == "text" and study["corpus"]["list_sha256"] == text.load_corpus().list_sha256
    assert study["corpus"]["island_families"] == text.island_families(3)
    assert len(study["corpus"]["files"]) == len(text.load_corpus().files)
    (cell,) = study["cells"]
    assert cell["outer_momentum"] == 0.9, "the text workload's outer step is DiLoCo's Nesterov"
    summary = cell["summary"]["global"]
    assert summary["perplexity"]["mean"] == pytest.approx(np.exp(summary["loss"]["mean"]))
    assert (tmp_path / "first" / "ideal-text-100mb-100ms-nesterov.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("extra", [["--alpha", "0.3"], ["--text-width", "18"], ["--target-loss", "0"]])
def test_text_settings_are_checked_in_one_line(extra, capsys, tmp_path):
    assert main(["train", *TINY, *extra, "--out-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("inwire train: ") and error.count("\n") == 1
