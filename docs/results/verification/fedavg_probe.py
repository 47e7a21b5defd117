"""Probe (issue 13): does FedAvg keep one client's backdoor? usage: K NPOIS FRAC L ROUNDS.

K MNIST IID clients of 300 images (partition of 20 clients, seed 0), the first NPOIS
poisoned (4x4 trigger, FRAC of their images, target 0), ROUNDS of FedAvg with all K
clients x L local epochs (lr 0.05, momentum 0.5, batch 32); prints the ASR on 2000
triggered test images after each round. Run from the repository root with
``SE_DATA_DIR`` set and ``PYTHONPATH=.``.
"""

from __future__ import annotations

import copy
import sys

import torch

from task.backdoor import Backdoor, attack_success_rate, poison, triggered_test_set
from task.builtin import build_model, load_task_data
from task.data import client_data
from task.train import local_train, predict_proba
from task.training_settings import TrainingSettings


def main(k: int, npois: int, frac: float, epochs: float, rounds: int) -> None:
    """Print ``k npois frac epochs round asr`` after each FedAvg round."""
    torch.set_num_threads(1)
    task = load_task_data("mnist")
    backdoor = Backdoor(4, frac, 0, tuple(range(npois)))
    data = []
    for pid in range(k):
        x, y = client_data(task, pid, 20, "iid", 0)
        x, y, _ = poison(x[:300], y[:300], backdoor, 0, pid)
        data.append((x, y))
    torch.manual_seed(0)
    model = build_model("mnist", 10)
    x_test = triggered_test_set(task.test_x[:2000], task.test_y[:2000], backdoor)
    for rnd in range(rounds):
        states = []
        for pid, (x, y) in enumerate(data):
            local = copy.deepcopy(model)
            local_train(local, x, y, TrainingSettings(
                lr=0.05, local_epochs=epochs, batch_size=32, momentum=0.5),
                seed=rnd * 100 + pid)
            states.append(local.state_dict())
        model.load_state_dict({n: sum(s[n] for s in states) / k for n in states[0]})
        asr = attack_success_rate(predict_proba(model, x_test), 0)
        print(k, npois, frac, epochs, rnd, round(asr, 3), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]),
         int(sys.argv[5]))
