"""docs/RESULTS.md's "Forgetting verified" tables, from docs/results/verification/.

Files: ``verify-seed<S>.json`` (``--preset verify``: clients 2 and 6 stamp a
backdoor trigger and are then forgotten), ``verify-clean-seed<S>.json`` (the same
with ``backdoor-fraction = 0.0`` and SE only: the clean model's ASR) and
``memorize-seed<S>.json`` (``--preset memorize``: Shokri's attack, offline LiRA and
U-LiRA on the 200 forgotten samples), each the run's summary.json as
``docs/results/verification/run_inprocess.py PRESET OUT seed=S`` wrote it. Mean ±
sample standard deviation (n - 1) over the seeds; FR's band and the equivalence
test are :mod:`experiments.band`'s. ``python -m experiments.verified_tables``
prints the block; ``--write`` puts it between the markers in docs/RESULTS.md
(``tests/test_docs_claims.py`` compares them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean

from experiments import band
from experiments.doc_tables import replace_block, spread_text
from experiments.erasure_tables import wall_ratio
from server_app.config import methods

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "docs" / "results" / "verification"
RESULTS = ROOT / "docs" / "RESULTS.md"
BEGIN = ("<!-- verified: made by `python -m experiments.verified_tables --write` from "
         "docs/results/verification/; do not edit by hand -->")
END = "<!-- end of verified -->"
SE, FR = methods.proposed(), methods.reference()
GOALS = {"original_asr": 0.80, "fr_over_clean": 0.10, "se_asr_gap": 0.05,
         "original_auc": 0.60, "fr_auc": 0.55, "se_auc_gap": 0.05,
         "lira_tpr": 0.10, "lira_auc": 0.70}
"""Issue 13's goals (backdoor ASR, Shokri AUC) and issue 27's (offline LiRA on the
model before forgetting), fixed before these runs."""


def _load(pattern: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(HERE.glob(pattern))]


def _seeds(runs: list[dict]) -> str:
    return ", ".join(str(r["config"]["seed"]) for r in runs)


def _commits(runs: list[dict]) -> str:
    return ", ".join(sorted({str(r.get("commit", "not recorded"))[:7] for r in runs}))


def _models(runs: list[dict]) -> list[tuple[str, list[dict]]]:
    """``original`` and each framework, with its block in every run."""
    out = [("original", [r["original"] for r in runs])]
    return out + [(n, [r["frameworks"][n] for r in runs]) for n in runs[0]["frameworks"]]


def _per_seed(blocks: list[dict], key: str) -> str:
    return ", ".join(f"{b[key]:.3f}" for b in blocks)


def _verdict(ok: bool) -> str:
    return "reached" if ok else "**not reached**"


def backdoor(runs: list[dict], clean: list[dict]) -> list[str]:
    """ASR per model (``--preset verify``), the clean model's beside it, and the goals."""
    out = [f"`--preset verify`, seeds {_seeds(runs)} (commit {_commits(runs)}); the "
           f"clean reference seeds {_seeds(clean)}. ASR: the impacted shard's model "
           "(unsharded frameworks: their one model); wall / FR: the mean of the per-seed "
           "ratios of modelled wall time.", "",
           "| model | accuracy | backdoor ASR | ASR of the ensemble | ASR per seed | "
           "client-epochs | wall / FR |", "|---|---|---|---|---|---|---|"]
    fr = [r["frameworks"][FR] for r in runs]
    rows = _models(runs)
    own = [r["baseline_learning"] for r in runs]
    rows.insert(1, ("FE's own original (unsharded)", own))
    rows.insert(2, ("clean original (nothing stamped)", [r["original"] for r in clean]))
    for name, blocks in rows:
        ensemble = (spread_text([b["backdoor_asr_ensemble"] for b in blocks])
                    if "backdoor_asr_ensemble" in blocks[0] else "")
        cost = (f"{mean(b['client_epochs'] for b in blocks):.1f} | {wall_ratio(blocks, fr)}"
                if "modelled_wall_s" in blocks[0] else " | ")
        out.append(f"| {name} | {spread_text([b['accuracy'] for b in blocks])} | "
                   f"{spread_text([b['backdoor_asr'] for b in blocks])} | {ensemble} | "
                   f"{_per_seed(blocks, 'backdoor_asr')} | {cost} |")
    orig = [r["original"]["backdoor_asr"] for r in runs]
    above = sum(a >= GOALS["original_asr"] for a in orig)
    clean_asr = mean(r["original"]["backdoor_asr"] for r in clean)
    fr_asr = mean(b["backdoor_asr"] for b in fr)
    gap = mean(r["frameworks"][SE]["backdoor_asr"] for r in runs) - fr_asr
    return out + ["", (
        f"Goals (issue 13): the original's ASR at least {GOALS['original_asr']}: "
        f"{mean(orig):.3f} on the mean, {above} of {len(orig)} seeds "
        f"({_verdict(above == len(orig))} on every seed); {FR} at most "
        f"{GOALS['fr_over_clean']} above the clean model: {fr_asr:.3f} against "
        f"{clean_asr:.3f} ({_verdict(fr_asr - clean_asr <= GOALS['fr_over_clean'])}); "
        f"{SE} within {GOALS['se_asr_gap']} of {FR}: {gap:+.3f} "
        f"({_verdict(abs(gap) <= GOALS['se_asr_gap'])})."), ""]


def shokri(runs: list[dict]) -> list[str]:
    """Shokri's shadow-model attack per model (``--preset memorize``) and the goals."""
    out = [f"`--preset memorize`, seeds {_seeds(runs)} (commit {_commits(runs)}): "
           "Shokri's attack, each model on its own (sharded: the target's shard).", "",
           "| model | accuracy | MIA AUC | MIA F1 | TPR at 1% FPR | AUC per seed | "
           "client-epochs | wall / FR |", "|---|---|---|---|---|---|---|---|"]
    fr = [r["frameworks"][FR] for r in runs]
    for name, blocks in _models(runs):
        cost = (f"{mean(b['client_epochs'] for b in blocks):.1f} | {wall_ratio(blocks, fr)}"
                if "modelled_wall_s" in blocks[0] else " | ")
        out.append(f"| {name} | {spread_text([b['accuracy'] for b in blocks])} | "
                   f"{spread_text([b['mia_auc'] for b in blocks])} | "
                   f"{spread_text([b['mia_f1'] for b in blocks])} | "
                   f"{spread_text([b['mia_tpr_at_1fpr'] for b in blocks])} | "
                   f"{_per_seed(blocks, 'mia_auc')} | {cost} |")
    orig = mean(r["original"]["mia_auc"] for r in runs)
    fr_auc = mean(b["mia_auc"] for b in fr)
    gap = mean(r["frameworks"][SE]["mia_auc"] for r in runs) - fr_auc
    return out + ["", (
        f"Goals (issue 13): the original's AUC at least {GOALS['original_auc']}: "
        f"{orig:.3f} ({_verdict(orig >= GOALS['original_auc'])}); {FR} at most "
        f"{GOALS['fr_auc']}: {fr_auc:.3f} ({_verdict(fr_auc <= GOALS['fr_auc'])}); "
        f"{SE} within {GOALS['se_auc_gap']} of {FR}: {gap:+.3f} "
        f"({_verdict(abs(gap) <= GOALS['se_auc_gap'])}). One AUC over 200 targets "
        "and 200 non-members has a standard error of about 0.03 at chance."), ""]


def _read(blocks: list[dict], key: str) -> str:
    values = [b[key] for b in blocks if isinstance(b.get(key), (int, float))]
    return spread_text(values) if values else "not read"


def lira(runs: list[dict]) -> list[str]:
    """Offline LiRA per example and per client, and U-LiRA, per model, and the goals."""
    first = runs[0]["original"]
    out = [f"The same runs: offline LiRA, per example ({first['mia_lira_n_member']} "
           f"targets against {first['mia_lira_n_nonmember']:,} non-members of their "
           f"classes) and per forgotten client (against "
           f"{first['mia_lira_client_n_nonmember']} pseudo-clients).", "",
           "| model | LiRA AUC | TPR at 1% FPR | TPR at 0.1% FPR | client AUC | "
           "client TPR at 1% FPR |", "|---|---|---|---|---|---|"]
    keys = ("mia_lira_auc", "mia_lira_tpr_at_1fpr", "mia_lira_tpr_at_01fpr",
            "mia_lira_client_auc", "mia_lira_client_tpr_at_1fpr")
    for name, blocks in _models(runs):
        out.append(f"| {name} | " + " | ".join(_read(blocks, k) for k in keys) + " |")
    out += ["", "U-LiRA: each approximate framework's own references, unlearned with "
            "its own strategy (FR and RR retrain without the forgotten clients: exact by "
            "construction, not referenced); the game on the references, and the run's "
            "own model against the game's never-seen negatives.", "",
            "| model | game AUC | game TPR at 1% FPR | run's model AUC | run's model "
            "TPR at 1% FPR |", "|---|---|---|---|---|"]
    keys = ("mia_ulira_game_auc", "mia_ulira_game_tpr_at_1fpr", "mia_ulira_auc",
            "mia_ulira_tpr_at_1fpr")
    for name, blocks in _models(runs):
        if any(isinstance(b.get(keys[0]), (int, float)) for b in blocks):
            out.append(f"| {name} | " + " | ".join(_read(blocks, k) for k in keys) + " |")
    tpr = mean(r["original"]["mia_lira_tpr_at_1fpr"] for r in runs)
    auc = mean(r["original"]["mia_lira_auc"] for r in runs)
    return out + ["", (
        f"Goals (issue 27), on the model before forgetting: per-example TPR at 1% FPR "
        f"at least {GOALS['lira_tpr']}: {tpr:.3f} ({_verdict(tpr >= GOALS['lira_tpr'])}); "
        f"AUC at least {GOALS['lira_auc']}: {auc:.3f} "
        f"({_verdict(auc >= GOALS['lira_auc'])})."), ""]


def fr_band(memorize: list[dict], verify: list[dict]) -> list[str]:
    """SE's mean per metric against FR's band over the seeds, with TOST."""
    rows = [r for r in band.compare(memorize) + band.compare(verify) if r["model"] == SE]
    inside = sum(r["inside_band"] for r in rows)
    above = [r["metric"] for r in rows if r["mean"] > r["fr_band"][1]]
    return [f"{SE} against {FR}'s band (`experiments/band.py`: FR's lowest and highest "
            "value over the seeds; two one-sided Welch t-tests, level "
            f"{band.ALPHA}, with margins fixed before the runs); every model's rows: "
            "`docs/results/band/*.json`.", "", band.markdown(rows), "",
            f"Goal (issue 27): {SE} inside {FR}'s band on every metric: {inside} of "
            f"{len(rows)} ({_verdict(inside == len(rows))}); above its highest value "
            f"(more signal than FR ever gave) on {len(above)}"
            + (f": {', '.join(above)}." if above else "."), ""]


def block() -> str:
    """The generated block: what the files here hold (or that they are missing)."""
    verify, clean = _load("verify-seed*.json"), _load("verify-clean-seed*.json")
    memorize = _load("memorize-seed*.json")
    out = backdoor(verify, clean) if verify and clean else [
        "The backdoor runs are not committed.", ""]
    if memorize:
        out += shokri(memorize) + lira(memorize)
    else:
        out += ["The membership runs are not committed.", ""]
    if memorize and verify:
        out += fr_band(memorize, verify)
    return "\n".join(out)


def write(page: Path = RESULTS) -> None:
    """Put :func:`block` between :data:`BEGIN` and :data:`END` in ``page``."""
    replace_block(page, BEGIN, END, block())


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        write()
    else:
        print(block())
