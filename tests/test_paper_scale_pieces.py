"""A paper-scale baselines cell run in pieces, then joined (paper-scale/run.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs/results/paper-scale"))
import run as paper_scale  # noqa: E402  (a script's folder, as its own sys.path has it)


def _piece(folder: Path, names: tuple[str, ...], **over) -> None:
    config = {"dataset": "cifar10", "seed": 0, "num-rounds": 30,
              "frameworks": ",".join(names), "run-name": f"baselines-{'-'.join(names)}-s0"}
    piece = {"cell": f"paper-cifar10-noniid-{'-'.join(names)}", "seed": 0,
             "commit": "abc", "fingerprint": "f1", "machine": {"cpu": "x"},
             "command": f"run.py cifar10 0 --baselines --only {','.join(names)}",
             "variants": {}, "config": config, "learned_accuracy": 0.5,
             "learned_loss": 1.5, "metric": "accuracy",
             "baseline_learned_accuracy": 0.45 if {"FE", "FRec"} & set(names) else None,
             "storage": {"model_bytes": 8, "FE": {"server_bytes": 3} if "FE" in names
                         else {"server_bytes": None, "source": "not run"}},
             "frameworks": {n: {"accuracy": 0.1 * (i + 1)} for i, n in enumerate(names)}}
    for key, value in over.items():
        (piece["config"] if key in config else piece)[key] = value
    (folder / "parts").mkdir(parents=True, exist_ok=True)
    path = folder / "parts" / f"explore-{piece['cell']}-s0.json"
    path.write_text(json.dumps(piece))


def test_pieces_that_cover_the_baselines_join_into_the_cells_file(tmp_path):
    _piece(tmp_path, ("FE", "FRec"))
    _piece(tmp_path, ("FR", "RR", "SE"))
    out = json.loads(paper_scale.merge("cifar10", folder=tmp_path).read_text())
    assert list(out["frameworks"]) == list(paper_scale.BASELINES)
    assert out["frameworks"]["FE"] == {"accuracy": 0.1}  # each from its own piece
    assert out["frameworks"]["RR"] == {"accuracy": 0.2}
    assert out["config"]["frameworks"] == "FR,FE,RR,FRec,SE"
    assert out["storage"] == {"model_bytes": 8, "FE": {"server_bytes": 3}}
    assert [p["file"] for p in out["parts"]] == [
        "parts/explore-paper-cifar10-noniid-FE-FRec-s0.json",
        "parts/explore-paper-cifar10-noniid-FR-RR-SE-s0.json"]


@pytest.mark.parametrize("second, why", [
    ({"names": ("FR", "RR")}, "must be in exactly one"),            # SE in no piece
    ({"names": ("FR", "FE", "RR", "SE")}, "must be in exactly one"),  # FE twice
    ({"learned_accuracy": 0.6}, "learned_accuracy"),                # another learning
    ({"fingerprint": "f2"}, "fingerprint"),                         # other code
    ({"num-rounds": 20}, "num-rounds"),                             # other settings
    ({"storage": {"model_bytes": 9}}, "storage 'model_bytes'"),     # another model
    ({"baseline_learned_accuracy": 0.4}, "unsharded learnings differ"),
])
def test_pieces_that_do_not_make_one_cell_are_refused(tmp_path, second, why):
    _piece(tmp_path, ("FE", "FRec"))
    names = second.pop("names", ("FR", "RR", "SE"))
    if "baseline_learned_accuracy" in second:  # FRec's own piece, another learning
        names = ("FR", "RR", "FRec", "SE")
        _piece(tmp_path, ("FE",))
        (tmp_path / "parts/explore-paper-cifar10-noniid-FE-FRec-s0.json").unlink()
    _piece(tmp_path, names, **second)
    with pytest.raises(paper_scale.PieceError, match=why):
        paper_scale.merge("cifar10", folder=tmp_path)
    assert not (tmp_path / "explore-paper-cifar10-noniid-s0.json").exists()
