"""Tiny Shakespeare as a character-level language-modelling task.

The corpus is one UTF-8 file (``tinyshakespeare/input.txt``, 1,115,394
characters, from ``karpathy/char-rnn``).  Its vocabulary is the sorted set of
distinct characters of the *whole* file: **65 characters** (newline, space,
punctuation, digits ``3``, upper- and lower-case letters), so character ids are
``0 .. 64``.  The first 90% of the text is the training text and the last 10%
the test text, never seen in training.  Both are cut into non-overlapping
blocks of ``block_size`` characters (stride = ``block_size``); the target of a
block is the same block shifted by one character (next-character prediction).

Federated partitions are over training *blocks* (not over labels as for the
image datasets, see :func:`partition_text`):

- ``iid``: the block sequence cut into ``C`` equal contiguous parts, parts
  shuffled over the clients;
- ``noniid``: the block sequence cut into ``2 C`` contiguous buckets of
  skewed, log-normally distributed sizes, two random buckets per client, so
  clients hold different amounts of text from different parts of the plays.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

TEXT_SCHEMES = ("iid", "noniid")  # task.data maps every non-IID scheme to "noniid"

TRAIN_FRACTION = 0.9
"""Fraction of the text (from its start) used for training; the rest is test."""


@dataclass(frozen=True, eq=False)
class CharCorpus:
    """An encoded character corpus split into training and test text.

    Attributes
    ----------
    vocab : str
        The sorted distinct characters; character ``vocab[i]`` has id ``i``.
    train_ids : np.ndarray
        int64, shape (n_train,): ids of the first ``TRAIN_FRACTION`` of the text.
    test_ids : np.ndarray
        int64, shape (n_test,): ids of the remaining text.
    """

    vocab: str
    train_ids: np.ndarray
    test_ids: np.ndarray

    @property
    def vocab_size(self) -> int:
        """Number of distinct characters (65 for Tiny Shakespeare)."""
        return len(self.vocab)


def build_vocab(text: str) -> str:
    """Return the sorted distinct characters of ``text``.

    Parameters
    ----------
    text : str
        The whole corpus.

    Returns
    -------
    str
        Sorted distinct characters; position = character id.

    Raises
    ------
    ValueError
        If ``text`` is empty.
    """
    if not text:
        raise ValueError("text is empty: cannot build a vocabulary")
    return "".join(sorted(set(text)))


def encode(text: str, vocab: str) -> np.ndarray:
    """Map characters to ids.

    Parameters
    ----------
    text : str
        Text to encode.
    vocab : str
        Sorted vocabulary from :func:`build_vocab`.

    Returns
    -------
    np.ndarray
        int64, shape (len(text),).

    Raises
    ------
    ValueError
        If ``text`` has a character outside ``vocab``.
    """
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    table = np.frombuffer(vocab.encode("utf-32-le"), dtype=np.uint32)
    ids = np.searchsorted(table, codes)
    bad = (ids >= len(table)) | (table[np.minimum(ids, len(table) - 1)] != codes)
    if bad.any():
        char = chr(int(codes[np.argmax(bad)]))
        raise ValueError(f"character {char!r} is not in the vocabulary")
    return ids.astype(np.int64)


def decode(ids: np.ndarray | torch.Tensor, vocab: str) -> str:
    """Map ids (any shape, flattened) back to text.

    Parameters
    ----------
    ids : np.ndarray or torch.Tensor
        Integer ids in ``[0, len(vocab))``.
    vocab : str
        The vocabulary.

    Returns
    -------
    str
    """
    return "".join(vocab[int(i)] for i in np.asarray(ids).reshape(-1))


def load_corpus(path: str | Path, train_fraction: float = TRAIN_FRACTION) -> CharCorpus:
    """Read, encode and split a text file.

    Parameters
    ----------
    path : str or Path
        A UTF-8 text file (``tinyshakespeare/input.txt``).
    train_fraction : float
        Leading fraction of the text used for training, in (0, 1).

    Returns
    -------
    CharCorpus
        Vocabulary of the whole file; train = first ``int(train_fraction * n)``
        characters, test = the rest.

    Raises
    ------
    ValueError
        If ``train_fraction`` is not in (0, 1) or the file is empty.
    FileNotFoundError
        If ``path`` does not exist.
    """
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction={train_fraction!r} must be in (0, 1)")
    text = Path(path).read_text(encoding="utf-8")
    vocab = build_vocab(text)
    ids = encode(text, vocab)
    n_train = int(train_fraction * len(ids))
    return CharCorpus(vocab=vocab, train_ids=ids[:n_train], test_ids=ids[n_train:])


def blocks(ids: np.ndarray, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut a sequence into non-overlapping next-character prediction pairs.

    Block ``i`` is ``x[i] = ids[i*T : i*T + T]`` and ``y[i] = ids[i*T + 1 :
    i*T + T + 1]`` with ``T = block_size`` (stride ``T``); the incomplete tail
    is dropped.

    Parameters
    ----------
    ids : np.ndarray
        Integer ids, shape (n,).
    block_size : int
        Block length ``T`` >= 1.

    Returns
    -------
    x, y : torch.Tensor
        int64, shape (N, T) with ``N = (n - 1) // T``.

    Raises
    ------
    ValueError
        If ``block_size`` < 1 or the sequence is shorter than one block plus one.
    """
    if not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise ValueError(f"block-size={block_size!r} must be an integer >= 1")
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    n_blocks = (len(ids) - 1) // block_size
    if n_blocks < 1:
        raise ValueError(
            f"block-size={block_size} is too long for a sequence of {len(ids)} ids"
        )
    span = n_blocks * block_size
    x = ids[:span].reshape(n_blocks, block_size)
    y = ids[1 : span + 1].reshape(n_blocks, block_size)
    return torch.from_numpy(x.copy()), torch.from_numpy(y.copy())


def _bucket_sizes(total: int, n_buckets: int, rng: np.random.Generator,
                  sigma: float) -> np.ndarray:
    """Skewed positive integer sizes summing to ``total`` (each >= 1)."""
    weights = rng.lognormal(mean=0.0, sigma=sigma, size=n_buckets)
    share = weights / weights.sum() * (total - n_buckets)
    sizes = 1 + np.floor(share).astype(np.int64)
    remainder = total - int(sizes.sum())
    # Largest fractional parts get the leftover blocks (0 <= remainder < n_buckets).
    order = np.argsort(-(share - np.floor(share)), kind="stable")
    sizes[order[:remainder]] += 1
    return sizes


def partition_text(num_train_blocks: int, num_clients: int, scheme: str, seed: int,
                   sigma: float = 1.0) -> list[np.ndarray]:
    """Split training blocks over clients.

    Parameters
    ----------
    num_train_blocks : int
        Number ``N`` of training blocks (rows of the training ``x``).
    num_clients : int
        Number of clients ``C`` >= 1.
    scheme : {"iid", "noniid"}
        ``iid``: the block sequence is cut into ``C`` equal contiguous parts of
        ``N // C`` blocks (the last ``N mod C`` blocks are unused) and the
        parts are shuffled over the clients.  ``noniid``: the sequence is cut
        into ``2 C`` contiguous buckets whose sizes are drawn from a
        log-normal distribution (``sigma``; each bucket >= 1 block), and each
        client gets two random buckets; every block is used exactly once, and
        client sizes are unbalanced.
    seed : int
        Seed of the shuffles and bucket sizes; same arguments, same result.
    sigma : float
        Log-normal shape of the ``noniid`` bucket sizes (larger = more skewed).

    Returns
    -------
    list of np.ndarray
        ``C`` sorted int64 arrays of block indices, pairwise disjoint.

    Raises
    ------
    ValueError
        If ``scheme`` is unknown, ``num_clients`` < 1, or there are fewer
        blocks than ``C`` (iid) or ``2 C`` (noniid).
    """
    if scheme not in TEXT_SCHEMES:
        raise ValueError(f"partition={scheme!r} is not one of {TEXT_SCHEMES}")
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num-clients={num_clients!r} must be an integer >= 1")
    if sigma <= 0:
        raise ValueError(f"sigma={sigma!r} must be > 0")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        size = num_train_blocks // num_clients
        if size < 1:
            raise ValueError(
                f"num-clients={num_clients} exceeds the {num_train_blocks} "
                "training blocks (iid needs at least one block per client)"
            )
        parts = np.arange(size * num_clients, dtype=np.int64).reshape(num_clients, size)
        return [parts[p].copy() for p in rng.permutation(num_clients)]
    n_buckets = 2 * num_clients
    if num_train_blocks < n_buckets:
        raise ValueError(
            f"num-clients={num_clients} needs at least {n_buckets} training blocks "
            f"for noniid (two buckets per client); there are {num_train_blocks}"
        )
    sizes = _bucket_sizes(num_train_blocks, n_buckets, rng, sigma)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    owner = rng.permutation(n_buckets)  # buckets owner[2k], owner[2k+1] -> client k
    out = []
    for k in range(num_clients):
        pair = sorted(owner[2 * k : 2 * k + 2])
        out.append(np.concatenate(
            [np.arange(bounds[b], bounds[b + 1], dtype=np.int64) for b in pair]))
    return out
