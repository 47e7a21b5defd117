"""The run's own expected ends: learning or unlearning that did nothing, or diverged.

:class:`RunStoppedError` is the base the ServerApp's boundary
(:mod:`server_app.failures`) knows them by; each wing that can end so raises a
subclass (:class:`server_app.rounds.learning.LearningStalledError`,
:mod:`server_app.unlearning.driver`'s).
"""


class RunStoppedError(RuntimeError):
    """An expected end of the run itself: it learned or unlearned nothing, or diverged.

    Learning whose every reply was rejected (non-finite updates from a learning
    rate too large, say), unlearning that accepted no reply, an unlearned model
    with NaN or infinite parameters. Exit status 1: a retry with other settings
    may succeed.
    """
