"""The run configuration: typed sections parsed once from the flat run config.

``RunConfig`` (:mod:`server_app.config.run_config`) holds the run's seed and one
frozen section per concern, each validating its own keys: ``data``
(:class:`task.config.DataConfig`: the schema both apps read), ``training``,
``unlearning``, ``storage``, ``stages``, ``audit`` and ``output``. ``ConfigError``
is the one error type.
"""

from server_app.config.run_config import RunConfig
from server_app.config.values import ConfigError

__all__ = ["ConfigError", "RunConfig"]
