"""Plug-in tasks shipped as worked examples (``task = "examples.<module>:task"``).

Outside the core packages: nothing in ``server_app/``, ``client_app/`` or ``task/``
imports them; a run names one in its run config (docs/TASKS.md).
"""
