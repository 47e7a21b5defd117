"""Server and client storage of FedEraser, uncoded SE and coded SE, measured.

The paper's topology (Lin et al., IJCAI 2024, Sec. 5.1): S = 4 shards, 20% of
the clients a round (C / 5, spread as evenly as possible over the shards: 5 per
shard at C = 100), K blocks per shard chosen from C as a default run does
(``blocks-per-shard = 0``: K = floor((1 - budget) C) - T, budget
``coded-loss-budget``, T ``privacy-t``), the
MNIST CNN (its real layers, 80,202 parameters). No training: the updates are
random float32 of the model's shapes (N(0, 0.01)), W^0 the real initial model;
they go through the real stores and coder:

- FE: ``HistoryStore`` of the unsharded federation (W^0, the C / 5 updates of
  every round and the last model), bytes on disk (blobs + catalog);
- uncoded SE: ``HistoryStore`` of the S shards (W_s^0, each shard's updates of
  every round, its last model and the model before each client's first round),
  bytes on disk;

both pruned at each checkpoint as a run prunes them at the end of learning
(``HistoryStore.prune_models``, :mod:`history.retention`);
- coded SE: ``CodedRecorder`` (quantise, encode, tag, send; with the
  defaults' ``quant-scale-bits`` and ``link-rate-mbps`` of pyproject.toml);
  the server keeps ``catalog.sqlite`` + ``keys``; per-client bytes are the
  slice and tag bytes each client acknowledged, answered by the real ClientApp
  handler (``query.store_slice``). Clients here acknowledge and then drop their
  slices (a fresh node state per message) to keep memory flat; the bytes are
  what a client keeps in ``context.state``.

The stores only grow, so one G = max(rounds) run per C is measured after each
checkpoint round (a store after round g is the store of a g-round run).
Used by the storage experiment (:mod:`experiments.run`) and by
``benchmarks/storage_table.py``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from cli.tables import table
from client_app.app import app as client_app
from experiments.grid import InProcessGrid, set_task_identity
from experiments.suites import storage_dataset
from history.coded.catalog import SliceTransfer
from history.coded.recorder import CodedRecorder
from history.store import HistoryStore
from server_app.rounds.federation import Federation, assign_shards
from task.builtin import build_model
from task.config import default_run_config

NUM_SHARDS = 4
SOURCE = "experiments/storage.py"


def per_shard_counts(per_round: int, num_shards: int) -> list[int]:
    """Participants of each shard a round: ``per_round`` spread evenly."""
    return [len(part) for part in np.array_split(np.arange(per_round), num_shards)]


def coded_settings() -> dict:
    """The coder's settings, as a default run has them (pyproject.toml).

    Returns
    -------
    dict
        ``scale_bits`` (int, ``quant-scale-bits``: fractional bits of the fixed
        point) and ``link_rate_mbps`` (float, ``link-rate-mbps``: Mbit/s of the
        communication model) and ``loss_budget`` (float, ``coded-loss-budget``).
    """
    config = default_run_config()
    return {"scale_bits": int(config["quant-scale-bits"]),
            "link_rate_mbps": float(config["link-rate-mbps"]),
            "loss_budget": float(config["coded-loss-budget"])}


def _stores(num_clients: int, work: Path, seed: int, privacy_t: int):
    """The three stores (FE, uncoded SE, coded SE), the shards and the grid."""
    shards = assign_shards(num_clients, NUM_SHARDS, seed)
    federation = Federation({p: 1000 + p for p in range(num_clients)}, shards)
    fe = HistoryStore.create(work / "fe", {p: 0 for p in range(num_clients)})
    se = HistoryStore.create(work / "se", federation.shard_of)
    coder = coded_settings()
    coded = CodedRecorder.create(
        work / "coded", federation, 0, coder["scale_bits"],
        SliceTransfer(link_rate_mbps=coder["link_rate_mbps"]), privacy_t=privacy_t,
        loss_budget=coder["loss_budget"])
    # fresh node state per message: clients acknowledge what they stored, then
    # forget it, so memory stays flat for C = 200 x 30 rounds
    grid = InProcessGrid(client_app, num_clients, {}, stateless=True)
    return fe, se, coded, shards, grid


def measure(num_clients: int, checkpoints: list[int], work: Path, seed: int = 0,
            privacy_t: int = 0) -> list[dict]:
    """Run all three stores for max(checkpoints) rounds; one row per checkpoint.

    Parameters
    ----------
    num_clients : int
        C (K = floor((1 - budget) C) - T must be at least 1).
    checkpoints : list[int]
        Rounds after which the stores are measured (each >= 1).
    work : Path
        An empty folder for the stores (the caller removes it).
    seed : int
        Seeds the shards, the model's initialisation and the random updates.
    privacy_t : int
        T, random padding blocks per shard (``privacy-t``).

    Returns
    -------
    list[dict]
        Per checkpoint: ``clients``, ``rounds``, ``blocks_per_shard`` (K),
        ``privacy_t`` (T), ``params``, ``per_round``,
        ``per_shard``, bytes (``fe_server``, ``se_uncoded_server``,
        ``se_coded_server``, ``se_coded_catalog``, ``se_coded_client_max``,
        ``se_coded_client_mean``), ``distribution_comm_s`` (modelled seconds)
        ``encode_s`` (measured coding seconds so far) and ``seconds`` (wall
        time so far).
    """
    set_task_identity()
    torch.manual_seed(seed)
    model = build_model(storage_dataset(), 10)  # the storage experiment's task
    w0 = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(seed)
    fe, se, coded, shards, grid = _stores(num_clients, work, seed, privacy_t)
    counts = per_shard_counts(num_clients // 5, NUM_SHARDS)
    fe.put_shard_model(0, 0, w0)
    for s in range(NUM_SHARDS):
        se.put_shard_model(s, 0, w0)
        coded.put_shard_model(s, 0, w0)
    coded.end_round(0, grid)
    rows, t0 = [], time.perf_counter()
    for rnd in range(1, max(checkpoints) + 1):
        for s, pids in enumerate(shards):
            chosen = rng.choice(pids, counts[s], replace=False)
            for pid in sorted(int(p) for p in chosen):
                update = {k: rng.normal(0, 0.01, v.shape).astype(np.float32)
                          for k, v in w0.items()}
                fe.put_update(0, rnd, pid, update, 600, 1.0)
                se.put_update(s, rnd, pid, update, 600, 1.0)
                coded.put_update(s, rnd, pid, update, 600, 1.0)
            model = {k: v + rng.normal(0, 0.01, v.shape).astype(np.float32)
                     for k, v in w0.items()}
            se.put_shard_model(s, rnd, model)
            coded.put_shard_model(s, rnd, model)
        fe.put_shard_model(0, rnd, model)
        coded.end_round(rnd, grid)
        if rnd in checkpoints:
            # as a run ends its learning: drop the models no replay can start from
            # (a model dropped after round g is not needed by a longer run either)
            fe.prune_models(None)
            se.prune_models(int(default_run_config()["calibration-interval"]))
            rows.append(_row(num_clients, rnd, w0, counts, (fe, se, coded),
                             time.perf_counter() - t0))
    for store in (fe, se, coded):
        store.close()
    return rows


def _row(num_clients: int, rnd: int, w0: dict, counts: list[int], stores: tuple,
         seconds: float) -> dict:
    fe, se, coded = stores
    acc = coded.accounting()
    print(f"  C={num_clients} G={rnd}: {seconds:.0f} s", file=sys.stderr, flush=True)
    return {
        "clients": num_clients, "rounds": rnd,
        "blocks_per_shard": coded.blocks_per_shard, "privacy_t": coded.privacy_t,
        "params": sum(v.size for v in w0.values()),
        "per_round": num_clients // 5, "per_shard": counts,
        "fe_server": fe.total_bytes(), "se_uncoded_server": se.total_bytes(),
        "se_coded_server": acc["server_bytes"],
        "se_coded_catalog": acc["catalog_bytes"],
        "se_coded_client_max": acc["client_bytes"]["max"],
        "se_coded_client_mean": acc["client_bytes"]["mean"],
        "distribution_comm_s": acc["distribution_comm_s"],
        "encode_s": acc["encode_s"], "seconds": seconds,
    }


def sweep(clients: Iterable[int], rounds: Iterable[int], privacy_t: Iterable[int] = (0,)
          ) -> list[dict]:
    """:func:`measure` for every C in ``clients`` and T in ``privacy_t``.

    Checkpoints: ``rounds``.

    Each C gets a temporary folder, removed afterwards. Rows as
    :func:`measure`'s, plus ``source`` (this module).
    """
    checkpoints = sorted(rounds)
    rows = []
    for num_clients in clients:
        for t in privacy_t:
            work = Path(tempfile.mkdtemp(prefix="se-storage-"))
            try:
                rows += [{**row, "source": SOURCE} for row in
                         measure(num_clients, checkpoints, work, privacy_t=t)]
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return rows


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def render(rows: list[dict]) -> str:
    """The plain-text table of :func:`measure`'s rows: one line per (C, G)."""
    head = ["C", "G", "K + T", "FE server", "uncoded SE server", "coded SE server",
            "coded/FE", "coded SE per client", "FE, uncoded SE per client",
            "distribution comm"]
    return table(head, [
        [str(r["clients"]), str(r["rounds"]),
         f"{r['blocks_per_shard']} + {r['privacy_t']}", _mb(r["fe_server"]),
         _mb(r["se_uncoded_server"]), _mb(r["se_coded_server"]),
         f"{100 * r['se_coded_server'] / r['fe_server']:.3f}%",
         _mb(r["se_coded_client_max"]), "0",
         f"{r['distribution_comm_s']:,.0f} s"] for r in rows])
