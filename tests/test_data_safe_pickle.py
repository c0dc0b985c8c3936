"""Tests for sfg.world.data.safe_pickle: CIFAR pickles load, code-executing pickles are refused."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from sfg.errors import SfgError
from sfg.world.data.safe_pickle import load_cifar_pickle


class _Evil:
    """Unpickling this would run a shell command that creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_reduce_to_os_system_is_refused_and_nothing_runs(tmp_path, protocol):
    marker = tmp_path / "executed"
    blob = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [_Evil(marker)]},
                        protocol=protocol)
    # control: the standard unpickler really would run the command
    with pytest.raises(SfgError) as info:
        load_cifar_pickle(blob, source="data_batch_1")
    msg = str(info.value)
    assert f"refusing to unpickle {os.system.__module__}.system from data_batch_1" in msg
    assert "CIFAR archives contain only arrays, lists, dicts and strings" in msg
    assert not marker.exists()


def test_the_control_pickle_does_execute_with_plain_pickle(tmp_path):
    marker = tmp_path / "executed"
    pickle.loads(pickle.dumps(_Evil(marker)))
    assert marker.exists()  # so the refusal above is meaningful


@pytest.mark.parametrize("blob, name", [
    (b"cos\nsystem\n(S'echo hi'\ntR.", "os.system"),  # protocol 0, written by hand
    (b"cbuiltins\neval\n(S'1+1'\ntR.", "builtins.eval"),
    (b"csubprocess\nPopen\n(S'true'\ntR.", "subprocess.Popen"),
    (b"cnumpy\nload\n(S'x.npy'\ntR.", "numpy.load"),
    (b"ccopyreg\n_reconstructor\n(tR.", "copyreg._reconstructor"),
])
def test_hand_written_globals_are_refused(blob, name):
    with pytest.raises(SfgError, match=f"refusing to unpickle {name} from f.pkl"):
        load_cifar_pickle(blob, source="f.pkl")


def test_persistent_ids_are_refused():
    with pytest.raises(SfgError, match="refusing persistent id"):
        load_cifar_pickle(b"\x80\x02X\x01\x00\x00\x00aQ.", source="f.pkl")


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_cifar_batches_round_trip(protocol):
    data = np.arange(2 * 3072, dtype=np.int64).astype(np.uint8).reshape(2, 3072)
    batch = {b"batch_label": b"training batch 1 of 5", b"labels": [3, 9],
             b"data": data, b"filenames": [b"a.png", b"b.png"], "scalar": np.int64(7)}
    out = load_cifar_pickle(pickle.dumps(batch, protocol=protocol), source="b")
    np.testing.assert_array_equal(out[b"data"], data)
    assert out[b"data"].dtype == np.uint8
    assert out[b"labels"] == [3, 9] and out[b"filenames"] == [b"a.png", b"b.png"]
    assert out["scalar"] == 7


def test_garbage_is_a_clear_error():
    with pytest.raises(SfgError, match="cannot read junk as a CIFAR python pickle"):
        load_cifar_pickle(b"not a pickle at all", source="junk")
    with pytest.raises(SfgError, match="cannot read cut as a CIFAR python pickle"):
        load_cifar_pickle(pickle.dumps({b"data": [1, 2, 3]})[:-5], source="cut")
