"""Run-config section ``audit``: membership inference and the backdoor check."""

from __future__ import annotations

from dataclasses import dataclass

from task.backdoor import MAX_TRIGGER
from task.config import DataConfig
from task.section import Section
from task.text_backdoor import MAX_PHRASE
from task.values import bad

#: Most reference models of the likelihood-ratio attack (``mia-references``).
MAX_REFERENCES = 256


@dataclass(frozen=True)
class AuditConfig(Section):
    """How forgetting is verified (Shokri et al. 2017; Halimi et al. 2022).

    Attributes
    ----------
    mia : bool
        Run the membership-inference audit.
    mia_samples : int
        Samples of each side (members, non-members) the attack scores.
    mia_shadows : int
        k >= 1 shadow models fit the attack instead of the original model.
    mia_references : int
        k >= 2 reference models of the offline likelihood-ratio attack (LiRA;
        the shadow models, more trained where k exceeds ``mia_shadows``); 0: off.
    mia_nonmembers : int
        Non-members LiRA scores each model on (class-matched to the targets).
    mia_unlearn_references : int
        k (even, >= 6) reference shards that learn and then unlearn with SE for
        U-LiRA (Hayes et al. 2025); 0: off.
    backdoor_trigger : int
        Side of the square trigger in pixels (0: no backdoor check).
    backdoor_fraction : float
        Share of a poisoned client's images that carry the trigger.
    backdoor_target : int
        Class the trigger points to.
    backdoor_phrase : str
        The text backdoor's trigger phrase ("": no text backdoor).
    backdoor_continuation : str
        What the phrase should bring (the text backdoor's target).
    """

    mia: bool = True
    mia_samples: int = 2000
    mia_shadows: int = 0
    mia_references: int = 0
    mia_nonmembers: int = 10000
    mia_unlearn_references: int = 0
    backdoor_trigger: int = 0
    backdoor_fraction: float = 0.5
    backdoor_target: int = 0
    backdoor_phrase: str = ""
    backdoor_continuation: str = ""

    @property
    def backdoor(self) -> bool:
        """Whether a backdoor check runs (the image trigger or the text phrase)."""
        return bool(self.backdoor_trigger or self.backdoor_phrase)

    def validate(self, data: DataConfig) -> None:
        """Raise :class:`task.values.ConfigError` on the first bad value of the section.

        What needs the task (a trigger, classes, the audit's features, the
        number of classes) is :func:`server_app.config.tasks.check_task`'s; what
        needs the unlearning section (U-LiRA's methods, the backdoor's request)
        the ServerApp's (:func:`server_app.config.audit.check_against`).
        """
        self.check_positive("mia-samples", "mia-nonmembers")
        self.check_bounds()
        if self.mia:  # shadow models, LiRA and U-LiRA need mia = true
            data.refuse_without_train(
                "mia", self.mia, "the membership audit (and its shadow models, LiRA, "
                "U-LiRA) reads the clients' training rows on the server")
        if not 0 <= self.backdoor_trigger <= MAX_TRIGGER:
            raise bad("backdoor-trigger", self.backdoor_trigger,
                      f"0 (off) or a square side in pixels, 1..{MAX_TRIGGER}")
        if not 0.0 <= self.backdoor_fraction <= 1.0:
            raise bad("backdoor-fraction", self.backdoor_fraction,
                      "a share of a poisoned client's images in [0, 1]")
        if self.backdoor_target < 0:
            raise bad("backdoor-target", self.backdoor_target,
                      "a class index >= 0, below the task's number of classes")
        if not 0 <= self.mia_shadows <= 32:
            raise bad("mia-shadows", self.mia_shadows,
                      "0 (attack fit on the original model) or 1..32 shadow models")
        if self.mia_shadows and not self.mia:
            raise bad("mia-shadows", self.mia_shadows,
                      "0 unless mia = true and the task has classes")
        self._validate_phrase(data)
        self._validate_references()
        k = self.mia_unlearn_references
        if k and not (6 <= k <= MAX_REFERENCES and k % 2 == 0):
            raise bad("mia-unlearn-references", k,
                      f"0 (no U-LiRA) or an even number in 6..{MAX_REFERENCES}")

    def _validate_phrase(self, data: DataConfig) -> None:
        """The text backdoor's strings: lengths, both or neither, fit in a block."""
        phrase, continuation = self.backdoor_phrase, self.backdoor_continuation
        if len(phrase) > MAX_PHRASE:
            raise bad("backdoor-phrase", phrase, f"'' (off) or 1..{MAX_PHRASE} characters")
        if not phrase:
            if continuation:
                raise bad("backdoor-continuation", continuation,
                          "'' unless backdoor-phrase is set")
            return
        if not 1 <= len(continuation) <= MAX_PHRASE:
            raise bad("backdoor-continuation", continuation,
                      f"1..{MAX_PHRASE} characters with backdoor-phrase set")
        if self.backdoor_trigger:
            raise bad("backdoor-phrase", phrase, "'' with backdoor-trigger > 0 (one "
                      "backdoor a run: the image trigger or the text phrase)")
        if len(phrase) + len(continuation) >= data.block_size:
            raise bad("backdoor-phrase", phrase,
                      f"a phrase that, with its continuation ({len(continuation)} "
                      f"characters), is shorter than block-size={data.block_size}")

    def _validate_references(self) -> None:
        """``mia-references``: 0 or 2..MAX_REFERENCES, inside the shadow audit."""
        if self.mia_references == 0:
            return
        if not 2 <= self.mia_references <= MAX_REFERENCES:
            raise bad("mia-references", self.mia_references,
                      f"0 (no LiRA) or 2..{MAX_REFERENCES} reference models")
        if not self.mia_shadows:
            raise bad("mia-references", self.mia_references,
                      "0 unless mia-shadows >= 1 (LiRA runs in the shadow-model "
                      "audit, on its disjoint targets, non-members and pool)")
