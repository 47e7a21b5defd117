"""``models`` and ``export``: a run's model versions, and one written for serving.

``models --run NAME`` lists the versions (:mod:`runstore.versions`): v1
after learning, then one per handled request or batch, each with its time, what
made it (the requests it reflects), the clients forgotten in it, its test
accuracy and the full SHA-256 digest of its models, as a receipt names it.
``export --run NAME [--version N] --out FILE`` writes version N (default: the
latest) in a standard format a serving stack loads without this project:

- ``FILE.safetensors``: every shard's tensors under ``shard<s>/<layer>``; the
  metadata names the architecture and the ensemble rule;
- ``FILE.pt`` (or ``.pth``): a ``torch.save`` dict ``{"shards": [state_dict, ...],
  "metadata": {...}}`` that ``torch.load(FILE, weights_only=True)`` reads.

Both print the version's models digest (as its receipt names it) and the file's
SHA-256. The version's file is checked against its recorded SHA-256 first, and
its arrays against the recorded models digest (:func:`runstore.versions.
verify_version`): ``models`` says ``verified`` or names the mismatch on each
line, ``export`` refuses a version that does not verify.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from cli.runs import open_inbox, run_folder
from cli.terminal import Parser
from history.files import atomic_write, readable_mode
from runstore.folder import ModelsFileError
from runstore.versions import PLANNED, ModelVersion, verify_version
from server_app.config import ConfigError

FORMAT = "sharding-eraser/shard-ensemble-1"
ENSEMBLE = "mean of the shard models' softmax outputs (SISA); one model when S = 1"


def _version(text: str) -> int:
    """``--version``: ``3`` or ``v3`` (as ``models`` lists them)."""
    digits = text[1:] if text[:1] in ("v", "V") else text
    if not (digits.isascii() and digits.isdigit()) or int(digits) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a version: N or vN with N >= "
                                         "1, as `models` lists them (e.g. v2)")
    return int(digits)


def _versions(folder: Path) -> list[ModelVersion]:
    with open_inbox(folder) as inbox:
        versions = inbox.versions()
    if not versions:
        raise ConfigError(f"--run {folder.name!r} has no model versions (a run made "
                          "before they existed, or one that has not learned yet)")
    return versions


def main_models(argv: list[str], prog: str) -> int:
    """The ``models`` command: one line per model version; exit status 0, 1 or 2.

    A line: ``v<N>``, when it was made (UTC), its test accuracy, the clients
    forgotten in it, the requests it reflects, the SHA-256 of its models (all
    64 hex digits: an operator compares it with a receipt's), its file, what
    made it, and ``verified`` (the file's SHA-256 and the models digest
    recomputed from its arrays match the records) or ``NOT VERIFIED: <the
    mismatch>``; exit status 1 when a version is not verified.

    Raises
    ------
    ConfigError
        No such run, or one without model versions (one line).
    """
    ap = Parser(prog=prog, description="List a run's model versions.")
    ap.add_run_options()
    args = ap.parse_args(argv)
    folder, bad = run_folder(args.run, args.results_dir), []
    for v in _versions(folder):
        accuracy = v.scores.get("accuracy")
        problem = _check(folder, v)
        bad += [f"v{v.version}"] if problem else []
        print(f"v{v.version}  {_utc(v.created)}  accuracy "
              f"{accuracy if accuracy is None else f'{accuracy:.4f}'}  forgotten "
              f"{v.forgotten or '-'}  requests {','.join(v.requests) or '-'}  models "
              f"sha256 {v.digests['models']}  {v.file}  ({v.note})  "
              + (f"NOT VERIFIED: {problem}" if problem else "verified"))
    if bad:  # listed, but the operator must not trust those lines
        print(f"{prog}: {', '.join(bad)} of run {args.run} do not match their records "
              "(see NOT VERIFIED above)", file=sys.stderr)
        return 1
    return 0


def _check(folder: Path, version: ModelVersion) -> str | None:
    """None when ``version``'s file and arrays match its records, else the mismatch."""
    try:
        verify_version(folder, version)
    except ModelsFileError as err:
        return str(err).split(";")[0]
    return None


def main_export(argv: list[str], prog: str) -> int:
    """The ``export`` command; exit status 0 (written) or 2 (nothing written)."""
    ap = Parser(prog=prog, description="Write a model version for "
                "serving (.safetensors, or .pt / .pth for torch).")
    ap.add_run_options()
    ap.add_argument("--version", type=_version, default=None, metavar="N",
                    help="the version, N or vN as `models` lists it (default: latest)")
    ap.add_argument("--out", required=True, help="FILE.safetensors, FILE.pt or FILE.pth")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.suffix not in (".safetensors", ".pt", ".pth"):
        raise ConfigError(f"--out {args.out!r}: a file name ending in .safetensors, .pt "
                          "or .pth")
    folder = run_folder(args.run, args.results_dir)
    _check_out(out, args.out, folder)
    versions = _versions(folder)
    version = _pick(versions, args.version)
    shards = _load(folder, version)  # its digests recomputed and matched first
    try:
        export(out, shards, metadata(folder, version))
    except OSError as err:
        raise ConfigError(f"--out {args.out!r}: cannot be written "
                          f"({err.strerror or err})") from None
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    print(f"v{version.version} of run {args.run} -> {out}")
    print(f"models sha256 {version.digests['models']} verified (recomputed from the "
          "exported arrays; the receipts' models_sha256)")
    print(f"file sha256 {digest} (this export's file; a receipt's after_file_sha256 "
          "is the run's stored .npz)")
    since = superseded(versions, version)
    if since:
        print(f"{prog}: note: {since}", file=sys.stderr)
    return 0


def superseded(versions: list[ModelVersion], version: ModelVersion) -> str:
    """What requests done after ``version`` left out of it, in one line ("": none).

    An older version still holds what later requests forgot or erased; serving
    it does not honour them.
    """
    later = [v for v in versions if v.version > version.version]
    requests = [r for v in later for r in v.requests]
    if not requests:
        return ""
    gone = sorted(set(later[-1].forgotten) - set(version.forgotten))
    clients = f": clients {gone} forgotten since" if gone else ""
    named = ["the planned requests" if r == PLANNED else r for r in requests]
    return (f"v{version.version} predates {', '.join(named)} (latest "
            f"v{later[-1].version}{clients}); it still holds what they removed, so "
            "serving it does not honour them")


def _check_out(out: Path, text: str, folder: Path) -> None:
    """Refuse an ``--out`` that could overwrite what the runs stored.

    Raises
    ------
    ConfigError
        ``--out`` is a folder or a symbolic link, or lies inside a run folder (a
        folder holding a run catalog ``run.sqlite``, at any depth; one line,
        nothing is written).
    """
    if out.is_symlink() or out.is_dir():
        what = "symbolic link" if out.is_symlink() else "folder"
        raise ConfigError(f"--out {text!r} is a {what}: give the path of a new file "
                          "(or of a file to replace)")
    run = next((p for p in out.resolve().parents if (p / "run.sqlite").is_file()), None)
    if run is not None:
        raise ConfigError(f"--out {text!r} lies inside the run folder {run}, where a "
                          "run keeps its files: write the export outside it")


def _pick(versions: list[ModelVersion], number: int | None) -> ModelVersion:
    if number is None:
        return versions[-1]
    for v in versions:
        if v.version == number:
            return v
    raise ConfigError(f"--version {number}: no such version; the run has v1.."
                      f"v{versions[-1].version}")


def _load(folder: Path, version: ModelVersion) -> list[dict]:
    """The version's shard models as state dicts (name -> torch.Tensor).

    Raises
    ------
    ConfigError
        The file or its arrays do not match the version's records
        (:func:`runstore.versions.verify_version`; one line).
    """
    try:
        records = verify_version(folder, version)
    except ModelsFileError as err:
        raise ConfigError(str(err)) from None
    return [record.to_torch_state_dict() for record in records]


def metadata(folder: Path, version: ModelVersion) -> dict[str, str]:
    """What a serving stack needs besides the tensors (string values only).

    ``factory`` rebuilds the architecture: ``task.registry.get_task(task).model(
    num_classes)`` with ``factory_args`` (the run's task: a built-in or a plug-in).
    ``layers`` is the model's own order of its ``state_dict`` (a ``.safetensors``
    file sorts its tensors): the order :func:`runstore.receipts.models_sha256`
    hashes them in, so the models digest can be recomputed from the file.
    """
    with open_inbox(folder) as inbox:
        settings = inbox.settings()
    from task.config import task_spec
    from task.registry import get_task  # the tensors' architecture

    spec = task_spec(str(settings.get("task", "") or ""), str(settings.get("dataset", "")))
    num_classes = _num_classes(settings)
    model = get_task(spec).model(num_classes)
    return {"format": FORMAT, "architecture": f"{type(model).__module__}."
            f"{type(model).__qualname__}",
            "factory": "task.registry.get_task(task).model(num_classes)",
            "factory_args": json.dumps({"task": spec, "num_classes": num_classes}),
            "layers": json.dumps(list(model.state_dict())),
            "num_shards": str(version.shards), "ensemble": ENSEMBLE,
            "run": folder.name, "version": str(version.version),
            "models_sha256": version.digests["models"],
            "forgotten": json.dumps(version.forgotten)}


def _num_classes(settings: dict) -> int:
    from server_app.config import RunConfig
    from server_app.config.tasks import load_run_data

    cfg = RunConfig.from_run_config(settings)
    return load_run_data(cfg, str(cfg.task().locate(cfg.data.data_dir))).num_classes


def export(out: Path, shards: list[dict], meta: dict[str, str]) -> None:
    """Write ``shards`` (state dicts) and ``meta`` to ``out`` (by its suffix).

    Atomic, readable as the umask allows. A ``.safetensors`` file is the same
    bytes at every export of a version (:func:`canonical_safetensors`); a ``.pt``
    file is not (torch writes a random serialization id into each).
    """
    import io

    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".safetensors":
        from safetensors.torch import save

        flat = {f"shard{s}/{k}": t.contiguous() for s, sd in enumerate(shards)
                for k, t in sd.items()}
        data = canonical_safetensors(save(flat, metadata=meta))
    else:
        buffer = io.BytesIO()
        torch.save({"shards": shards, "metadata": meta}, buffer)
        data = buffer.getvalue()
    atomic_write(out, data, readable_mode())


def canonical_safetensors(blob: bytes) -> bytes:
    """Safetensors bytes with the JSON header's keys sorted.

    The library writes the header's ``__metadata__`` in hash order, so one
    version's exports would differ in bytes; the tensors' offsets count from
    the end of the header, so only the header changes. Format:
    https://github.com/huggingface/safetensors (8-byte little-endian header
    length, the JSON header padded with spaces to 8 bytes, the tensor data).
    """
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + size])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + blob[8 + size:]


def _utc(seconds: float) -> str:
    from runstore.receipts import utc

    return utc(seconds)
