"""Checkpoints and atomic writes: safe loading (weights_only), clear errors, umask, exact RNG restore."""

from __future__ import annotations

import os
import random
import stat

import numpy as np
import pytest
import torch
from torch import nn

from pyrobnn import BayesianNetwork, NormalGuide
from pyrobnn.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from pyrobnn.data import two_moons
from pyrobnn.files import atomic_write, check_writable, write_json
from pyrobnn.infer.svi import Checkpoint, fit


@pytest.fixture
def umask():
    """Set the process umask for one test, then put the old one back."""
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _small_run(tmp_path, epochs=1):
    torch.manual_seed(0)
    moons = two_moons(n=120, n_train=60, seed=0)
    model = BayesianNetwork(nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2)), num_data=60)
    guide = NormalGuide(model)
    path = tmp_path / "run" / "checkpoint.pt"
    fit(model, guide, moons.x_train, moons.y_train, epochs=epochs, batch_size=30, device="cpu", progress=False,
        checkpoint=Checkpoint(path, config={"note": "test"}))
    return path


# ----------------------------------------------------------------------------- safe loading


def test_checkpoint_of_fit_loads_with_weights_only(tmp_path):
    path = _small_run(tmp_path)
    raw = torch.load(path, weights_only=True)  # no pickled objects: plain torch.load accepts it too
    assert raw["epoch"] == 0 and isinstance(raw["rng"]["numpy"]["keys"], torch.Tensor)
    state = load_checkpoint(path)
    assert set(state) >= {"model", "guide", "optimizer", "scheduler", "epoch", "history", "rng", "config"}


class _Payload:
    """Unpickling it would create a file: proof that code ran."""

    marker = None

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_checkpoint_with_a_pickled_object_is_refused_without_running_it(tmp_path):
    path = _small_run(tmp_path)
    marker = tmp_path / "code-ran"
    payload = _Payload()
    payload.marker = marker
    state = torch.load(path, weights_only=True)
    evil = tmp_path / "evil.pt"
    torch.save({**state, "extra": payload}, evil)
    with pytest.raises(ValueError) as info:
        load_checkpoint(evil)
    message = str(info.value)
    assert "\n" not in message and str(evil) in message and "refused" in message
    assert "builtins.open" in message or "pickled" in message
    assert not marker.exists()
    # only a caller who trusts the file may load it anyway
    load_checkpoint(evil, trusted=True)
    assert marker.exists()


@pytest.mark.parametrize("kind", ["truncated", "random-bytes", "empty", "directory", "not-a-dict", "no-guide"])
def test_unreadable_checkpoints_are_one_line_value_errors(tmp_path, kind):
    good = _small_run(tmp_path)
    path = tmp_path / "bad.pt"
    if kind == "truncated":
        path.write_bytes(good.read_bytes()[:-200])
    elif kind == "random-bytes":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    elif kind == "not-a-dict":
        torch.save(torch.zeros(3), path)
    else:
        torch.save({"model": {}, "epoch": 0}, path)
    with pytest.raises(ValueError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    if kind in ("not-a-dict", "no-guide"):
        assert "not a pyrobnn checkpoint" in message


def test_missing_checkpoint_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nothing.pt")


# ----------------------------------------------------------------------------- RNG state


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    np.random.standard_normal()  # a cached Gaussian is part of NumPy's state
    path = save_checkpoint(tmp_path / "rng.pt", {"model": {}, "guide": {}, "epoch": 0, "rng": rng_state()})
    expected = (torch.rand(5), np.random.standard_normal(5), [random.random() for _ in range(5)])
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    set_rng_state(load_checkpoint(path)["rng"])
    assert torch.equal(torch.rand(5), expected[0])
    assert np.array_equal(np.random.standard_normal(5), expected[1])
    assert [random.random() for _ in range(5)] == expected[2]


def test_set_rng_state_accepts_the_numpy_tuple_of_older_checkpoints():
    np.random.seed(5)
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    expected = np.random.random_sample(3)
    np.random.seed(6)
    set_rng_state(state)
    assert np.array_equal(np.random.random_sample(3), expected)


# ----------------------------------------------------------------------------- atomic writes


def test_atomic_write_respects_the_umask(tmp_path, umask):
    for mask, mode in ((0o022, 0o644), (0o027, 0o640), (0o002, 0o664)):
        umask(mask)
        target = tmp_path / f"out{mask:o}"
        assert _mode(atomic_write(target / "a.bin", b"x")) == mode
        assert _mode(write_json(target / "m.json", {"a": 1})) == mode
        assert _mode(save_checkpoint(target / "c.pt", {"model": {}, "guide": {}, "epoch": 0})) == mode


def test_atomic_write_content_kinds_and_no_leftovers(tmp_path):
    target = tmp_path / "sub" / "f"
    atomic_write(target, "text é")
    assert target.read_text(encoding="utf-8") == "text é"
    atomic_write(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    atomic_write(target, lambda f: f.write(b"callable"))
    assert target.read_bytes() == b"callable"
    assert os.listdir(target.parent) == ["f"]


def test_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "f.json"
    write_json(target, {"old": True})

    def fail(f):
        f.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(target, fail)
    assert target.read_text() == '{\n  "old": true\n}\n'
    assert os.listdir(tmp_path) == ["f.json"]
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path, b"x")


def test_check_writable(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    assert check_writable(tmp_path / "new" / "dir", "--out", directory=True) == tmp_path / "new" / "dir"
    assert not (tmp_path / "new").exists()  # nothing created
    with pytest.raises(ValueError, match="exists and is not a directory"):
        check_writable(afile, "--out", directory=True)
    with pytest.raises(ValueError, match="not a directory"):
        check_writable(afile / "below", "--json")
    with pytest.raises(ValueError, match="is a directory"):
        check_writable(tmp_path, "--json")
