"""Cost-only runs: the real ServerApp and strategies, clients that do not train.

A run's modelled times (:mod:`server_app.rounds.costs`) depend only on what each
round asked and what each reply reports: who took part, their ``num-examples``,
their ``local-epochs``, the bytes of the models and the updates combined. They do
not depend on the weights a client sends back, for every framework whose schedule
does not read them (``tests/test_costing.py`` checks which, against real runs).
So the modelled seconds of a request can be had without training: this ClientApp
answers a training message the way the real one does (same data share, same
erased records, same reply keys), but instead of ``local-epochs`` of SGD it sends
back the received model nudged by a small seeded step, and ``train-seconds`` 0.

That makes "what would SE save for *this* client?" cheap enough to ask for every
client of a federation at the paper's scale (``experiments/time_saved.py``). The
accuracy of a cost-only run means nothing and is never reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app.app import _erase, _received, discover, partition_id
from task.train import epoch_schedule
from task.training_settings import TrainingSettings

STEP = 1e-3
"""Size of the seeded step a cost-only client adds to each float parameter."""

app = ClientApp()
app.query("discover")(discover)


def _nudged(arrays: ArrayRecord, seed: tuple[int, ...]) -> ArrayRecord:
    """``arrays`` with ``STEP x N(0, 1)`` added to every floating-point array.

    The step keeps every update nonzero (calibration divides by an update's
    norm), drawn from ``seed`` so two cost-only runs send the same replies.
    """
    rng = np.random.default_rng(list(seed))
    out = {}
    for name, array in arrays.items():
        values = array.numpy()
        if np.issubdtype(values.dtype, np.floating):
            values = values + (STEP * rng.standard_normal(values.shape)).astype(
                values.dtype)
        out[name] = Array(np.ascontiguousarray(values))
    return ArrayRecord(out)


def _reply(message: Message, context: Context) -> Message:
    """The reply a trained client would send, less the training."""
    settings = TrainingSettings.from_record(message.content["config"])
    x, y, _, _, _ = _received(message, context, settings.data_dir)
    x, _ = _erase(x, y, message.content["config"])
    config = message.content["config"]
    seed = (int(settings.seed), partition_id(context), int(config.get("server-round", 0)),
            int(config.get("history-round", 0)))
    # local epochs as the real step reports them: samples seen / samples held
    seen = sum(epoch_schedule(len(x), settings.local_epochs, settings.batch_size))
    metrics = MetricRecord({"num-examples": len(x), "train-loss": 0.0,
                            "train-seconds": 0.0, "local-epochs": seen / len(x)})
    arrays = _nudged(message.content["arrays"], seed)
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}),
                   reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """Learning, cost only: the reply of ``local-epochs`` of training, untrained."""
    return _reply(message, context)


@app.train("unlearn")
def unlearn(message: Message, context: Context) -> Message:
    """Unlearning, cost only (``train.unlearn``)."""
    return _reply(message, context)


def cost_only_summary(run_config: Mapping[str, object], results_dir: Path) -> dict:
    """Run ``run_config`` with cost-only clients in ``results_dir``; its summary.json.

    Parameters
    ----------
    run_config : Mapping[str, object]
        Kebab-case run-config keys; ``mia`` is turned off (an audit trains
        reference models for real).
    results_dir : Path
        Where the run folder goes (``run-name`` from ``run_config``, default
        ``cost-only``).

    Returns
    -------
    dict
        The summary; only its cost keys (``modelled_wall_s``, ``wall_breakdown``,
        ``client_epochs``, ``rounds_replayed``, ``requests``) mean anything.
    """
    import json

    from experiments.grid import run_in_process

    config = {"run-name": "cost-only", **run_config, "mia": False,
              "results-dir": str(results_dir)}
    return json.loads(run_in_process(config, client_app=app).read_text())
