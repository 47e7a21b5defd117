"""Result files that claim today's defaults are remade when the defaults change.

A committed run's ``summary.json`` records the run config it ran with. For the
folders the README and docs/TASKS.md cite as what today's code does (the default
run, the plug-in examples), that config must equal what the same command resolves
to today (pyproject.toml < its preset): a default changed or a key added since
the run makes the file stale, and this test names the keys, so a reader never has
to find it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli import config as cli_config

ROOT = Path(__file__).resolve().parents[1]
CURRENT = {  # folder -> the preset its command names (None: none)
    "docs/results/default-run": None,
    "docs/results/examples/resnet": "resnet",
    "docs/results/examples/digits": "digits",
}
WHERE = ("run-name", "results-dir", "data-dir")
"""Keys that say where a run wrote and read, not what it ran."""


OFF = ("", 0)
"""A key added since a run, at one of these defaults (``""``, 0, 0.0, False),
leaves the run as it was (a new request kind, an audit not asked for); a key added
with any other default changed what the run does (e.g. ``calibration-final = 2``)."""


def stale_keys(recorded: dict, preset: str | None) -> dict[str, tuple]:
    """Key -> (recorded, today's) for every setting the two configs disagree on.

    A flat key a method's setting had before it was namespaced counts under its
    new name (``calibration-final`` as ``method.se.calibration-final``).
    """
    from server_app.config.methods import renamed_keys

    recorded = dict(recorded)
    for old, new in renamed_keys().items():
        if old in recorded:
            value = recorded.pop(old)
            recorded.update(dict.fromkeys((k for k in new if k not in recorded), value))
    today = dict(cli_config.resolve(preset, []).config)
    missing = "<absent>"
    unused = _settings_of_methods_not_run(recorded)
    return {k: (recorded.get(k, missing), today.get(k, missing))
            for k in sorted((set(recorded) | set(today)) - set(WHERE))
            if recorded.get(k, missing) != today.get(k, missing)
            and not (k not in recorded and (today[k] in OFF or k in unused))}


def _settings_of_methods_not_run(recorded: dict) -> set[str]:
    """``method.<key>.*`` keys of the built-ins not in the run's ``frameworks``.

    Only its own method reads a method's setting, so one added since (a new
    method, or a new setting of one the run did not run) cannot have shaped it.
    """
    from server_app.config.methods import builtins, canonical

    ran = {canonical(t.strip()) for t in str(recorded.get("frameworks", "")).split(",")}
    return {k for m in builtins() if m.name not in ran for k in m.Settings.keys()}


@pytest.mark.parametrize("folder", sorted(CURRENT))
def test_a_current_result_ran_with_todays_settings(folder):
    recorded = json.loads((ROOT / folder / "summary.json").read_text())["config"]
    stale = stale_keys(recorded, CURRENT[folder])
    assert not stale, (f"{folder}/summary.json is stale: its settings differ from "
                       f"today's (recorded, today) {stale}; remake it with its command")


def test_a_setting_of_a_method_the_run_did_not_run_is_not_stale():
    recorded = json.loads((ROOT / "docs/results/default-run/summary.json").read_text())
    config = {**recorded["config"], "frameworks": "SE,FR"}
    assert "method.se-r.refill" in config  # SE-R's: the default run did not run it
    config.pop("method.se-r.refill")
    config.pop("method.se.replay-refill")  # SE's, and SE ran
    assert stale_keys(config, None) == {"method.se.replay-refill": ("<absent>", True),
                                        "frameworks": ("SE,FR", "SE,FR,FE,RR,SISA")}


def test_a_changed_default_is_found():
    recorded = json.loads((ROOT / "docs/results/default-run/summary.json").read_text())
    config = {**recorded["config"], "method.se.calibration-final": 0}
    config.pop("replay-refill", None)
    config.pop("method.se.replay-refill", None)
    config.pop("forget-labels", None)  # added at an off default: the run did the same
    assert stale_keys(config, None) == {"method.se.calibration-final": (0, 2),
                                        "method.se.replay-refill": ("<absent>", True)}


def test_the_default_run_was_made_by_todays_code():
    """Issue 52, item 6: the default run's folder records the code fingerprint it was
    made with; code that shapes its numbers changed since makes it stale."""
    import re

    from experiments.remake import AUDIT_LINE
    from experiments.time_saved import audit_fingerprint, fingerprint

    text = (ROOT / "docs/results/default-run/README.md").read_text()
    found = re.search(r"Code fingerprint .*?`([0-9a-f]{64})`", text, re.S)
    assert found, "docs/results/default-run/README.md records no code fingerprint"
    assert found.group(1) == fingerprint(), (
        "docs/results/default-run/ was made by code that has changed since: remake it "
        "with `./simulate.sh` and record `python -m experiments.time_saved --fingerprint`")
    audit = AUDIT_LINE.search(text)  # its membership audit: the audits' code too
    assert audit and audit.group(1) == audit_fingerprint(), (
        "docs/results/default-run/ records no audit fingerprint, or another: remake it "
        "and record `python -m experiments.time_saved --audit-fingerprint`")
