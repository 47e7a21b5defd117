"""A harness to kill: ``python tests/hosts_victim.py RUN_DIR`` (test_hosts_cleanup.py).

Starts a federation of one SuperNode host (cli.hosts.Federation), prints
``ready <network tag>`` and waits; SIGTERM / SIGINT stop it as the command
line does (cli.procs.exit_on_signals), SIGKILL leaves it to the watchdogs.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.deploy_parts import SuperNodeOptions  # noqa: E402
from cli.hosts import Federation  # noqa: E402
from cli.procs import Children, exit_on_signals  # noqa: E402


def main(run_dir: str) -> None:
    exit_on_signals("hosts_victim")
    folder = Path(run_dir)
    for sub in ("logs", "nodes"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    options = SuperNodeOptions(isolation="subprocess")
    with Children() as children, Federation(folder, 1, children, options=options) as fed:
        fed.start()
        print(f"ready {fed.network.tag}", flush=True)
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1])
