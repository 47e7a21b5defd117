"""U-LiRA's references through the run's own strategies (issue 53, step 1).

A reference learns as a shard learns and a method unlearns it with the strategy a
real request runs (:mod:`server_app.stages.references`), not a second
implementation of the method.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from experiments.grid import set_task_identity
from server_app.config import RunConfig
from server_app.stages.references import (
    ReferenceGrid,
    learn_reference,
    recipe,
    unlearn_reference,
)
from server_app.unlearning.frameworks import rebuild_shard_model
from task.config import fused_run_config
from tests.conftest import TINY


@pytest.fixture(autouse=True)
def _identity():
    set_task_identity()  # replies are Messages, stamped with a run


def _tiny(num_rounds: int, **overrides):
    cfg = RunConfig.from_run_config(fused_run_config(
        {**TINY, "num-rounds": num_rounds, "clients-per-round": 6, "num-shards": 2,
         **overrides}))
    torch.manual_seed(0)
    parts = [(torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,))) for _ in range(3)]
    task = type("T", (), {"num_classes": 10})()
    return cfg, task, parts


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_reference_learns_through_the_round_loop_into_its_own_history():
    """Every round's participants and updates are stored; the final model is the
    stored record's FedAvg steps; the same seed learns the same model."""
    cfg, task, parts = _tiny(num_rounds=2)
    final, learned = learn_reference(cfg, task, parts, seed=3, per_round=2)
    store = learned.stage.sharded_store
    assert store.rounds(0) == [1, 2]
    assert all(len(store.participants(0, g)) == 2 for g in (1, 2))
    assert all(n == 8 for g in (1, 2) for _, n in store.participants(0, g))
    rebuilt = rebuild_shard_model(store, 0, 2)
    assert all(np.allclose(rebuilt[k], final[k], atol=1e-6) for k in final
               if np.issubdtype(final[k].dtype, np.floating))
    assert {kind for _, kind in learned.grid.sent} == {"train"}
    again, _ = learn_reference(cfg, task, parts, seed=3, per_round=2)
    assert _same(final, again)
    other, _ = learn_reference(cfg, task, parts, seed=4, per_round=2)
    assert not _same(final, other)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SE", "SE-R"])
def test_a_method_unlearns_a_reference_with_its_own_strategy(name):
    """The forgotten client gets no message; the model changes; a client that never
    trained leaves the model as learned (None); seeded."""
    from server_app.unlearning.frameworks import build_framework
    from strategies.recovery import ShardRecovery
    from strategies.unlearning import ShardingEraser

    cfg, task, parts = _tiny(num_rounds=2, frameworks=f"{name},FR")
    final, learned = learn_reference(cfg, task, parts, seed=3, per_round=2)
    built = build_framework(name, learned.stage, {0}).strategy
    assert isinstance(built, {"SE": ShardingEraser, "SE-R": ShardRecovery}[name])
    trained = sorted({p for g in (1, 2) for p, _ in learned.stage.sharded_store
                      .participants(0, g)})
    forgotten = trained[0]
    before = len(learned.grid.sent)
    gone = unlearn_reference(name, learned, {forgotten})
    asked = learned.grid.sent[before:]
    assert gone is not None and not _same(gone, final)
    assert forgotten + 1 not in {node for node, _ in asked}
    assert all(np.isfinite(v).all() for v in gone.values()
               if np.issubdtype(v.dtype, np.floating))
    assert _same(gone, unlearn_reference(name, learned, {forgotten}))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SE", "SE-R"])
def test_forgetting_a_client_that_never_trained_leaves_the_reference_as_learned(name):
    cfg, task, parts = _tiny(num_rounds=1, frameworks=f"{name},FR")
    _, learned = learn_reference(cfg, task, parts, seed=3, per_round=1)
    [(trained, _)] = learned.stage.sharded_store.participants(0, 1)
    before = len(learned.grid.sent)
    assert unlearn_reference(name, learned, set(range(3)) - {trained}) is None
    assert len(learned.grid.sent) == before


@pytest.mark.slow
def test_fe_unlearns_a_reference_from_round_1_on_the_baseline_shape():
    cfg, task, parts = _tiny(num_rounds=2, frameworks="FE,FR")
    final, learned = learn_reference(cfg, task, parts, seed=5, per_round=3)
    before = len(learned.grid.sent)
    gone = unlearn_reference("FE", learned, {0})
    asked = learned.grid.sent[before:]
    assert gone is not None and not _same(gone, final)
    assert asked and {kind for _, kind in asked} == {"train.unlearn"}
    assert 1 not in {node for node, _ in asked}


def test_the_recipe_references_every_framework_that_is_not_exact():
    cfg, _, _ = _tiny(num_rounds=1, frameworks="SE,FR,FE,RR,SISA,SE-R,FRec")
    made = recipe(cfg)
    assert made.frameworks == ("SE", "FE", "SE-R", "FRec")
    assert {n: r.shape for n, r in made.rules.items()} == {
        "SE": "shard", "FE": "federation", "SE-R": "shard", "FRec": "federation"}
    assert set(made.exact) == {"FR", "RR", "SISA"}


def test_a_method_that_opts_out_is_not_referenced_nor_its_subclasses(monkeypatch):
    from server_app.config import methods
    from server_app.config.methods import UnlearningMethod

    class OptOut(UnlearningMethod):
        name = "OptOut"
        referenced = False

    class Child(OptOut):
        name = "Child"

    assert not OptOut.is_referenced() and not Child.is_referenced()
    cfg, _, _ = _tiny(num_rounds=1)
    cfg = cfg.replace(frameworks="SE,FR")
    monkeypatch.setattr(type(cfg.unlearning), "method_infos",
                        property(lambda self: [methods.registered("SE"), OptOut]))
    assert recipe(cfg).frameworks == ("SE",)


def test_a_reference_client_answers_only_training_messages():
    cfg, task, parts = _tiny(num_rounds=1)
    grid = ReferenceGrid(cfg.task(), parts, 10)
    assert grid.get_node_ids() == [1, 2, 3]
    from flwr.app import ConfigRecord, RecordDict

    message = grid.create_message(RecordDict({"config": ConfigRecord({})}),
                                  "evaluate", 1, "g")
    with pytest.raises(ValueError, match="not 'evaluate' to node 1"):
        grid.send_and_receive([message])


@pytest.mark.slow
def test_a_references_history_folder_is_removed_once_it_is_freed():
    cfg, task, parts = _tiny(num_rounds=1)
    _, learned = learn_reference(cfg, task, parts, seed=3, per_round=1)
    folder = learned.stage.sharded_store.root.parent  # the reference's own folder
    assert folder.name.startswith("se-reference.") and folder.exists()
    del learned
    gc.collect()
    assert not folder.exists()


def test_a_reference_whose_learning_fails_leaves_no_folder(monkeypatch, tmp_path):
    import tempfile

    from server_app.stages import references

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg, task, parts = _tiny(num_rounds=1)

    def fail(*args, **kwargs):
        raise RuntimeError("learning failed")

    monkeypatch.setattr(references, "run_learning", fail)
    with pytest.raises(RuntimeError, match="learning failed"):
        learn_reference(cfg, task, parts, seed=3, per_round=1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_audit_trains_its_references_with_the_recipe_unchanged():
    """The U-LiRA audit (:func:`audits.ulira_audit.train_references`) takes the
    recipe as it takes today's: every framework's references unlearn, each one's
    scores finite."""
    import dataclasses

    from audits.ulira_audit import train_references
    from server_app.stages.audit import audited_run

    cfg = RunConfig.from_run_config(fused_run_config(
        {**TINY, "num-rounds": 1, "frameworks": "SE,FE,FR", "mia-shadows": 2,
         "mia-unlearn-references": 6}))
    run = dataclasses.replace(audited_run(cfg), references=recipe(cfg))
    generator = torch.Generator().manual_seed(0)
    task = type("T", (), {"train_x": torch.rand(400, 1, 28, 28, generator=generator),
                          "train_y": torch.randint(0, 10, (400,), generator=generator),
                          "num_classes": 10})()
    sets = type("S", (), {"target": np.arange(20), "owner": np.repeat([1, 5], 10),
                          "shadow": np.arange(20, 400), "shadow_split": "train",
                          "shadow_source": "free rows"})()
    refs = train_references(run, task, sets, [[0, 1, 2, 3], [4, 5, 6, 7]],
                            client_size=10)
    assert set(refs.unlearned) == {"SE", "FE"}
    assert refs.learned.shape == refs.unlearned["SE"].shape == (6, 20)
    assert all(np.isfinite(phi).all() for phi in (refs.learned, *refs.unlearned.values()))
    assert not np.array_equal(refs.unlearned["SE"], refs.learned)


@pytest.mark.slow
def test_se_on_a_one_round_reference_is_the_preparation_step():
    """G = 1: SE's W' = W^0 + the retained participants' stored updates, weighted by
    their samples (paper eq. 2), from the stored record, asking no client."""
    from strategies.calibration import weighted_step

    cfg, task, parts = _tiny(num_rounds=1)
    final, learned = learn_reference(cfg, task, parts, seed=3, per_round=3)
    store = learned.stage.sharded_store
    assert sorted(p for p, _ in store.participants(0, 1)) == [0, 1, 2]
    before = len(learned.grid.sent)
    gone = unlearn_reference("SE", learned, {0})
    want = weighted_step(store.shard_model(0, 0), [store.update(0, 1, 1),
                                                   store.update(0, 1, 2)], [8, 8])
    assert all(np.allclose(gone[k], want[k], atol=1e-6) for k in want)
    assert not _same(gone, final)
    assert len(learned.grid.sent) == before


@pytest.mark.slow
@pytest.mark.parametrize(("name", "overrides"), [
    ("FRec", {}),
    ("SE", {"calibration-interval": 2}),
    ("SE", {"shard-strategy": "FedProx"}),
    ("SE-R", {"shard-strategy": "FedProx"}),
])
def test_references_follow_the_runs_own_settings(name, overrides):
    """FRec (on the federation shape), SE with FedEraser's interval, a FedProx shard:
    each reference unlearns with the run's strategy and settings, the forgotten
    client asked nothing."""
    cfg, task, parts = _tiny(num_rounds=3, frameworks=f"{name},FR", **overrides)
    final, learned = learn_reference(cfg, task, parts, seed=7, per_round=2)
    trained = {p for g in (1, 2, 3) for p, _ in
               learned.stage.sharded_store.participants(0, g)}
    forgotten = min(trained)
    before = len(learned.grid.sent)
    gone = unlearn_reference(name, learned, {forgotten})
    assert gone is not None and not _same(gone, final)
    assert forgotten + 1 not in {node for node, _ in learned.grid.sent[before:]}
    assert all(np.isfinite(v).all() for v in gone.values()
               if np.issubdtype(v.dtype, np.floating))


@pytest.mark.slow
def test_a_method_that_runs_no_round_from_another_model_is_scored_on_that_model(
        monkeypatch):
    """None means "the learned model stands"; a method whose framework starts
    elsewhere and runs no round is scored on where it starts."""
    from server_app.stages import references
    from server_app.unlearning.frameworks import Framework

    cfg, task, parts = _tiny(num_rounds=1)
    final, learned = learn_reference(cfg, task, parts, seed=3, per_round=1)
    start = learned.stage.initial  # W^0, not the learned model
    monkeypatch.setattr(references, "build_framework", lambda *a, **k: Framework(
        None, [start], 0, [0]))
    gone = unlearn_reference("SE", learned, {0})
    assert gone is not None and _same(gone, {k: v.numpy() for k, v in start.items()})
    monkeypatch.setattr(references, "build_framework", lambda *a, **k: Framework(
        None, list(learned.stage.sharded_models), 0, []))
    assert unlearn_reference("SE", learned, {0}) is None
