"""Where the task's tensors live: run-config ``device``.

``auto`` (the default) is CUDA when ``torch.cuda.is_available()``, else the CPU;
``cpu``, ``cuda`` and ``cuda:N`` name one. Each process resolves the key on its
own machine (the ServerApp for central evaluation and the audit, each ClientApp
for local training, RapidRetrain's Fisher and evaluation), so in a deployment a
SuperNode with a GPU uses it under ``auto`` while a server without one does not.
On the CPU nothing moves: the results are those of a run without this key.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda", "cuda:N")
"""The forms run-config ``device`` may take."""

_FORM = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device(spec: object) -> None:
    """Refuse a ``device`` that is malformed or names CUDA where there is none.

    Parameters
    ----------
    spec : object
        Run-config ``device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.

    Raises
    ------
    ValueError
        One line naming ``device``, the value and what is allowed: not one of
        :data:`DEVICES`, CUDA asked for where ``torch.cuda.is_available()`` is
        False, or ``cuda:N`` with N at least the number of CUDA devices.
    """
    if not isinstance(spec, str) or not _FORM.fullmatch(spec):
        raise ValueError(f"run-config 'device' = {spec!r} is not allowed: one of "
                         f"{', '.join(DEVICES)}")
    if not spec.startswith("cuda"):
        return
    import torch  # here: the run-config checks above need no torch (a fast refusal)

    if not torch.cuda.is_available():
        raise ValueError(f"run-config 'device' = {spec!r} is not allowed: CUDA is not "
                         "available on this machine (torch.cuda.is_available() is "
                         "False); use 'auto' or 'cpu'")
    index = int(spec.split(":")[1]) if ":" in spec else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(f"run-config 'device' = {spec!r} is not allowed: this machine "
                         f"has {count} CUDA device(s), cuda:0..cuda:{count - 1}")


def resolve_device(spec: str = "auto") -> torch.device:
    """The ``torch.device`` that run-config ``device`` names on this machine.

    Parameters
    ----------
    spec : str
        ``auto`` (CUDA if available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.

    Returns
    -------
    torch.device

    Raises
    ------
    ValueError
        As :func:`check_device`.
    """
    import torch

    check_device(spec)
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)
