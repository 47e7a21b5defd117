"""Model versions: the deployed shard models after learning and after each request.

A run folder keeps every version of SE's shard models (the deployed ensemble):
``v1`` after learning, then one per handled request or batch (a one-stage run's
planned requests, a staged run's stage ends, and each request a finished run
takes later). A version is a models file ``models/<name>.npz`` with its SHA-256,
the digest of its arrays (:func:`runstore.receipts.shard_digests`, what a
receipt names), the requests it reflects, the clients forgotten in it, its test
scores and the time it was made. The rows live in the table ``versions`` of the
run catalog ``run.sqlite`` (:class:`runstore.inbox.RequestInbox`); a row is
written after its file, in the same transaction as the request it closes, so a
version is never half written.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from runstore.receipts import shard_digests

VERSIONS_SCHEMA = """
CREATE TABLE IF NOT EXISTS versions (
    version INTEGER PRIMARY KEY, created REAL NOT NULL, file TEXT NOT NULL,
    file_sha256 TEXT NOT NULL, shards INTEGER NOT NULL, digests TEXT NOT NULL,
    requests TEXT NOT NULL, forgotten TEXT NOT NULL, scores TEXT NOT NULL,
    note TEXT NOT NULL);
"""
_JSON = ("digests", "requests", "forgotten", "scores")


@dataclass(frozen=True)
class ModelVersion:
    """One version of a run's deployed shard models.

    Attributes
    ----------
    version : int
        1, 2, ... in the order they were made.
    created : float
        UNIX time (seconds) it was written.
    file : str
        Its models file, relative to the run folder (``models/<name>.npz``).
    file_sha256 : str
        SHA-256 (hex) of that file's bytes.
    shards : int
        S, shard models in the file.
    digests : dict
        ``{"models": hex, "shards": [hex, ...]}`` of the arrays
        (:func:`runstore.receipts.shard_digests`; a receipt names these).
    requests : list[str]
        The requests handled to make it (ids; ``planned`` for a one-stage run's).
    forgotten : list[int]
        Every client forgotten in this version (partition ids).
    scores : dict
        ``accuracy``, ``loss``, ``shard_accuracy`` on the test set.
    note : str
        What made it (``after learning``, ``after request r0004`` ...).
    """

    version: int
    created: float
    file: str
    file_sha256: str
    shards: int
    digests: dict
    requests: list[str] = field(default_factory=list)
    forgotten: list[int] = field(default_factory=list)
    scores: dict = field(default_factory=dict)
    note: str = ""

    def row(self) -> tuple:
        """The table row (JSON fields as text)."""
        values = asdict(self)
        return tuple(json.dumps(values[k], allow_nan=False) if k in _JSON else values[k]
                     for k in values)

    @classmethod
    def from_row(cls, row: tuple) -> ModelVersion:
        """Read back :meth:`row`."""
        names = [f for f in cls.__dataclass_fields__]
        values = dict(zip(names, row, strict=True))
        return cls(**{k: json.loads(v) if k in _JSON else v for k, v in values.items()})

    def to_json(self) -> dict:
        """A JSON-ready dict (``models`` listing, receipts)."""
        return asdict(self)


LATER = "after request "
"""How the note of a version a request to the finished run made begins."""

PLANNED = "planned"
"""The request id a one-stage run's version 2 names: its planned requests."""


def made_later(versions: list[ModelVersion]) -> list[ModelVersion]:
    """The versions requests to the finished run made (summary.json predates them)."""
    return [v for v in versions if v.note.startswith(LATER)]


def make_version(folder, number: int, models: list, scores: dict, requests: list[str],
                 forgotten: list[int], note: str, name: str | None = None) -> ModelVersion:
    """Write ``models`` to ``models/<name>.npz`` (default ``v<number>``); its version.

    ``folder`` is the run's :class:`~runstore.folder.RunFolder`; the file is
    written atomically and the returned :class:`ModelVersion` is not recorded
    yet (:meth:`runstore.inbox.RequestInbox.add_version` or ``finish``).
    """
    name = name or f"v{number}"
    saved = folder.save_models(name, models)
    return ModelVersion(number, time.time(), f"models/{name}.npz", saved["sha256"],
                        saved["shards"], shard_digests(models), list(requests),
                        sorted(int(p) for p in forgotten), dict(scores), note)


def verify_version(folder, version: ModelVersion) -> list:
    """Version ``version``'s shard models, read back and checked against its records.

    The file's SHA-256 (:meth:`runstore.folder.RunFolder.load_models`), then
    the models digest recomputed from its arrays against ``digests["models"]``:
    a file swapped together with its recorded file digest still fails.

    Parameters
    ----------
    folder : Path
        The run folder.
    version : ModelVersion
        One of its recorded versions.

    Returns
    -------
    list[ArrayRecord]
        The S shard models.

    Raises
    ------
    ModelsFileError
        One line naming the file and what does not match its record.
    """
    from runstore.folder import ModelsFileError, RunFolder

    name = version.file.removeprefix("models/").removesuffix(".npz")
    models = RunFolder(folder).load_models(name, {"sha256": version.file_sha256,
                                                  "shards": version.shards})
    got = shard_digests(models)["models"]
    if got != version.digests.get("models"):
        raise ModelsFileError(
            f"{folder}/{version.file}: its arrays' models sha256 {got} is not the "
            f"recorded {version.digests.get('models')} of v{version.version} (the file "
            "or the run catalog was changed); restore both from a backup")
    return models
