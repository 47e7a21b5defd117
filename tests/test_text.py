"""Tests of task.text: Tiny Shakespeare vocabulary, blocks, partitions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from task import locate, text
from task.builtin import load_task_data
from task.data import client_data

CORPUS = locate.SHARED_DATA_DIR / "tinyshakespeare" / "input.txt"
needs_corpus = pytest.mark.skipif(not CORPUS.is_file(),
                                  reason="shared Tiny Shakespeare copy not available")


def _runs(indices: np.ndarray) -> int:
    """Number of maximal contiguous runs in a sorted index array."""
    return 1 + int(np.sum(np.diff(indices) != 1)) if len(indices) else 0


# ---------------------------------------------------------------- corpus


@needs_corpus
def test_vocab_and_split():
    corpus = text.load_corpus(CORPUS)
    assert corpus.vocab_size == 65
    assert corpus.vocab == "".join(sorted(corpus.vocab))
    assert corpus.vocab[0] == "\n" and corpus.vocab[-1] == "z"
    n = len(corpus.train_ids) + len(corpus.test_ids)
    assert n == 1_115_394
    assert len(corpus.train_ids) == int(0.9 * n)
    assert corpus.train_ids.dtype == np.int64
    assert text.decode(corpus.train_ids[:14], corpus.vocab) == "First Citizen:"
    raw = CORPUS.read_text(encoding="utf-8")
    assert text.decode(corpus.test_ids, corpus.vocab) == raw[len(corpus.train_ids):]


def test_encode_decode_roundtrip_and_errors():
    vocab = text.build_vocab("hello world")
    assert vocab == " dehlorw"
    ids = text.encode("hello", vocab)
    assert ids.dtype == np.int64 and ids.tolist() == [3, 2, 4, 4, 5]
    assert text.decode(ids, vocab) == "hello"
    with pytest.raises(ValueError, match="'z'"):
        text.encode("zz", vocab)
    with pytest.raises(ValueError, match="empty"):
        text.build_vocab("")


def test_blocks_shift_by_one():
    ids = np.arange(100)
    x, y = text.blocks(ids, 8)
    assert x.shape == y.shape == (12, 8)  # (100 - 1) // 8
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(y, x + 1)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(x[1:, 0], y[:-1, -1])  # consecutive, non-overlapping
    assert x[1, 0] == 8  # stride = block size
    with pytest.raises(ValueError, match="block-size=0"):
        text.blocks(ids, 0)
    with pytest.raises(ValueError, match="too long"):
        text.blocks(ids, 100)


@needs_corpus
def test_load_task_data_text(offline):
    task = load_task_data("shakespeare", block_size=32)
    assert task.kind == "text" and task.num_classes == 65
    assert task.train_x.shape == ((1_003_854 - 1) // 32, 32)
    assert task.test_x.shape == ((111_540 - 1) // 32, 32)
    assert task.train_x.dtype == task.train_y.dtype == torch.int64
    assert torch.equal(task.train_x[:, 1:], task.train_y[:, :-1])
    assert load_task_data("shakespeare", None, 32) is task
    assert load_task_data("shakespeare").train_x.shape[1] == 64
    x, y = client_data(task, 0, 50, "noniid", 0)
    assert x.shape[1] == y.shape[1] == 32 and len(x) >= 2
    sizes = [len(client_data(task, i, 50, "noniid", 0)[0]) for i in range(50)]
    assert sum(sizes) == len(task.train_x)
    assert max(sizes) > 5 * min(sizes)  # unbalanced


# ---------------------------------------------------------------- partitions


def test_partition_text_iid():
    parts = text.partition_text(1003, 10, "iid", seed=0)
    assert [len(p) for p in parts] == [100] * 10
    assert all(_runs(p) == 1 for p in parts)  # contiguous
    union = np.concatenate(parts)
    assert np.array_equal(np.sort(union), np.arange(1000))
    starts = [int(p[0]) for p in parts]
    assert starts != sorted(starts)  # parts shuffled over clients
    again = text.partition_text(1003, 10, "iid", seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_partition_text_noniid_two_buckets_unbalanced():
    n, clients = 15_685, 100
    parts = text.partition_text(n, clients, "noniid", seed=0)
    union = np.concatenate(parts)
    assert union.dtype == np.int64
    assert np.array_equal(np.sort(union), np.arange(n))  # every block exactly once
    assert all(1 <= _runs(p) <= 2 and len(p) >= 2 for p in parts)
    # Rebuild the 2C buckets from the client runs: two per client, unless the
    # two buckets of a client happen to be adjacent (then they form one run).
    assert sum(_runs(p) for p in parts) <= 2 * clients
    sizes = np.array([len(p) for p in parts])
    assert sizes.max() > 10 * sizes.min()
    again = text.partition_text(n, clients, "noniid", seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = text.partition_text(n, clients, "noniid", seed=1)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


@settings(max_examples=50, deadline=None, derandomize=True)
@given(n=st.integers(1, 3000), clients=st.integers(1, 60),
       seed=st.integers(0, 2**32 - 1), scheme=st.sampled_from(["iid", "noniid"]))
def test_partition_text_property(n, clients, seed, scheme):
    need = clients if scheme == "iid" else 2 * clients
    if n < need:
        with pytest.raises(ValueError, match=f"num-clients={clients}"):
            text.partition_text(n, clients, scheme, seed)
        return
    parts = text.partition_text(n, clients, scheme, seed)
    assert len(parts) == clients
    union = np.concatenate(parts)
    assert len(np.unique(union)) == len(union)
    if scheme == "iid":
        assert {len(p) for p in parts} == {n // clients}
    else:
        assert np.array_equal(np.sort(union), np.arange(n))
        assert all(len(p) >= 2 and _runs(p) <= 2 for p in parts)


def test_partition_text_bad_args():
    with pytest.raises(ValueError, match="partition='dirichlet'"):
        text.partition_text(100, 10, "dirichlet", 0)
    with pytest.raises(ValueError, match="num-clients=0"):
        text.partition_text(100, 0, "iid", 0)
    with pytest.raises(ValueError, match="num-clients=60"):
        text.partition_text(100, 60, "noniid", 0)
