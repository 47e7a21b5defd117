"""``show``: a run's status, stored settings and tables, read from its folder.

``flwr run`` returns 0 whether or not the ServerApp succeeded; on the SuperLink host
``show --run NAME`` says what happened: whether the run finished, where it ran (its
engine and federation), its model versions and waiting requests, the settings it
recorded (the keys that differ from ``pyproject.toml``'s defaults, as a
``--run-config`` value; ``--all``: every key) and, once finished, its result tables.
Reads only.
"""

from __future__ import annotations

import sys

from cli import config
from cli.later_route import recorded_engine
from cli.runs import SUMMARY, open_inbox, run_folder, unfinished
from cli.terminal import Parser
from runstore.versions import made_later
from server_app.config import ConfigError
from task.config import default_run_config


def main_show(argv: list[str], prog: str) -> int:
    """The ``show`` command; exit 0, or 1 when the run has not finished.

    Raises
    ------
    ConfigError
        No such run, or its catalog does not read (one line).
    """
    parser = Parser(prog=prog, description="A run's status, stored "
                    "settings and result tables.")
    parser.add_run_options()
    parser.add_argument("--all", action="store_true", help="every stored setting, not "
                        "only those that differ from the defaults")
    args = parser.parse_args(argv)
    folder = run_folder(args.run, args.results_dir)
    with open_inbox(folder) as inbox:
        settings, versions = inbox.settings(), inbox.versions()
        waiting = [r for r in inbox.all() if r.state in ("pending", "claimed")]
    if not settings:
        raise ConfigError(f"--run {args.run!r} has recorded no settings yet (starting, "
                          "or stopped before it could)")
    finished = (folder / SUMMARY).is_file()
    engine = recorded_engine(folder)
    print(f"run {args.run}: {'finished' if finished else 'not finished'}; engine "
          f"{engine.get('kind') or 'not recorded'}"
          + (f" (federation {engine['federation']})" if engine.get("federation") else "")
          + f"; model versions {len(versions)}; waiting requests "
          f"{', '.join(r.id for r in waiting) or 'none'}")
    print(f"folder: {folder}")
    defaults = default_run_config()
    shown = {k: v for k, v in sorted(settings.items())
             if args.all or defaults.get(k) != v}
    print("settings (run.sqlite" + ("" if args.all else ", those not at their default")
          + "): " + config.describe(shown))
    if finished:
        from cli.report import render
        from runstore.summary import RunSummary

        try:
            print(render(RunSummary.load(folder / SUMMARY)))
        except Exception as err:  # any damage: one line (forget refuses it alike)
            raise ConfigError(f"{folder / SUMMARY} cannot be read: {err}") from None
        later = made_later(versions)
        if later:
            print(f"\nThe tables describe the run as it finished; {len(later)} "
                  f"request{'s' if len(later) != 1 else ''} carried out since "
                  f"(latest v{later[-1].version}, clients {later[-1].forgotten} "
                  f"forgotten) changed the models and erased stored updates: "
                  f"`receipts --run {args.run} --detail`")
    else:  # exit 1 says the run has no results yet; say why on stderr
        print(f"{prog}: {unfinished(folder, len(versions))}", file=sys.stderr)
    return 0 if finished else 1

