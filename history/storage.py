"""The storage report of summary.json: what each history keeps, where, at what cost.

Bytes are measured on the stores (:class:`~history.protocols.TrainingHistory`:
``total_bytes``, ``accounting``, ``retrievals``); the storage efficiency gamma
and throughput lambda are the paper's formulas (Lin et al., IJCAI 2024, Sec. 4).
"""

from __future__ import annotations

from dataclasses import dataclass

from history.protocols import TrainingHistory

_NO_CLIENTS = {"max": 0, "min": 0, "mean": 0.0, "total": 0}
"""``client_bytes`` of a store that keeps nothing on the clients."""


FE_KEY = "FE"
"""summary.json ``storage`` block: FedEraser's storage need (the baseline federation's
whole history), beside ``SE_uncoded`` and ``SE_coded`` (paper Fig. 6); a key of the
contract, so it is spelled here once."""
STORAGE_ROWS = ((FE_KEY, FE_KEY), ("SE uncoded", "SE_uncoded"), ("SE coded", "SE_coded"))
"""(row label, storage-block key) of the storage tables and figures."""


def efficiency(num_shards: int, blocks_per_shard: int, num_clients: int,
               privacy_t: int = 0) -> dict:
    """Storage efficiency gamma and throughput lambda (Lin et al., IJCAI 2024, Sec. 4).

    gamma = size of the whole history / storage per node; lambda = histories
    served per unit time, relative to full storage. Full storage (one server
    keeps everything, FedEraser): gamma = lambda = 1. Uncoded sharding (each of S
    shard servers keeps its own shard): gamma = lambda = S. Coded sharding here
    codes each shard on its own: each of the n = C clients keeps one slice of
    1/K of every shard's round, so gamma_c = K; a shard's round decodes from any
    K + T slices with valid tags (up to C - K - T erasures), and without tags up
    to t = floor((C - K - T) / 2) wrong ones are corrected; with mu = t / C,
    gamma_c = K <= (1 - 2 mu) C - T (the paper's bound, T = 0). The paper's
    throughput is lambda_c = S / O(C^2 log^2 C log log C) (the decoding cost);
    it is an order, reported as the formula.

    Parameters
    ----------
    num_shards, blocks_per_shard, num_clients, privacy_t : int
        S, K (resolved, >= 1), C and T.

    Returns
    -------
    dict
        ``full``, ``uncoded`` and ``coded`` (``gamma``, ``k`` = K + T slices
        that decode, ``privacy_t``, ``tolerated_erasures``,
        ``tolerated_wrong_slices``, ``mu``, ``gamma_bound``, formulas).
    """
    k = blocks_per_shard + privacy_t
    t = max(num_clients - k, 0) // 2
    mu = t / num_clients
    return {
        "source": "Lin et al., IJCAI 2024, Sec. 4",
        "full": {"gamma": 1, "lambda": 1},
        "uncoded": {"gamma": num_shards, "lambda": num_shards},
        "coded": {
            "gamma": blocks_per_shard, "k": k, "n": num_clients,
            "privacy_t": privacy_t, "tolerated_erasures": max(num_clients - k, 0),
            "tolerated_wrong_slices": t, "mu": mu,
            "gamma_bound": (1 - 2 * mu) * num_clients - privacy_t,
            "gamma_formula": "gamma_c = K <= (1 - 2 mu) C - T, "
                             "mu = floor((C - K - T) / 2) / C",
            "lambda": "S / O(C^2 log^2 C log log C)",
        },
    }


def shard_needs(history: TrainingHistory, shard: int, model_bytes: int) -> dict:
    """Bytes one shard's server needs to unlearn, as the paper counts them.

    W_s^0 plus every stored update U_m^g of the shard (one model's size each),
    and, apart, the shard models W_s^1..W_s^G the uncoded store keeps as well
    (``models_bytes``; with a FedAvg / FedProx shard they can be rebuilt from
    the updates, see ``server_app.unlearning.frameworks.rebuild_shard_model``).

    Parameters
    ----------
    history : TrainingHistory
        The federation's history (its catalog: rounds and participants).
    shard : int
        Which shard.
    model_bytes : int
        Bytes of one model's parameters (float32: 4 per parameter).

    Returns
    -------
    dict
        ``updates`` (count), ``bytes`` (W^0 + updates) and ``models_bytes``.
    """
    rounds = history.rounds(shard)
    updates = sum(len(history.participants(shard, g)) for g in rounds)
    return {"updates": updates, "bytes": model_bytes * (1 + updates),
            "models_bytes": model_bytes * len(rounds)}


@dataclass(frozen=True)
class StorageSettings:
    """What the storage report needs to know of a run (no app config here).

    Attributes
    ----------
    mode : str
        ``uncoded`` or ``coded``.
    num_shards : int
        S, shard servers.
    num_clients : int
        C, clients (each can hold slices).
    blocks_per_shard : int
        K of coded storage (used when the store does not say its own).
    privacy_t : int
        T of coded storage (likewise).
    calibration_interval : int
        FedEraser's interval (which stored models a replay can start from).
    link_rate_mbps : float
        Link rate of the communication model (Mbit/s).
    """

    mode: str
    num_shards: int
    num_clients: int
    blocks_per_shard: int
    privacy_t: int
    calibration_interval: int
    link_rate_mbps: float


def paper_counts(cfg: StorageSettings, sharded: TrainingHistory,
                 baseline: TrainingHistory | None, model_bytes: int,
                 coded: dict | None) -> dict:
    """Per shard server and over the whole system (servers + clients), in bytes.

    - FE: one server keeps W^0 and every update; clients keep nothing.
    - SE uncoded: each of the S shard servers keeps its shard's W^0 and updates;
      ``per_server_bytes`` is the largest shard's, ``system_bytes`` the sum.
    - SE coded: each shard server keeps its key and its share of the catalog
      (the measured server bytes / S); the system adds every client's slices.

    ``per_server_bytes`` and ``system_bytes`` count what unlearning needs (the
    paper's count, so FE / uncoded SE per server is about S, gamma);
    ``stored_models_bytes`` is what the uncoded stores keep beyond it (the
    shard model of every round).
    """
    shards = [shard_needs(sharded, s, model_bytes) for s in range(cfg.num_shards)]
    out = {"model_bytes": model_bytes, "SE_uncoded": {
        "per_server_bytes": max(n["bytes"] for n in shards),
        "system_bytes": sum(n["bytes"] for n in shards),
        "per_shard_bytes": [n["bytes"] for n in shards],
        "stored_models_bytes": sum(n["models_bytes"] for n in shards)}}
    if baseline is not None:
        fe = [shard_needs(baseline, s, model_bytes)
              for s in range(len(set(baseline.client_shard().values())))]
        out[FE_KEY] = {"per_server_bytes": max(n["bytes"] for n in fe),
                     "system_bytes": sum(n["bytes"] for n in fe),
                     "stored_models_bytes": sum(n["models_bytes"] for n in fe)}
    if coded is not None:
        out["SE_coded"] = {
            "per_server_bytes": coded["server_bytes"] / cfg.num_shards,
            "system_bytes": coded["server_bytes"] + coded["client_bytes"]["total"]}
    return out


def storage_summary(cfg: StorageSettings, sharded: TrainingHistory,
                    baseline: TrainingHistory | None,
                    model_bytes: int | None = None) -> dict:
    """The ``storage`` block of summary.json.

    Parameters
    ----------
    cfg : StorageSettings
        The run's S, K, C, T, storage mode, calibration interval and link rate.
    sharded : TrainingHistory
        What SE's server keeps (``HistoryStore`` or ``CodedHistory``).
    baseline : TrainingHistory or None
        FedEraser's store (None when FE did not run).
    model_bytes : int, optional
        Bytes of one model's parameters; adds :func:`paper_counts`.

    Returns
    -------
    dict
        ``mode``; ``server_bytes`` (what SE's server keeps); ``FE``,
        ``SE_uncoded``, ``SE_coded`` each with ``server_bytes`` and
        ``client_bytes`` (per client: max / min / mean / total; 0 for stores
        that keep nothing on clients); ``SE_coded_vs_FE`` (1 - coded / FE);
        ``comm`` (modelled seconds of slice distribution and retrieval);
        ``efficiency`` (:func:`efficiency`). Bytes are measured: FE and uncoded
        SE from their stores (uncoded SE in coded mode: the serialized records
        the uncoded store would keep after pruning, blobs only), coded SE from the catalog
        and key files and from the bytes each client acknowledged. With
        ``model_bytes`` (one model's parameter bytes), each of ``FE``,
        ``SE_uncoded``, ``SE_coded`` also gets ``per_server_bytes`` and
        ``system_bytes`` (:func:`paper_counts`).
    """
    fe = baseline.total_bytes() if baseline is not None else None
    out: dict = {
        "mode": cfg.mode, "server_bytes": sharded.total_bytes(),
        FE_KEY: {"server_bytes": fe, "client_bytes": dict(_NO_CLIENTS) if fe is not None
               else None, "source": "baseline store" if fe is not None else "not run"},
    }
    acc = sharded.accounting()
    if acc is None:  # uncoded: the store itself is what SE keeps
        out["SE_uncoded"] = {"server_bytes": sharded.total_bytes(),
                             "client_bytes": dict(_NO_CLIENTS), "source": "store"}
        out["SE_coded"] = None
    else:
        out["SE_uncoded"] = _uncoded_estimate(sharded, acc, cfg.calibration_interval)
        out["SE_coded"] = {
            "server_bytes": acc["server_bytes"], "catalog_bytes": acc["catalog_bytes"],
            "key_bytes": acc["key_bytes"], "client_bytes": acc["client_bytes"],
            "client_disk_bytes": acc["client_disk_bytes"],
            "gamma_measured": acc["data_elements"] / max(acc["slice_elements"], 1),
        }
        out["comm"] = _comm(acc, sharded.retrievals(), cfg.link_rate_mbps)
    coded = (out["SE_coded"] or {}).get("server_bytes")
    out["SE_coded_vs_FE"] = 1 - coded / fe if coded is not None and fe else None
    used = (acc["blocks_per_shard"], acc["privacy_t"]) if acc is not None else \
        (cfg.blocks_per_shard, cfg.privacy_t)  # the store's own K and T
    out["efficiency"] = efficiency(cfg.num_shards, used[0], cfg.num_clients, used[1])
    if model_bytes:
        for name, counts in paper_counts(cfg, sharded, baseline, model_bytes,
                                         out["SE_coded"]).items():
            if isinstance(counts, dict) and out.get(name) is not None:
                out[name].update(counts)
        out["model_bytes"] = model_bytes
    return out


def _uncoded_estimate(coded: TrainingHistory, acc: dict, interval: int) -> dict:
    """What an uncoded SE store would keep, from a coded store's accounting.

    The serialized blobs of every update and of the shard models a replay can
    start from (as the uncoded store keeps after pruning); no catalog. A
    catalog from before model blobs were counted one by one gives every
    shard model, unpruned, and says so in ``source``.
    """
    pruned = coded.uncoded_needed_bytes(interval)
    if pruned is None:
        return {"server_bytes": acc["uncoded_bytes"], "client_bytes": dict(_NO_CLIENTS),
                "source": "serialized records of every update and every shard "
                          "model, not pruned (blobs; no catalog)"}
    return {"server_bytes": pruned, "client_bytes": dict(_NO_CLIENTS),
            "source": "serialized records of every update and of the shard models "
                      "a replay can start from, as pruned (blobs; no catalog)"}


def _comm(acc: dict, retrievals: list[dict], link_rate_mbps: float) -> dict:
    """Modelled seconds and transfers of distributing and fetching coded slices."""
    return {
        "distribution_s": acc["distribution_comm_s"],
        "distribution_transfers": acc["distribution_transfers"],
        "encode_s": acc["encode_s"],
        "retrieval_s": sum(r["comm_time_s"] for r in retrievals),
        "retrieval_transfers": sum(r["transfers"] for r in retrievals),
        "retrieval_bytes": sum(r["bytes"] for r in retrievals),
        "decode_s": sum(r["decode_s"] for r in retrievals),
        "link_rate_mbps": link_rate_mbps,
    }
