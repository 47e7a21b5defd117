"""report.md's split of each sharded framework's distance to FR (issue 42, item 1).

Where the exact shard reference (SISA) ran beside FR, the distance of a sharded
framework to FR is the price of isolation (SISA - FR: S models, each on 1/S of
the data) plus the price of its approximation (the framework - SISA).
"""

from __future__ import annotations

from collections.abc import Sequence

from experiments.pareto import metric
from experiments.report.cells import md_table
from server_app.config import methods


def gap_section(rows: Sequence[dict]) -> list[str]:
    """The split per run; ``[]`` where no run has both FR and the exact shard reference.

    Accuracy in points, or test loss in nats where the run's task is read by its
    loss (``metric``); a sharded framework is one that does not run on the
    baseline federation.
    """
    ref, exact = methods.reference(), methods.shard_reference()
    by_run: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_run.setdefault(row["run"], {})[row["framework"]] = row
    table = []
    for run, fw in by_run.items():
        if ref not in fw or exact not in fw:
            continue
        key, scale, unit = metric(fw[ref])
        if fw[ref].get(key) is None or fw[exact].get(key) is None:
            continue
        iso = (fw[exact][key] - fw[ref][key]) * scale
        for name, row in fw.items():
            if name in ("original", ref, exact) or methods.has(name, "on_baseline") \
                    or row.get(key) is None:
                continue
            approx = (row[key] - fw[exact][key]) * scale
            table.append([run, name, f"{iso:+.2f} {unit}", f"{approx:+.2f} {unit}",
                          f"{iso + approx:+.2f} {unit}"])
    if not table:
        return []
    return ["", f"## The distance to {ref} in two", "",
            f"Per run: the price of isolation ({exact} - {ref}: the exact shard "
            f"reference, each impacted shard retrained from W^0, against retraining "
            f"the whole federation) and the price of approximation (the framework - "
            f"{exact}); they add up to the framework's distance to {ref}. Test "
            "accuracy in points, test loss in nats where the task is read by its loss "
            "(lower is better).", "",
            md_table(["run", "framework", f"isolation ({exact} - {ref})",
                      f"approximation (- {exact})", f"total (- {ref})"], table)]
