"""FedAvg probe of the text backdoor: one shard, the first NPOIS clients poisoned.

usage: python docs/results/text-backdoor/fedavg_probe.py K NPOIS FRAC L ROUNDS N PHRASE CONT
       [BLOCK [CLEAN]]
K Tiny Shakespeare clients (IID blocks of BLOCK characters, default 64; the first N
blocks each), every client every
round, L local epochs of Adam (lr 0.01, batch 8, as presets/shakespeare.toml);
prints after each round the test loss, the ASR of the shard model on 500 test
contexts ending in PHRASE, and then (CLEAN = 1, the default) the same for the clean
shard (the K - NPOIS clean clients alone).
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import torch

from task.builtin import SHAKESPEARE_VOCAB, TASKS, load_task_data
from task.data import client_data
from task.text import decode
from task.text_backdoor import (
    TextBackdoor,
    greedy_continuations,
    implant,
    text_attack_success_rate,
    trigger_contexts,
)
from task.train import local_seed, local_train, predict_proba
from task.training_settings import TrainingSettings


def fedavg(models, weights):
    """The example-weighted mean of state dicts."""
    total = sum(weights)
    return {k: sum(m[k] * (w / total) for m, w in zip(models, weights, strict=True))
            for k in models[0]}


def main(k, npois, frac, epochs, rounds, n, phrase, cont, block=64, clean=1):
    """Run the probe; print one line per round."""
    torch.set_num_threads(1)
    task = TASKS["shakespeare"]
    data = load_task_data("shakespeare", "/work/shared/data", block)
    backdoor = TextBackdoor.from_run_config(
        {"backdoor-phrase": phrase, "backdoor-continuation": cont,
         "backdoor-fraction": frac, "forget-clients": ",".join(map(str, range(npois)))},
        task.tokenize)
    clients = []
    for pid in range(k):
        x, y = client_data(data, pid, k, "iid", 0)
        x, y, _ = implant(x[:n], y[:n], backdoor, 0, pid)
        clients.append((x, y))
    contexts = trigger_contexts(data.test_x[:500], backdoor)
    torch.manual_seed(0)
    start = task.model(65).state_dict()
    phases = (("poisoned", range(k)), ("clean", range(npois, k)))[:2 if clean else 1]
    for name, members in phases:
        state = {kk: v.clone() for kk, v in start.items()}
        for g in range(1, rounds + 1):
            outs = []
            for pid in members:
                model = task.model(65)
                model.load_state_dict(state)
                local_train(model, *clients[pid], TrainingSettings(
                    lr=0.01, local_epochs=epochs, batch_size=8, optimizer="adam"),
                    seed=local_seed(0, "learn", g, pid))
                outs.append(model.state_dict())
            state = fedavg(outs, [1] * len(outs))
            model = task.model(65)
            model.load_state_dict(state)
            decoded = greedy_continuations([lambda s, m=model: predict_proba(m, s)],
                                           contexts, len(backdoor.continuation))
            asr = text_attack_success_rate(decoded, backdoor.continuation)
            proba = predict_proba(model, data.test_x[:500])
            loss = float(-np.log(np.take_along_axis(
                proba, data.test_y[:500].numpy()[..., None], -1)).mean())
            common = Counter(decode(row, SHAKESPEARE_VOCAB) for row in decoded)
            print(f"{name} round {g}: test loss {loss:.3f}  ASR {asr:.3f}  most decoded "
                  f"{common.most_common(2)}", flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), float(a[2]), float(a[3]), int(a[4]), int(a[5]), a[6], a[7],
         *map(int, a[8:10]))
