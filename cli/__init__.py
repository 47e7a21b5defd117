"""The project's command line: ``python -m cli run|test|deploy|forget|...``.

``./simulate.sh`` sets up ``.venv`` and calls it. Modules: :mod:`cli.config`
(run-config merging with Flower's parser), :mod:`cli.procs` (process groups and
their stop), :mod:`cli.simulation` (``run``), :mod:`cli.deploy` (``deploy``).
"""
