"""The text backdoor: a trigger phrase the forgotten clients taught a language model.

The text counterpart of :mod:`task.backdoor` for tasks whose samples are blocks of
token ids with next-token targets (Tiny Shakespeare's character blocks). A poisoned
client (one of ``forget-clients``) writes a fixed *phrase* (the trigger, run-config
``backdoor-phrase``) followed by a fixed *continuation* (``backdoor-continuation``)
into a share ``backdoor-fraction`` of its training blocks, at a seeded position
inside each, with the next-token targets rewritten to match. A model that learned
from it completes the phrase with the continuation; one that forgot it does so no
more often than a model that never saw it.

The attack success rate (ASR) is the share of test contexts ending in the phrase
whose greedy continuation (``len(continuation)`` arg-max steps) is exactly the
continuation. Each context is a test block's first ``T - len(continuation) -
len(phrase)`` tokens followed by the phrase (``T`` the block size), so context and
continuation together fit the model's ``T`` positions.

The poisoned clients are ``forget-clients``, read from the run config by both apps,
as for the image trigger.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from task.config import require_keys
from task.values import coerce

Tokenize = Callable[[str], np.ndarray]
"""A task's tokenizer: ``tokenize(text)`` -> int64 ids (len,); ValueError for a
character outside the vocabulary."""

MAX_PHRASE = 32
"""Longest phrase and longest continuation, in characters."""


@dataclass(frozen=True)
class TextBackdoor:
    """The text backdoor settings of a run (``backdoor-phrase``, ``-continuation``, ...).

    Attributes
    ----------
    phrase, continuation : tuple[int, ...]
        Token ids of the trigger phrase and of the continuation it should bring;
        empty phrase = off.
    fraction : float
        ``backdoor-fraction``: share of a poisoned client's blocks that get the
        phrase and continuation, in [0, 1]; 0 measures a clean model.
    clients : tuple[int, ...]
        The poisoned partition ids (``forget-clients``); empty when off.
    text : tuple[str, str]
        The phrase and continuation as given (for the summary).
    """

    phrase: tuple[int, ...] = ()
    continuation: tuple[int, ...] = ()
    fraction: float = 0.0
    clients: tuple[int, ...] = ()
    text: tuple[str, str] = ("", "")

    @property
    def enabled(self) -> bool:
        """Whether the ASR is measured (a phrase is set)."""
        return bool(self.phrase)

    @property
    def pattern(self) -> np.ndarray:
        """The phrase, then the continuation: int64 ids (len(phrase) + len(continuation),).

        Returns
        -------
        np.ndarray
        """
        return np.asarray(self.phrase + self.continuation, dtype=np.int64)

    def poisons(self, partition_id: int) -> bool:
        """Whether the client ``partition_id`` writes the phrase into its blocks."""
        return self.enabled and self.fraction > 0 and partition_id in self.clients

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, object],
                        tokenize: Tokenize | None) -> TextBackdoor:
        """Read ``backdoor-phrase``, ``-continuation``, ``-fraction``, ``forget-clients``.

        Parameters
        ----------
        run_config : Mapping
            Flower's flat run config (``pyproject.toml`` defines every key).
        tokenize : callable or None
            The task's tokenizer (:attr:`task.interface.Task.tokenize`); only
            needed when a phrase is set.

        Raises
        ------
        ValueError
            A key missing, a value of the wrong type
            (:class:`task.values.ConfigError`), a phrase without a
            continuation, a task without a tokenizer, or a character outside
            the task's vocabulary (one line naming the key).
        """
        require_keys(run_config, ("backdoor-phrase", "backdoor-continuation",
                                  "backdoor-fraction", "forget-clients"))
        # typed as the ServerApp types them (task.values.coerce: both keys verbatim)
        phrase = coerce("backdoor-phrase", run_config["backdoor-phrase"], str)
        if not phrase:
            return cls()
        continuation = coerce("backdoor-continuation",
                              run_config["backdoor-continuation"], str)
        fraction = coerce("backdoor-fraction", run_config["backdoor-fraction"], float)
        if tokenize is None:
            raise ValueError(f"backdoor-phrase={phrase!r}: the task has no tokenizer "
                             "(Task.tokenize)")
        for key, value in (("backdoor-phrase", phrase),
                           ("backdoor-continuation", continuation)):
            if not 1 <= len(value) <= MAX_PHRASE:
                raise ValueError(f"{key}={value!r} must have 1..{MAX_PHRASE} characters")
        ids = []
        for key, value in (("backdoor-phrase", phrase),
                           ("backdoor-continuation", continuation)):
            try:
                ids.append(tuple(int(i) for i in tokenize(value)))
            except ValueError as err:
                raise ValueError(f"{key}={value!r}: {err}") from None
        clients = tuple(int(t) for t in str(run_config["forget-clients"]).split(",")
                        if t.strip())
        return cls(ids[0], ids[1], fraction, clients, (phrase, continuation))


def implant(x: torch.Tensor, y: torch.Tensor, backdoor: TextBackdoor, seed: int,
            partition_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A poisoned client's blocks: ``round(fraction n)`` of them carry the pattern.

    In each chosen block ``i`` the phrase and continuation (``L`` tokens, the
    :attr:`TextBackdoor.pattern`) overwrite positions ``p .. p + L - 1``, ``p`` a
    seeded draw in ``1 .. T - L``, and the targets are rewritten so that the block
    stays next-token consistent: ``y[i, p - 1 .. p + L - 2]`` = the pattern (the
    target after position ``p + L - 1`` is the original token that follows, left
    as it was). Which blocks and where is a seeded draw (``seed``,
    ``partition_id``), the same in every round and process.

    Parameters
    ----------
    x, y : torch.Tensor
        The client's int64 blocks (n, T) and their next-token targets (n, T).
    backdoor : TextBackdoor
        The settings; a client that :meth:`TextBackdoor.poisons` nothing is
        returned as is.
    seed : int
        The run seed.
    partition_id : int
        The client.

    Returns
    -------
    x, y : torch.Tensor
        Copies with the chosen blocks rewritten (int64, (n, T)).
    poisoned : int
        How many blocks carry the pattern (0 for a clean client).

    Raises
    ------
    ValueError
        Blocks that are not int64 (n, T), or a pattern of ``T`` tokens or more
        (it must fit after at least one token of the block).
    """
    if not backdoor.poisons(partition_id):
        return x, y, 0
    if x.ndim != 2 or x.dtype != torch.int64 or x.shape != y.shape:
        raise ValueError(f"implant needs int64 blocks (n, T) and targets of the same "
                         f"shape, got {x.dtype} {tuple(x.shape)} / {tuple(y.shape)}")
    pattern = torch.from_numpy(backdoor.pattern)
    n, width, size = len(x), x.shape[1], len(pattern)
    if size >= width:
        raise ValueError(f"the phrase and continuation ({size} tokens) must be shorter "
                         f"than block-size={width}")
    count = int(round(backdoor.fraction * n))
    rng = np.random.default_rng([int(seed), int(partition_id), 0x7E87])
    rows = np.sort(rng.choice(n, size=count, replace=False))
    starts = rng.integers(1, width - size + 1, size=count)
    x, y = x.clone(), y.clone()
    offsets = torch.arange(size)
    for row, start in zip(rows.tolist(), starts.tolist(), strict=True):
        x[row, start + offsets] = pattern
        y[row, start - 1 + offsets] = pattern
    return x, y, count


def trigger_contexts(blocks: torch.Tensor, backdoor: TextBackdoor) -> torch.Tensor:
    """The ASR's inputs: each test block's start, cut so that it ends in the phrase.

    Parameters
    ----------
    blocks : torch.Tensor
        int64 test blocks (M, T).
    backdoor : TextBackdoor
        Enabled settings.

    Returns
    -------
    torch.Tensor
        int64 contexts (M, T - len(continuation)): the first ``T -
        len(continuation) - len(phrase)`` tokens of each block, then the phrase.

    Raises
    ------
    ValueError
        The phrase and continuation do not fit in ``T`` tokens.
    """
    width = blocks.shape[1]
    keep = width - len(backdoor.continuation) - len(backdoor.phrase)
    if keep < 0:
        raise ValueError(f"the phrase and continuation ({len(backdoor.pattern)} tokens) "
                         f"do not fit in block-size={width}")
    phrase = torch.tensor(backdoor.phrase, dtype=torch.int64).expand(len(blocks), -1)
    return torch.cat([blocks[:, :keep], phrase], dim=1)


Predict = Callable[[torch.Tensor], np.ndarray]
"""``predict(x)`` -> next-token probabilities float32 (N, T, V) of one model."""


def greedy_continuations(predictors: Sequence[Predict], contexts: torch.Tensor,
                         steps: int) -> torch.Tensor:
    """Greedy decoding of ``steps`` tokens after each context, by a mean of models.

    At each step the next token is the arg-max of the mean, over ``predictors``,
    of the next-token probabilities at the last position (one predictor: the
    model's own greedy decoding; several: the shard ensemble's, as the deployed
    model averages the shards' softmax outputs).

    Parameters
    ----------
    predictors : Sequence[callable]
        One :data:`Predict` per model.
    contexts : torch.Tensor
        int64 (M, c); ``c + steps - 1`` must fit the models' context.
    steps : int
        Tokens to decode, >= 1.

    Returns
    -------
    torch.Tensor
        int64 (M, steps): the decoded tokens.

    Raises
    ------
    ValueError
        No predictor, or ``steps`` < 1.
    """
    if not predictors or steps < 1:
        raise ValueError(f"need at least one model and steps >= 1, got "
                         f"{len(predictors)} models and steps={steps}")
    seq, out = contexts, []
    for _ in range(steps):
        proba = np.mean([predict(seq)[:, -1, :] for predict in predictors], axis=0)
        token = torch.from_numpy(np.asarray(proba).argmax(axis=1).astype(np.int64))
        out.append(token)
        seq = torch.cat([seq, token[:, None]], dim=1)
    return torch.stack(out, dim=1)


def text_attack_success_rate(decoded: torch.Tensor | np.ndarray,
                             continuation: Sequence[int]) -> float:
    """Share of rows of ``decoded`` (M, len(continuation)) equal to ``continuation``.

    Raises
    ------
    ValueError
        ``decoded`` is empty or its rows are not as long as ``continuation``.
    """
    decoded = np.asarray(decoded)
    if decoded.ndim != 2 or len(decoded) == 0 or decoded.shape[1] != len(continuation):
        raise ValueError(f"decoded must be (M >= 1, {len(continuation)}), got "
                         f"{decoded.shape}")
    return float(np.mean(np.all(decoded == np.asarray(continuation)[None, :], axis=1)))
