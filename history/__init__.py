"""Training-history stores behind one typed interface.

- :class:`TrainingHistory` / :class:`RoundRecorder` (:mod:`history.protocols`):
  what unlearning reads and what the learning loop writes;
- :class:`HistoryStore` (:mod:`history.store`): the uncoded store, checksummed
  blobs on the server;
- :class:`CodedRecorder` / :class:`CodedHistory` (:mod:`history.coded.recorder`,
  :mod:`history.coded.reader`): coded sharding, slices on the clients, keys and
  metadata on the server (:mod:`history.coded.catalog`);
- :mod:`history.catalog`: the SQLite catalog base every catalog file uses;
- :mod:`history.coded.slices`, :mod:`history.coded.slice_files`: the client half of the
  slice protocol; :mod:`history.files`: atomic files;
- :func:`storage_summary` (:mod:`history.storage`): the storage report.
"""

from history.catalog import SQLiteCatalog, StoreError
from history.coded.catalog import CodedStorageError, SliceTransfer
from history.coded.reader import CodedHistory, CodedHistoryError, HoldersUnreachableError
from history.coded.recorder import CodedRecorder
from history.protocols import RoundRecorder, TrainingHistory
from history.storage import StorageSettings, efficiency, storage_summary
from history.store import CorruptBlobError, HistoryStore

__all__ = [
    "CodedHistory", "CodedHistoryError", "CodedRecorder", "CodedStorageError",
    "HoldersUnreachableError", "SliceTransfer",
    "CorruptBlobError", "HistoryStore", "RoundRecorder", "SQLiteCatalog", "StoreError",
    "StorageSettings", "TrainingHistory", "efficiency", "storage_summary",
]
