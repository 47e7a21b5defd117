"""The four built-in tasks of the paper, written against :class:`task.interface.Task`.

MNIST, Fashion-MNIST and CIFAR-10 (uint8 images, the CNN of :mod:`task.model`,
the white-square backdoor trigger) and Tiny Shakespeare (character blocks, the
character GPT, no classes; the text backdoor's tokenizer over its 65 characters).
Their data, model, folder lookup and provenance are the functions of
:mod:`task.data`, :mod:`task.model`, :mod:`task.locate` and :mod:`task.provenance`,
unchanged, so a run selecting one by name gives the same numbers as before the
interface existed.
"""

from __future__ import annotations

import string
from functools import partial

from task.backdoor import stamp
from task.config import TaskConfig
from task.data import TaskData, load_task_data
from task.interface import Task
from task.locate import holds_dataset, resolve_data_dir
from task.model import build_model
from task.nanogpt import GPTConfig
from task.provenance import data_provenance
from task.text import encode

TEXT_CONTEXT = GPTConfig(vocab_size=2).block_size
"""The character GPT's context (64): the longest ``block-size`` it takes."""

TEXT_VOCABULARY = 65
"""Distinct characters of Tiny Shakespeare (:mod:`task.text`)."""

SHAKESPEARE_VOCAB = "\n !$&',-.3:;?" + string.ascii_uppercase + string.ascii_lowercase
"""Tiny Shakespeare's vocabulary (:func:`task.text.build_vocab` of ``input.txt``):
character ``SHAKESPEARE_VOCAB[i]`` has id ``i`` (``tests/test_text_backdoor.py``
checks it against the file)."""


def _load(dataset: str, settings: TaskConfig) -> TaskData:
    return load_task_data(dataset, settings.data_dir or None, settings.block_size)


def _locate(dataset: str, data_dir: str) -> str:
    return str(resolve_data_dir(dataset, data_dir or None))


def _check_text(settings: TaskConfig) -> None:
    """``block-size`` within the character GPT's context."""
    if not 2 <= settings.block_size <= TEXT_CONTEXT:
        raise ValueError(f"run-config 'block-size' = {settings.block_size!r} is not "
                         f"allowed: an integer in [2, {TEXT_CONTEXT}] with the "
                         f"shakespeare task (the character GPT's context is "
                         f"{TEXT_CONTEXT})")


def _builtin(dataset: str, text: bool = False) -> Task:
    return Task(
        name=dataset, load=partial(_load, dataset), model=partial(build_model, dataset),
        classes=not text, stamp=None if text else stamp,
        tokenize=partial(encode, vocab=SHAKESPEARE_VOCAB) if text else None,
        check=_check_text if text else None, locate=partial(_locate, dataset),
        holds=partial(holds_dataset, dataset),
        provenance=partial(data_provenance, dataset), perplexity=text,
        num_classes=TEXT_VOCABULARY if text else 10)


TASKS: dict[str, Task] = {
    "mnist": _builtin("mnist"),
    "fmnist": _builtin("fmnist"),
    "cifar10": _builtin("cifar10"),
    "shakespeare": _builtin("shakespeare", text=True),
}
"""The built-in tasks by name (run-config ``task``, or ``dataset`` when ``task`` is
``""``); the names are :data:`task.config.DATASETS`."""
