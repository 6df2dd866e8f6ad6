"""Batch sampling from token files: windows, shifted targets, epochs, resumable position, split."""

import numpy as np
import pytest
import torch

from scratchlm.data.batches import SequentialBatches, get_batch, iter_epoch, step_starts, train_val_split
from scratchlm.data.token_file import open_token_file, write_token_file


def test_get_batch_windows_are_slices_and_targets_shift(tmp_path):
    write_token_file(tmp_path / "a.bin", [np.arange(1000)[::-1]], 1000)  # value at i is 999 - i
    data = open_token_file(tmp_path / "a.bin")
    x, y = get_batch(data, 8, 32, torch.Generator().manual_seed(0))
    assert x.dtype == torch.int64 and x.shape == (8, 32)
    starts = 999 - x[:, 0]
    assert len(set(starts.tolist())) > 1 and int(starts.max()) <= 1000 - 33
    for s, row_x, row_y in zip(starts.tolist(), x, y):
        assert torch.equal(row_x, torch.as_tensor(np.asarray(data[s: s + 32], dtype=np.int64)))
        assert torch.equal(row_y, torch.as_tensor(np.asarray(data[s + 1: s + 33], dtype=np.int64)))
    assert torch.equal(step_starts(1000, 5, 32, 1, 7), step_starts(1000, 5, 32, 1, 7))
    assert not torch.equal(step_starts(1000, 5, 32, 1, 7), step_starts(1000, 5, 32, 1, 8))


def test_too_short_data_raises_with_sizes():
    with pytest.raises(ValueError, match="has 16 tokens but seq_len=16 needs at least 17"):
        get_batch(np.arange(16), 2, 16)
    with pytest.raises(ValueError, match="has 0 tokens"):
        SequentialBatches(np.zeros(0, dtype=np.uint16), 4)


def test_sequential_epochs_cover_every_window_once_and_resume():
    data = np.arange(101)
    it = SequentialBatches(data, seq_len=10, seed=3)
    first_epoch = sorted(it.next_starts(10).tolist())
    assert first_epoch == list(range(0, 100, 10))
    it.next_starts(3)
    saved = it.state_dict()
    expected = it.next_starts(12)  # crosses into epoch 2
    again = SequentialBatches(data, seq_len=10, seed=3)
    again.load_state_dict(saved)
    assert saved == {"epoch": 1, "cursor": 3}
    assert torch.equal(again.next_starts(12), expected)
    x, y = it.next_batch(2)
    assert torch.equal(y[:, :-1], x[:, 1:])


def test_iter_epoch_and_split():
    data = np.arange(95)
    batches = list(iter_epoch(data, batch_size=4, seq_len=10))
    xs = torch.cat([x for x, _ in batches])
    assert xs[:, 0].tolist() == list(range(0, 85, 10))  # windows [0,11) .. [80,91); [90,101) does not fit
    train, val = train_val_split(data, 0.1)
    assert len(train) == 85 and val[0] == 85 and len(val) == 10
    with pytest.raises(ValueError, match="val_fraction"):
        train_val_split(data, 0.0)
