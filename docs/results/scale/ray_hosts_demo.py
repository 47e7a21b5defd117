"""A Ray cluster across two network hosts, a simulation attached to it (root).

The separate-hosts version of ray_cluster_demo.sh: the Ray head runs on host
``rayhead`` (10.231.0.1) and a worker node on host ``rayworker`` (10.231.0.2),
each a network namespace of its own (:mod:`cli.netns`), one CPU each; the
simulation (``python -m cli run``) runs on the head's host with
``RAY_ADDRESS=10.231.0.1:6390``. Every second it lists the Ray worker
processes of each host (``ip netns pids``), so the output shows ClientApp
actors running on both hosts. Everything stops at the end (namespaces with
their processes).

Usage (project root, as root): ``.venv/bin/python docs/results/scale/ray_hosts_demo.py OUT``
"""

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from cli.netns import Network, namespace_pids  # noqa: E402

PORT = 6390
ROOT = Path(__file__).resolve().parents[3]
RUN_CONFIG = ("num-clients=8 num-shards=2 clients-per-round=4 num-rounds=2 local-epochs=1 "
              "client-samples=64 test-samples=500 frameworks='SE' mia=false")


def _started(log: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if "Ray runtime started" in log.read_text(errors="replace"):
            return
        time.sleep(1)
    raise SystemExit(f"ray did not start: see {log}")


def _sample(net: Network, out: Path, stop: threading.Event) -> None:
    """Each second: the ClientAppActor processes of each host."""
    with open(out, "w") as sink:
        while not stop.wait(1.0):
            for name, host in net.hosts.items():
                for pid in namespace_pids(host.netns):
                    try:
                        title = Path(f"/proc/{pid}/cmdline").read_bytes()[:80]
                    except OSError:
                        continue
                    title = title.replace(b"\0", b" ").decode(errors="replace")
                    if "ClientAppActor" in title:
                        sink.write(f"{time.strftime('%T')} host={name} pid={pid} {title}\n")
            sink.flush()


def main(out: Path) -> None:
    """Start the two hosts and the cluster, run the simulation, write OUT's files."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "SE_DATA_DIR": os.environ.get("SE_DATA_DIR",
                                         str(ROOT.parent / "shared" / "data")),
           "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    with Network() as net:
        head, worker = net.add_host("rayhead"), net.add_host("rayworker")
        with open(out / "ray_start_head.txt", "w") as log:
            subprocess.Popen([*head.wrap(), "ray", "start", "--head", "--port", str(PORT),
                              "--node-ip-address", head.address, "--num-cpus=1",
                              "--include-dashboard=false", "--disable-usage-stats",
                              "--block"], env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        _started(out / "ray_start_head.txt")
        with open(out / "ray_start_worker.txt", "w") as log:
            subprocess.Popen([*worker.wrap(), "ray", "start", "--address",
                              f"{head.address}:{PORT}", "--node-ip-address",
                              worker.address, "--num-cpus=1", "--block"], env=env,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _started(out / "ray_start_worker.txt")
        nodes = subprocess.run(
            [*head.wrap(), sys.executable, "-c",
             "import ray; ray.init(address='auto', logging_level='ERROR');"
             "[print(n['NodeManagerAddress'], 'CPU', n['Resources'].get('CPU'), "
             "'alive' if n['Alive'] else 'dead') for n in ray.nodes()];"
             "print('cluster CPUs:', ray.cluster_resources().get('CPU'))"],
            env={**env, "RAY_ADDRESS": f"{head.address}:{PORT}"}, capture_output=True,
            text=True, timeout=120)
        (out / "cluster_nodes.txt").write_text(nodes.stdout + nodes.stderr[-2000:])
        stop = threading.Event()
        sampler = threading.Thread(target=_sample, args=(net, out / "actors_by_host.txt",
                                                         stop), daemon=True)
        sampler.start()
        start = time.monotonic()
        with open(out / "run.log", "w") as log:
            status = subprocess.run([*head.wrap(), sys.executable, "-m", "cli", "run",
                                     "--run-config", RUN_CONFIG], cwd=ROOT,
                                    env={**env, "RAY_ADDRESS": f"{head.address}:{PORT}"},
                                    stdout=log, stderr=subprocess.STDOUT).returncode
            log.write(f"wall {time.monotonic() - start:.0f} s, exit status {status}\n")
        stop.set()
        sampler.join()
    counts = Counter(line.split()[1] for line in
                     (out / "actors_by_host.txt").read_text().splitlines())
    (out / "client_actors_per_host.txt").write_text(
        "".join(f"{n} samples {host}\n" for host, n in sorted(counts.items())))
    print((out / "client_actors_per_host.txt").read_text(), end="")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
