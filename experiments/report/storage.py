"""report.md's storage and communication section (paper Fig. 5).

Server, per-shard, system and per-client bytes of FE, uncoded and coded SE from one
run, then the storage sweep against clients C and rounds G when there is one.
"""

from __future__ import annotations

from experiments import compare
from experiments.report.cells import less, md_table, num, size
from history.storage import FE_KEY, STORAGE_ROWS

# where a storage sweep's rows came from (the second: results.json of before the
# measurement moved into experiments/)
_SWEEP_SOURCES = ("experiments/storage.py", "benchmarks/storage_table.py")


def storage_section(store, results) -> list[str]:
    """The storage section as markdown lines, then the sweep of ``results``.

    ``store`` is :func:`experiments.compare.storage_block`'s block, ``None`` when no
    storage run finished.
    """
    out = ["", "## Storage and communication (paper Fig. 5)", ""]
    if store is None:
        return out + ["No storage run finished."]
    if not store["coded_available"]:
        out += ["Coded storage was not available (summary.json has no `SE_coded` "
                "block): FE and uncoded SE only.", ""]
    eff = store.get("efficiency") or {}
    out += [f"From run `{store['run']}`. Server bytes as measured on disk "
            "(coded SE: catalog and keys only; its slices live on the clients). "
            "Communication: modelled 0.1 s + bits / link rate per transfer, summed "
            "over unlearning (coded SE: plus fetching the slices); slice "
            "distribution during learning listed apart.", ""]
    table = []
    per_server = store.get("per_server_bytes") or {}
    system = store.get("system_bytes") or {}
    per_server_saving, system_saving = (
        compare.reduction(count.get("SE uncoded"), count.get(FE_KEY))
        for count in (per_server, system))
    for name, _ in STORAGE_ROWS:
        table.append([name, size(store["server_bytes"].get(name)),
                      size(per_server.get(name)), size(system.get(name)),
                      size(store["client_bytes"].get(name)),
                      num(store["comm_s"].get(name), 1),
                      num(store["distribution_s"], 1) if name == "SE coded" else "0"])
    out.append(md_table(["framework", "server storage", "per shard server (paper)",
                       "system (servers + clients)", "per-client storage (max)",
                       "unlearning comm s", "distribution comm s"], table))
    out += ["", "Server storage: the server's files after learning (a store keeps the "
            "updates and only the models a replay can start from: FE W^0 and the "
            "last, uncoded SE per shard W^0, the last and the model before each "
            "client's first round). Per shard server: W^0 and the updates one "
            "shard's server keeps, as the paper counts (FE: its one server). "
            "System: the same count over every server (coded SE: its catalogs and "
            "keys) plus every client's slices.", "",
            f"- Coded SE server storage vs FE: {less(store['reduction_vs_FE'])} "
            f"(paper: ~98% less); uncoded SE vs FE: "
            f"{less(store['uncoded_reduction_vs_FE'])} on disk (the kept shard "
            f"models and the catalog), {less(system_saving)} over the system and "
            f"{less(per_server_saving)} per shard server (the paper's gamma = S) "
            "by the paper's count."]
    if store.get("retrieval_s") is not None:
        out.append(f"- Coded SE slice retrieval: {num(store['retrieval_s'], 2)} s "
                   f"modelled transfer, {num(store['decode_s'], 2)} s decoding.")
    if eff:
        coded = eff.get("coded", {})
        out.append(f"- Storage efficiency gamma (paper Sec. 4): full 1, uncoded "
                   f"{eff.get('uncoded', {}).get('gamma')}, coded k = "
                   f"{coded.get('gamma')} (bound (1 - 2 mu) C = "
                   f"{num(coded.get('gamma_bound'), 1)}, mu = {num(coded.get('mu'))})"
                   + (f"; measured data / slice elements: "
                      f"{num(store.get('gamma_measured'), 2)}"
                      if store.get("gamma_measured") is not None else "") + ".")
    return out + _sweep_section(results)


def _sweep_section(results) -> list[str]:
    """Storage against C and G (the sweep's rows), or nothing without a sweep."""
    out: list[str] = []
    sweep = results.get("storage_sweep") or []
    if sweep:
        out += ["", f"### Storage against clients C and rounds G "
                f"(source: {results.get('storage_sweep_source')})", ""]
        out.append(md_table(
            ["C", "G", "FE server", "uncoded SE server", "coded SE server",
             "coded / FE", "coded SE per client (max)"],
            [[r["clients"], r["rounds"], size(r.get("fe_server")),
              size(r.get("se_uncoded_server")), size(r.get("se_coded_server")),
              f"{100 * r['se_coded_server'] / r['fe_server']:.3f}%"
              if r.get("se_coded_server") and r.get("fe_server") else "n/a",
              size(r.get("se_coded_client_max"))]
             for r in sorted(sweep, key=lambda r: (r["clients"], r["rounds"]))]))
        if results.get("storage_sweep_source") in _SWEEP_SOURCES:
            # a results.json older than the blocks-per-shard field still redraws
            ks = ", ".join(f"{k} at C = {c}" for c, k in sorted(
                {r["clients"]: r["blocks_per_shard"] for r in sweep
                 if "blocks_per_shard" in r}.items())) or "not recorded in this file"
            out += ["", "The sweep uses the real stores and coder with random "
                    "updates of the MNIST CNN's shapes (no training; see "
                    f"experiments/storage.py): S = 4, K blocks a shard ({ks}), "
                    "C / 5 clients a round."]
    return out
