"""The paper's experiment suite: single, concurrent and storage experiments.

``python -m experiments.run NAME --suite quick|trained|paper --out DIR`` (or
``./simulate.sh experiments NAME``) runs every configuration of an experiment as
one run of the real ServerApp / ClientApp, then writes raw results (JSON, CSV),
figures (PNG) and ``report.md`` beside the paper's headline figures.
"""
