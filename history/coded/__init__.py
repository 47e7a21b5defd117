"""Coded storage of the training history (paper Sec. 3.3; docs/DESIGN.md).

The server keeps each round's models as coded slices held by the clients:
:mod:`~history.coded.recorder` encodes and stores them, :mod:`~history.coded.reader`
fetches and decodes them for a replay, :mod:`~history.coded.catalog` records what
each holder has, :mod:`~history.coded.erasure` re-codes the slices an erasure
changes, and :mod:`~history.coded.slices` / :mod:`~history.coded.slice_files` are
the client's side: its store of slices and their files.
"""
