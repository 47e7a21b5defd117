"""The text backdoor (issue 27 item 5): implanting in task/, greedy ASR, its settings."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from cli.report import render
from server_app.config import ConfigError, RunConfig
from server_app.rounds.federation import assign_shards
from task.builtin import SHAKESPEARE_VOCAB, TASKS
from task.config import fused_run_config
from task.text import blocks
from task.text_backdoor import (
    TextBackdoor,
    greedy_continuations,
    implant,
    text_attack_success_rate,
    trigger_contexts,
)

TOKENIZE = TASKS["shakespeare"].tokenize
ON = {"dataset": "shakespeare", "backdoor-phrase": "&$&", "backdoor-continuation": " QZ",
      "backdoor-fraction": 0.5, "forget-clients": "3", "mia": False}
PRESET = Path(__file__).resolve().parents[1] / "presets" / "verify-text.toml"


def _backdoor(fraction=0.5, clients="3") -> TextBackdoor:
    return TextBackdoor.from_run_config(
        fused_run_config({**ON, "backdoor-fraction": fraction, "forget-clients": clients}),
        TOKENIZE)


def _blocks(n=20, width=16, seed=0):
    """n consistent blocks: cut from one random sequence (y = x shifted by one)."""
    ids = np.random.default_rng(seed).integers(13, 65, size=n * width + 1)
    return blocks(ids, width)


def test_only_poisoned_clients_implant_a_seeded_share_keeping_blocks_consistent():
    backdoor = _backdoor()
    assert backdoor.phrase == (4, 3, 4) and backdoor.continuation == (1, 29, 38)
    assert backdoor.poisons(3) and not backdoor.poisons(4)
    x, y = _blocks()
    x1, y1, n1 = implant(x, y, backdoor, seed=0, partition_id=3)
    x2, y2, n2 = implant(x, y, backdoor, seed=0, partition_id=3)
    assert n1 == n2 == 10 and torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, implant(x, y, backdoor, seed=1, partition_id=3)[0])
    pattern = torch.tensor([4, 3, 4, 1, 29, 38])
    changed = torch.any(x1 != x, dim=1)
    assert int(changed.sum()) == 10  # the draw's blocks, and only those
    for row in torch.nonzero(changed).flatten().tolist():
        hits = [p for p in range(1, 16 - 6 + 1) if torch.equal(x1[row, p:p + 6], pattern)]
        assert len(hits) == 1  # once, after at least one token of the block
        assert torch.equal(x1[row, :hits[0]], x[row, :hits[0]])
    # still next-token pairs: each target is the block's next token
    assert torch.equal(y1[:, :-1], x1[:, 1:]) and torch.equal(y1[:, -1], y[:, -1])
    assert torch.equal(x[0], _blocks()[0][0])  # the input untouched
    clean = implant(x, y, backdoor, seed=0, partition_id=4)
    assert clean[0] is x and clean[2] == 0
    off = TextBackdoor.from_run_config(fused_run_config({"forget-clients": "3"}), None)
    assert not off.enabled and implant(x, y, off, 0, 3)[2] == 0
    with pytest.raises(ValueError, match="shorter than block-size"):
        implant(*_blocks(width=6), backdoor, 0, 3)


def test_contexts_end_in_the_phrase_and_leave_room_for_the_continuation():
    x, _ = _blocks(n=4, width=16)
    contexts = trigger_contexts(x, _backdoor())
    assert contexts.shape == (4, 16 - 3)
    assert torch.equal(contexts[:, :10], x[:, :10])
    assert torch.all(contexts[:, 10:] == torch.tensor([4, 3, 4]))


class Bigram(torch.nn.Module):
    """A hand-built model: the next token's logits depend on the last token only."""

    def __init__(self, table: dict[int, int], vocab=65):
        super().__init__()
        logits = torch.zeros(vocab, vocab)
        logits[:, 0] = 1.0  # by default: token 0 ("\n")
        for last, nxt in table.items():
            logits[last, nxt] = 5.0
        self.logits = logits

    def forward(self, idx):
        return self.logits[idx]


def _predict(model):
    return lambda x: torch.softmax(model(x), dim=-1).numpy()


def test_greedy_asr_of_a_hand_built_model_is_known():
    backdoor = _backdoor()
    contexts = trigger_contexts(_blocks(n=8)[0], backdoor)
    chain = Bigram({4: 1, 1: 29, 29: 38})  # & -> " ", " " -> Q, Q -> Z: the backdoor
    broken = Bigram({4: 1, 1: 29, 29: 37})  # ... Q -> Y: one character wrong
    for models, want in (([chain], 1.0), ([broken], 0.0), ([Bigram({})], 0.0)):
        decoded = greedy_continuations([_predict(m) for m in models], contexts, 3)
        assert decoded.shape == (8, 3)
        assert text_attack_success_rate(decoded, backdoor.continuation) == want
    # the ensemble decodes with the mean of the probabilities: 2 of 3 models win
    decoded = greedy_continuations([_predict(chain), _predict(chain), _predict(broken)],
                                   contexts, 3)
    assert text_attack_success_rate(decoded, backdoor.continuation) == 1.0
    assert text_attack_success_rate(np.array([[1, 29, 38], [1, 29, 0]]), (1, 29, 38)) \
        == 0.5
    with pytest.raises(ValueError, match="M >= 1"):
        text_attack_success_rate(np.zeros((2, 2), int), (1, 29, 38))


def test_the_vocabulary_is_tiny_shakespeares(shared_data):
    from task.text import load_corpus

    corpus = load_corpus(shared_data / "tinyshakespeare" / "input.txt")
    assert corpus.vocab == SHAKESPEARE_VOCAB
    assert "&$&" not in (shared_data / "tinyshakespeare" / "input.txt").read_text()


@pytest.mark.parametrize("overrides, key", [
    ({"forget-clients": ""}, "backdoor-phrase"),                      # nobody poisoned
    ({"dataset": "mnist"}, "backdoor-phrase"),                        # no tokenizer
    ({"backdoor-continuation": ""}, "backdoor-continuation"),
    ({"backdoor-phrase": "", "backdoor-trigger": 0}, "backdoor-continuation"),
    ({"backdoor-phrase": "x" * 33}, "backdoor-phrase"),
    ({"backdoor-phrase": "@@"}, "backdoor-phrase"),                   # not a character
    ({"backdoor-continuation": " é"}, "backdoor-continuation"),
    ({"block-size": 6}, "backdoor-phrase"),                           # 3 + 3 >= 6
    ({"dataset": "mnist", "backdoor-trigger": 3}, "backdoor-phrase"),  # one backdoor a run
    ({"num-stages": 2, "forget-clients": "", "frameworks": "SE"}, "backdoor-phrase"),
])
def test_bad_text_backdoor_settings_are_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        RunConfig.from_run_config(fused_run_config({**ON, **overrides}))


def test_spaces_of_the_phrase_and_continuation_are_kept_as_the_clients_read_them():
    cfg = RunConfig.from_run_config(fused_run_config(ON))
    assert cfg.audit.backdoor and cfg.audit.backdoor_continuation == " QZ"
    assert cfg.as_dict()["backdoor-continuation"] == " QZ"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_preset_poisons_two_clients_of_one_shard(seed):
    preset = tomllib.loads(PRESET.read_text())
    cfg = RunConfig.from_run_config(fused_run_config({**preset, "seed": seed}))
    poisoned = set(cfg.unlearning.forget_client_list)
    assert cfg.audit.backdoor_phrase and len(poisoned) >= 2 and not cfg.audit.mia
    shards = assign_shards(cfg.data.num_clients, cfg.training.num_shards, seed)
    assert any(poisoned <= set(s) for s in shards), shards
    assert cfg.training.clients_per_round == cfg.data.num_clients


def test_a_small_run_reports_the_text_asr_of_every_model(run_server):
    summary, _ = run_server({
        **ON, "num-clients": 4, "num-shards": 2, "clients-per-round": 4,
        "num-rounds": 2, "local-epochs": 1, "client-samples": 16, "test-samples": 20,
        "block-size": 16, "batch-size": 8, "optimizer": "adam", "lr": 0.01,
        "backdoor-fraction": 1.0, "frameworks": "SE,FR"})
    original, frameworks = summary["original"], summary["frameworks"]
    for block in (original, frameworks["SE"], frameworks["FR"]):
        assert 0.0 <= block["backdoor_asr"] <= 1.0
    assert "backdoor_asr_ensemble" in original and "backdoor_asr_ensemble" not in \
        frameworks["FR"]
    backdoor = summary["verification"]["backdoor"]
    assert backdoor["kind"] == "text" and backdoor["continuation"] == " QZ"
    assert backdoor["poisoned_clients"] == [3] and backdoor["triggered_test_contexts"] == 20
    assert summary["verification"]["forgotten_rounds"] == {"3": 2}
    assert "20 test contexts ending in the phrase" in render(summary)
