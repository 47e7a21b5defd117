"""Figures of the experiments (matplotlib, Agg backend): PNG files.

- ``single_retraining.png``: SE / FR / FE / RR retraining compute seconds and
  client-epochs per dataset and partition (paper Fig. 3 / Table 1);
- ``single_accuracy.png``: test accuracy (tasks whose headline metric is
  accuracy) and test loss (tasks whose headline metric is the loss, e.g. Tiny
  Shakespeare; rows' ``metric``) of the original and each unlearned model;
- ``single_mia.png``: membership-inference F1 on the forgotten clients' data,
  with the stability seeds' spread;
- ``concurrent.png``: SE's retraining seconds against K, measured beside the
  paper's expectation (paper Fig. 4);
- ``storage.png``: server storage and communication seconds of FE, uncoded SE
  and coded SE (paper Fig. 5 a, b);
- ``storage_sweep.png``: server storage against clients C and rounds G
  (paper Fig. 5 c, d).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments import collect, compare  # noqa: E402
from history.storage import FE_KEY  # noqa: E402
from server_app.config import methods  # noqa: E402
from task.tasks import BUILTIN_TASKS  # noqa: E402

COLORS = {"original": "#7f7f7f", **{m.name: m.colour for m in methods.builtins()},
          "SE uncoded": "#ff7f0e", "SE coded": "#d62728"}
"""Each model's colour: the methods' own (:mod:`server_app.config.methods`), the
learned model's and the storage figure's two SE variants."""
DPI = 90


def make_all(results: dict, rows: Sequence[dict], folder: Path) -> list[str]:
    """Draw every figure the rows allow; return the written paths (relative names)."""
    folder.mkdir(parents=True, exist_ok=True)
    out_dir = folder.parent
    summaries = collect.summaries_by_run(results, out_dir)
    written = []
    for name, draw in (
        ("single_retraining.png", lambda p: single_retraining(rows, p)),
        ("single_accuracy.png", lambda p: single_accuracy(rows, p)),
        ("single_mia.png", lambda p: single_mia(rows, p)),
        ("concurrent.png", lambda p: concurrent(
            compare.concurrent_points(rows, collect.se_requests(summaries)), p)),
        ("storage.png", lambda p: storage(
            compare.storage_block(rows, collect.storage_blocks(summaries)), p)),
        ("storage_sweep.png", lambda p: storage_sweep(results.get("storage_sweep", []),
                                                      p)),
    ):
        path = folder / name
        if draw(path):
            written.append(f"figures/{name}")
    return written


def _cells(rows):
    """Single cells in display order.

    The built-in tasks in their registry's (the paper's) order, every other task
    after them by name. Order only: what a cell shows is read from its rows
    (``metric``).
    """
    cells = compare.single_cells(rows)
    order = {name: i for i, name in enumerate(BUILTIN_TASKS)}
    return sorted(cells.items(), key=lambda kv: (order.get(kv[0][0], len(order)),
                                                 kv[0][0], kv[0][1]))


def _bars(ax, labels, series: dict[str, list], ylabel: str, log: bool = False):
    n = max(len(series), 1)
    width = 0.8 / n
    for j, (name, values) in enumerate(series.items()):
        xs = [i + (j - (n - 1) / 2) * width for i in range(len(labels))]
        ys = [v if v is not None else 0.0 for v in values]
        ax.bar(xs, ys, width, label=name, color=COLORS.get(name))
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig, path: Path) -> bool:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def single_retraining(rows, path: Path) -> bool:
    """Retraining compute seconds and client-epochs, SE vs the baselines."""
    cells = _cells(rows)
    if not cells:
        return False
    labels = [f"{d}\n{p}" for (d, p), _ in cells]
    names = [n for n in (*collect.frameworks(), *collect.methods_in(rows))
             if any(n in fw for _, fw in cells)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    _bars(axes[0], labels, {n: [(fw.get(n) or {}).get("retrain_compute_s")
                                for _, fw in cells] for n in names},
          "retraining compute time (s)")
    axes[0].set_title("Retraining compute time")
    _bars(axes[1], labels, {n: [(fw.get(n) or {}).get("client_epochs")
                                for _, fw in cells] for n in names},
          "client-epochs (count)")
    axes[1].set_title("Retraining work (client-epochs)")
    for ax in axes:
        ax.set_xlabel("dataset / partition")
    return _save(fig, path)


def accuracy_panels(rows) -> dict[str, list]:
    """The cells of ``single_accuracy.png``, by panel (``"accuracy"``, ``"loss"``).

    A cell goes to the panel of its headline metric (:func:`compare.cell_metric`:
    the rows' ``metric``, which the run's task declared), never by its name.

    Parameters
    ----------
    rows : Sequence[dict]
        Run rows (:func:`collect.summary_rows`).

    Returns
    -------
    dict[str, list]
        Each metric's ``((dataset, partition), {framework: row})`` cells in display
        order; a metric without cells is absent.
    """
    panels: dict[str, list] = {}
    for key, fw in _cells(rows):
        panels.setdefault(compare.cell_metric(fw), []).append((key, fw))
    return {m: panels[m] for m in ("accuracy", "loss") if m in panels}


def single_accuracy(rows, path: Path) -> bool:
    """Test accuracy or test loss per model: each task by its headline metric."""
    panels = accuracy_panels(rows)
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels) + 1, 4),
                             squeeze=False)
    names = ["original", *collect.frameworks(), *collect.methods_in(rows)]
    for ax, (key, panel) in zip(axes[0], panels.items(), strict=True):
        is_loss = key == "loss"
        scale = 1.0 if is_loss else 100.0
        series = {n: [((fw.get(n) or {}).get(key) or 0.0) * scale for _, fw in panel]
                  for n in names if any(n in fw for _, fw in panel)}
        _bars(ax, [f"{d}\n{p}" for (d, p), _ in panel], series,
              "test loss (nats / target)" if is_loss else "test accuracy (%)")
        ax.set_title("Test loss (tasks scored by loss)" if is_loss
                     else "Test accuracy (tasks scored by accuracy)")
        ax.set_xlabel("dataset / partition")
    return _save(fig, path)


def single_mia(rows, path: Path) -> bool:
    """MIA F1 on the forgotten clients' data; the stability seeds' min-max."""
    cells = _cells(rows)
    if not any(any((r or {}).get("mia_f1") is not None for r in fw.values())
               for _, fw in cells):
        return False
    names = [n for n in ("original", *collect.frameworks(), *collect.methods_in(rows))
             if any(n in fw for _, fw in cells)]
    fig, ax = plt.subplots(figsize=(9, 4))
    _bars(ax, [f"{d}\n{p}" for (d, p), _ in cells],
          {n: [(fw.get(n) or {}).get("mia_f1") for _, fw in cells] for n in names},
          "MIA F1 on forgotten data (0-1)")
    ax.axhline(0.5, color="k", lw=0.8, ls=":", label="chance (0.5)")
    stab = compare.mia_stability(rows)
    if stab:
        ax.set_title(f"Membership inference F1 (seed 0); {stab['config']} over seeds "
                     f"{stab['seeds']}: F1 range up to "
                     f"{max(m['range'] for m in stab['models'].values()):.3f}",
                     fontsize=9)
    else:
        ax.set_title("Membership inference F1")
    ax.set_ylim(0, 1)
    ax.set_xlabel("dataset / partition")
    ax.legend(fontsize=8)
    return _save(fig, path)


def concurrent(points: Sequence[dict], path: Path) -> bool:
    """SE's shard retraining seconds against K: measured and expected."""
    if not points:
        return False
    datasets = sorted({p["dataset"] for p in points})
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4),
                             squeeze=False)
    styles = {("concurrent", "even"): ("o-", "#d62728"),
              ("concurrent", "adapt"): ("s-", "#ff7f0e"),
              ("sequential", "even"): ("^-", "#1f77b4"),
              ("sequential", "adapt"): ("v-", "#17becf")}
    for ax, dataset in zip(axes[0], datasets, strict=True):
        mine = [p for p in points if p["dataset"] == dataset]
        for (mode, dist), (marker, color) in styles.items():
            pts = sorted((p for p in mine if p["mode"] == mode
                          and p["distribution"] == dist), key=lambda p: p["K"])
            if not pts:
                continue
            ks = [p["K"] for p in pts]
            ax.plot(ks, [p["measured_s"] for p in pts], marker, color=color,
                    label=f"measured, {mode} {dist}")
            ax.plot(ks, [p["expected_s"] for p in pts], ":", color=color,
                    label=("expected S c (1-(1-1/S)^K)" if mode == "concurrent"
                           else "expected K c") + f", {dist}")
        ax.set_xlabel("concurrent requests K (count)")
        ax.set_ylabel("SE shard retraining compute (s)")
        ax.set_title(f"{dataset}: SE retraining vs K")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({p["K"] for p in mine}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def storage(block: dict | None, path: Path) -> bool:
    """Server storage (bytes, log scale) and communication seconds."""
    if not block:
        return False
    names = [n for n, v in block["server_bytes"].items() if v is not None]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    ax.bar(names, [block["server_bytes"][n] / 1e6 for n in names],
           color=[COLORS.get(n) for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("server storage (MB, log scale)")
    ax.set_xlabel("framework")
    ax.set_title("Server storage")
    for i, n in enumerate(names):
        ax.text(i, block["server_bytes"][n] / 1e6, f"{block['server_bytes'][n]:,} B",
                ha="center", va="bottom", fontsize=7)
    ax = axes[1]
    comm_names = [n for n, v in block["comm_s"].items() if v is not None]
    unlearn = [block["comm_s"][n] for n in comm_names]
    dist = [block.get("distribution_s") or 0.0 if n == "SE coded" else 0.0
            for n in comm_names]
    ax.bar(comm_names, unlearn, color=[COLORS.get(n) for n in comm_names],
           label="unlearning (model transfers; coded: + slice retrieval)")
    ax.bar(comm_names, dist, bottom=unlearn, color="#bbbbbb",
           label="slice distribution during learning")
    ax.set_ylabel("modelled communication time (s)")
    ax.set_xlabel("framework")
    ax.set_title("Communication time (0.1 s + bits / link rate per transfer)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def storage_sweep(rows: Sequence[dict], path: Path) -> bool:
    """Server storage against clients C (at max G) and rounds G (at min C)."""
    rows = [r for r in rows if r.get("fe_server")]
    if not rows:
        return False
    g_max = max(r["rounds"] for r in rows)
    c_min = min(r["clients"] for r in rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    series = ((FE_KEY, "fe_server"), ("SE uncoded", "se_uncoded_server"),
              ("SE coded", "se_coded_server"))
    for ax, fixed, var, label in ((axes[0], ("rounds", g_max), "clients",
                                   "clients C (count)"),
                                  (axes[1], ("clients", c_min), "rounds",
                                   "global rounds G (count)")):
        pts = sorted((r for r in rows if r[fixed[0]] == fixed[1]), key=lambda r: r[var])
        xs = [r[var] for r in pts]
        for name, key in series:
            ys = [r.get(key) for r in pts]
            if all(y is not None for y in ys):
                ax.plot(xs, [y / 1e6 for y in ys], "o-", color=COLORS.get(name),
                        label=f"{name} server")
        client = [r.get("se_coded_client_max") for r in pts]
        if all(c is not None for c in client):
            ax.plot(xs, [c / 1e6 for c in client], "x--", color="#8c564b",
                    label="SE coded, per client (max)")
        ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.set_xlabel(label)
        ax.set_ylabel("storage (MB, log scale)")
        ax.set_title(f"Storage vs {var} ({fixed[0]} = {fixed[1]})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)
