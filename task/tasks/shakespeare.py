"""Tiny Shakespeare: next-character prediction over 65 characters, a character GPT.

One UTF-8 file (``tinyshakespeare/input.txt``, karpathy/char-rnn), encoded and cut
into blocks of run-config ``block-size`` characters by :mod:`task.text` (int64
(N, T) blocks, the next character of each position as targets: no classes), and
learnt by :class:`task.nanogpt.CharGPT`. Its headline score is the test loss in
nats per character (``perplexity``). The text backdoor tokenizes a phrase over the
corpus' 65 characters (:data:`VOCAB`); there is no image trigger.
"""

from __future__ import annotations

import string
from functools import partial
from pathlib import Path

from torch import nn

from task import text as text_task
from task.config import TaskConfig, check_block_size
from task.data import TaskData, load_files
from task.interface import Task
from task.locate import DataSource, download_file, holds_dataset, resolve_data_dir
from task.nanogpt import CharGPT, GPTConfig
from task.provenance import files_provenance

NAME = "shakespeare"

FILE = Path("tinyshakespeare") / "input.txt"
"""The corpus, relative to a data folder."""

URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
       "tinyshakespeare/input.txt")
"""Where the canonical copy is downloaded from."""

FORMAT = "Tiny Shakespeare, one UTF-8 text file (char-rnn input.txt)"
"""summary.json ``data.format``."""

CONTEXT = GPTConfig(vocab_size=2).block_size
"""The character GPT's context (64): the longest ``block-size`` it takes."""

VOCABULARY = 65
"""Distinct characters of Tiny Shakespeare (:mod:`task.text`)."""

VOCAB = "\n !$&',-.3:;?" + string.ascii_uppercase + string.ascii_lowercase
"""Tiny Shakespeare's vocabulary (:func:`task.text.build_vocab` of ``input.txt``):
character ``VOCAB[i]`` has id ``i`` (``tests/test_text_backdoor.py`` checks it
against the file)."""


def _download(root: Path) -> None:
    download_file(URL, root / FILE)


SOURCE = DataSource(NAME, (FILE,), _download)
"""The corpus file marks a folder holding it (:mod:`task.locate`)."""


def read(folder: Path, block_size: int) -> TaskData:
    """The corpus as blocks of ``block_size`` characters (train: its first 90%)."""
    path = folder / FILE
    corpus = text_task.load_corpus(path)
    train_x, train_y = text_task.blocks(corpus.train_ids, block_size)
    test_x, test_y = text_task.blocks(corpus.test_ids, block_size)
    return TaskData(train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
                    num_classes=corpus.vocab_size, source=str(path), kind="text")


def read_test(folder: Path, block_size: int) -> TaskData:
    """The test blocks alone (the corpus' last 10%).

    The corpus is one file, so it is read whole; its training ids are dropped
    before they are cut into blocks.
    """
    path = folder / FILE
    corpus = text_task.load_corpus(path)
    test_x, test_y = text_task.blocks(corpus.test_ids, block_size)
    return TaskData.test_only(test_x, test_y, corpus.vocab_size, str(path), "text")


def load_test(settings: TaskConfig) -> TaskData:
    """The test split alone (``client-data = true``), once per process and block size."""
    check_block_size(settings.block_size)
    return load_files(SOURCE, read_test, settings.data_dir or None, settings.block_size)


def load(settings: TaskConfig) -> TaskData:
    """The whole task, read once per process and block size.

    Raises
    ------
    ValueError
        ``block-size`` below 2 (naming the key).
    """
    check_block_size(settings.block_size)
    return load_files(SOURCE, read, settings.data_dir or None, settings.block_size)


def model(num_classes: int, **kw) -> nn.Module:
    """The character GPT over ``num_classes`` characters; ``kw``: GPTConfig fields."""
    return CharGPT(GPTConfig(vocab_size=num_classes, **kw))


def check(settings: TaskConfig) -> None:
    """``block-size`` within the character GPT's context.

    Raises
    ------
    ValueError
        One line naming ``block-size``.
    """
    if not 2 <= settings.block_size <= CONTEXT:
        raise ValueError(f"run-config 'block-size' = {settings.block_size!r} is not "
                         f"allowed: an integer in [2, {CONTEXT}] with the "
                         f"{NAME} task (the character GPT's context is {CONTEXT})")


def locate(data_dir: str) -> str:
    """The folder holding the corpus (:func:`task.locate.resolve_data_dir`)."""
    return str(resolve_data_dir(SOURCE, data_dir or None))


def provenance(folder: str | Path) -> dict:
    """The corpus file, its size and checksum."""
    return files_provenance(NAME, folder, FORMAT, [Path(folder) / FILE])


task = Task(
    name=NAME, load=load, load_test=load_test, model=model, classes=False, stamp=None,
    tokenize=partial(text_task.encode, vocab=VOCAB), check=check, locate=locate,
    holds=partial(holds_dataset, SOURCE), provenance=provenance, perplexity=True,
    num_classes=VOCABULARY)
"""Tiny Shakespeare (run-config ``dataset = "shakespeare"``)."""
