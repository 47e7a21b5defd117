"""FedRetrain's band over seeds, and an equivalence test per verification metric.

Retraining from scratch (FR) is what exact unlearning must look like, but one FR
run is one draw: its membership-inference and backdoor figures move with the
seed. Several runs of one setting that differ only in ``seed`` give, per
verification metric, FR's band (its lowest and highest value over the seeds);
each other model's mean over its seeds is read against that band, and two
one-sided Welch t-tests (TOST; Schuirmann, J. Pharmacokin. Biopharm. 15, 1987)
test whether its difference from FR's mean is smaller than the metric's margin
(:data:`MARGINS`, fixed before any run was read, never tuned).

usage: ``python -m experiments.band [--json OUT.json] SUMMARY.json [...]``
prints the table (markdown) and, with ``--json``, writes the rows.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from cli.terminal import Parser
from server_app.config import methods

MARGINS = {
    "mia_lira_auc": 0.05, "mia_lira_tpr_at_1fpr": 0.01, "mia_lira_tpr_at_01fpr": 0.005,
    "mia_lira_client_auc": 0.10, "mia_lira_client_tpr_at_1fpr": 0.25,
    "mia_auc": 0.05, "mia_tpr_at_1fpr": 0.01, "backdoor_asr": 0.02,
}
"""Equivalence margin per metric, in the metric's own units. AUCs: 0.05. TPR at
1% FPR: 0.01, the rate chance itself gives; at 0.1% FPR: 0.005, one of the 200
forgotten samples of ``--preset memorize``. Per client (4 forgotten clients):
AUC 0.10, TPR one client in four. Backdoor ASR: 0.02, issue 26's margin
between SE-R and FR."""

ALPHA = 0.05


@dataclass(frozen=True)
class Band:
    """One metric's values over seeds.

    ``low``/``high`` are the extremes, ``std`` the sample standard deviation
    (None for one value).
    """

    values: tuple[float, ...]
    low: float
    high: float
    mean: float
    std: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Band:
        """The band of ``values`` (at least one finite number).

        Raises:
            ValueError: no values, or one that is not a finite number.
        """
        vals = tuple(float(v) for v in values)
        if not vals or not all(math.isfinite(v) for v in vals):
            raise ValueError(f"a band needs finite values, got {list(values)!r}")
        return cls(vals, min(vals), max(vals), statistics.fmean(vals),
                   statistics.stdev(vals) if len(vals) > 1 else None)

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies inside ``[low, high]``."""
        return self.low <= value <= self.high


@dataclass(frozen=True)
class Equivalence:
    """TOST of ``mean(a) - mean(b)`` against ``(-margin, margin)`` at level ALPHA.

    ``p`` is the larger one-sided p-value; ``equivalent`` is ``p < ALPHA``; ``None``
    with its ``reason`` when a sample has fewer than two values.
    """

    diff: float
    margin: float
    p: float | None
    equivalent: bool | None
    reason: str = ""


def tost(a: Sequence[float], b: Sequence[float], margin: float) -> Equivalence:
    """Two one-sided Welch t-tests that ``|mean(a) - mean(b)| < margin``.

    When both samples have no spread (scipy's t is undefined), the difference is
    exact and decides alone (p 0 or 1).

    Raises:
        ValueError: ``margin`` not a positive finite number, an empty sample or
            one that is not finite.
    """
    from scipy import stats

    if not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a positive number, got {margin!r}")
    if not all(math.isfinite(x) for x in (*a, *b)) or not a or not b:
        raise ValueError(f"tost needs finite values in both samples, got {list(a)!r} "
                         f"and {list(b)!r}")
    diff = statistics.fmean(a) - statistics.fmean(b)
    if min(len(a), len(b)) < 2:
        return Equivalence(diff, margin, None, None, "fewer than 2 seeds")
    if statistics.pvariance(a) == statistics.pvariance(b) == 0:
        p = 0.0 if abs(diff) < margin else 1.0
        return Equivalence(diff, margin, p, p < ALPHA)
    lower = stats.ttest_ind([x + margin for x in a], b, equal_var=False,
                            alternative="greater").pvalue
    upper = stats.ttest_ind([x - margin for x in a], b, equal_var=False,
                            alternative="less").pvalue
    p = float(max(lower, upper))
    return Equivalence(diff, margin, p, p < ALPHA)


def check_same_setting(summaries: Sequence[dict]) -> None:
    """Refuse runs whose settings differ in more than ``seed`` and their paths.

    Keys that only some runs have (a key added to the app between the runs) are
    not compared: the run-config records what each run was given.

    Raises:
        ValueError: names the first key whose values differ, and the values.
    """
    ignore = {"seed", "run-name", "results-dir", "data-dir"}
    first = summaries[0]["config"]
    for other in summaries[1:]:
        for key in sorted((set(first) & set(other["config"])) - ignore):
            if first[key] != other["config"][key]:
                raise ValueError(f"runs differ in {key!r}: {first.get(key)!r} vs "
                                 f"{other['config'].get(key)!r} (only seed may differ)")


def values_by_model(summaries: Sequence[dict]) -> dict[str, dict[str, list[float]]]:
    """``{model: {metric: [value per run where read]}}``; ``original`` and each framework.

    A metric a run did not read (None, or absent) is left out of that run's values.
    """
    out: dict[str, dict[str, list[float]]] = {}
    for summary in summaries:
        blocks = {"original": summary.get("original", {}), **summary.get("frameworks", {})}
        for model, block in blocks.items():
            for metric in MARGINS:
                value = block.get(metric)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    out.setdefault(model, {}).setdefault(metric, []).append(float(value))
    return out


def compare(summaries: Sequence[dict]) -> list[dict]:
    """Each model's mean per metric against FR's band, with TOST against FR.

    Raises:
        ValueError: no summary, settings that differ beyond the seed, or no FR.
    """
    if not summaries:
        raise ValueError("no summaries given")
    check_same_setting(summaries)
    table, reference = values_by_model(summaries), methods.reference()
    if reference not in table:
        raise ValueError(f"no {reference} results in these runs: its band is the reference")
    rows = []
    for metric, margin in MARGINS.items():
        ref = table[reference].get(metric)
        if not ref:
            continue
        band = Band.of(ref)
        for model, metrics in table.items():
            if model == reference or metric not in metrics:
                continue
            own = Band.of(metrics[metric])
            test = tost(own.values, band.values, margin)
            rows.append({"metric": metric, "model": model, "seeds": len(own.values),
                         "mean": own.mean, "std": own.std, "fr_band": [band.low, band.high],
                         "fr_mean": band.mean, "fr_seeds": len(band.values),
                         "inside_band": band.holds(own.mean), **asdict(test)})
    return rows


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def markdown(rows: Sequence[dict]) -> str:
    """One line per metric and model: mean ± std, FR's band, inside, TOST."""
    lines = ["| metric | model | mean ± std (seeds) | FR band [low, high] (seeds) "
             "| inside | diff to FR | margin | TOST p | equivalent |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        spread = f" ± {r['std']:.3f}" if r["std"] is not None else ""
        verdict = ("yes" if r["equivalent"] else "no") if r["equivalent"] is not None \
            else r["reason"]
        lines.append(
            f"| {r['metric']} | {r['model']} | {r['mean']:.3f}{spread} ({r['seeds']}) "
            f"| [{r['fr_band'][0]:.3f}, {r['fr_band'][1]:.3f}] ({r['fr_seeds']}) "
            f"| {'yes' if r['inside_band'] else 'no'} | {r['diff']:+.3f} "
            f"| {r['margin']} | {_num(r['p'])} | {verdict} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); exit 2 on bad input."""
    parser = Parser(prog="python -m experiments.band",
                    description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("summaries", nargs="+", type=Path)
    args = parser.parse_args(argv)
    try:
        rows = compare([json.loads(p.read_text()) for p in args.summaries])
    except (OSError, ValueError, KeyError) as err:
        print(f"band: {err}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(
            {"runs": [str(p) for p in args.summaries], "rows": rows}, indent=1))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
