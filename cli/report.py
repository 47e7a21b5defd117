"""Print a summary.json as plain-text tables: ``python -m cli.report FILE``."""

from __future__ import annotations

import sys

from cli.tables import table
from history.storage import STORAGE_ROWS
from runstore.summary import RunSummary, StageSummary
from server_app.config.methods import has, proposed, reference, shard_reference
from server_app.rounds.loop import WALL_PARTS

WALL_COLUMNS = (*((k, k.removesuffix("_s").replace("_", " ")) for k in WALL_PARTS),
                ("rounds", "rounds"), ("client_rounds", "client rounds"))
"""``wall_breakdown``'s keys (:data:`server_app.rounds.loop.WALL_PARTS`) as columns."""

def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _count(value: object) -> object:
    """A count that may be fractional (client-epochs): ``11``, ``12.5``, ``1,200``."""
    if not isinstance(value, float):
        return value
    return f"{value:,.0f}" if value.is_integer() else f"{value:,.1f}"


def _task(cfg: dict) -> str:
    """``dataset mnist``, or the run's task where run-config ``task`` names one."""
    return f"task {cfg['task']}" if cfg.get("task") else f"dataset {cfg['dataset']}"


def render(summary: RunSummary | dict) -> str:
    """The tables for one run's summary (learning, shards, storage), then warnings.

    ``summary`` is a :class:`~runstore.summary.RunSummary` or the dict of a
    ``summary.json`` (read back as one).
    """
    if isinstance(summary, dict):
        summary = RunSummary.from_json(summary)
    cfg, learning = summary.config, summary.learning
    out = [
        f"{_task(cfg)} ({cfg['partition']}), {cfg['num-clients']} clients,"
        f" {cfg['num-shards']} shards, {cfg['clients-per-round']} a round,"
        f" {cfg['num-rounds']} rounds x {cfg['local-epochs']} local epochs,"
        f" shard strategy {cfg['shard-strategy']}{_server_settings(summary)}",
        "",
        table(["model", "accuracy", "loss"],
              [["ensemble", learning.accuracy, learning.loss]]
              + [[f"shard {s}", a, lo] for s, (a, lo) in enumerate(
                  zip(learning.shard_accuracy, learning.shard_loss, strict=True))],
              cell=_cell),
        "",
        f"learning: {learning.wall_time_s:.1f} s wall, "
        f"{learning.compute_s:.1f} s client compute, "
        f"{learning.client_epochs:.0f} client-epochs; "
        f"server storage {summary.storage['server_bytes']:,} bytes",
    ]
    if learning.perplexity is not None:  # the character model: exp(test loss)
        out.append(f"ensemble test loss {learning.loss:.4f} nats/char, "
                   f"perplexity {learning.perplexity:.2f}")
    if summary.storage.get("SE_uncoded"):
        out += ["", storage_table(summary.storage)]
    if summary.stages:
        out += ["", stages_table(summary.stages)]
    if summary.frameworks:
        out += ["", frameworks_table(summary)]
        wall = wall_table(summary)
        out += ["", wall] if wall else []
    for extra in (lira_table(summary), ulira_table(summary)):
        if extra:
            out += ["", extra]
    if summary.warnings:
        out += ["", warnings_list(summary.warnings)]
    return "\n".join(out)


def _server_settings(summary: RunSummary) -> str:
    """`` (server_lr 1, server_momentum 0.9)`` for a strategy with server settings."""
    settings = {k: v for k, v in summary.shard_strategy.items() if k != "name"}
    return f" ({', '.join(f'{k} {v:g}' for k, v in settings.items())})" if settings else ""


def warnings_list(warnings: list[str], limit: int = 20) -> str:
    """The run's warnings, one a line: at most ``limit``, then how many more."""
    lines = [f"WARNINGS ({len(warnings)}):"] + [f"  {w}" for w in warnings[:limit]]
    if len(warnings) > limit:
        lines.append(f"  ... and {len(warnings) - limit} more in summary.json "
                     "(key 'warnings')")
    return "\n".join(lines)


RECOVERY_STORAGE = ("SE-R reads SE's history, FRec FE's: no stored bytes beyond them "
                    "(they need W^0 and the client updates those stores keep).")
"""What server-side recovery costs in storage (issue 26 item 2): nothing beyond the
history SE (SE-R) or FedEraser (FRec) keeps; see ``strategies/recovery.py``."""


def storage_table(storage: dict) -> str:
    """Server and per-client bytes of FE, uncoded SE and coded SE; comm; gamma, lambda."""
    rows = []
    for name, key in STORAGE_ROWS:
        entry = storage.get(key)
        if not entry or entry.get("server_bytes") is None:
            rows.append([name, "not measured", "", ""])
            continue
        clients = entry.get("client_bytes") or {}
        rows.append([name, entry["server_bytes"], clients.get("max", 0),
                     entry.get("source", "catalog + keys; slices on clients")])
    out = [f"storage (mode {storage['mode']}):", "",
           table(["history", "server bytes", "bytes per client (max)", "measured from"],
                 rows, cell=_cell)]
    out.append(RECOVERY_STORAGE)
    if storage.get("SE_coded_vs_FE") is not None:
        out.append(f"\ncoded SE server storage: {100 * storage['SE_coded_vs_FE']:.2f}% "
                   "below FE")
    comm = storage.get("comm")
    if comm:
        out.append(f"slice distribution {comm['distribution_s']:.1f} s "
                   f"({comm['distribution_transfers']} transfers), retrieval "
                   f"{comm['retrieval_s']:.1f} s ({comm['retrieval_transfers']} "
                   f"transfers) at {comm['link_rate_mbps']:g} Mbit/s; encode "
                   f"{comm['encode_s']:.1f} s, decode {comm['decode_s']:.2f} s")
    eff = storage.get("efficiency")
    if eff:
        coded = eff["coded"]
        out.append(f"gamma / lambda ({eff['source']}): full 1 / 1, uncoded "
                   f"{eff['uncoded']['gamma']} / {eff['uncoded']['lambda']}, coded "
                   f"{coded['gamma']} (<= (1 - 2 mu) C = {coded['gamma_bound']:g}, "
                   f"mu = {coded['mu']:.3f}) / {coded['lambda']}")
    return "\n".join(out)


FRAMEWORK_COLUMNS = [
    ("accuracy", "accuracy"), ("loss", "loss"), ("retrain_compute_s", "compute s"),
    ("retrain_wall_s", "wall s"), ("client_epochs", "client-epochs"),
    ("client_rounds", "client rounds"),
    ("comm_time_s", "comm s"), ("server_storage_bytes", "server bytes"),
    ("mia_f1", "MIA F1"), ("mia_auc", "MIA AUC"), ("mia_tpr_at_1fpr", "TPR@1%FPR"),
    ("backdoor_asr", "backdoor ASR"),
    ("backdoor_asr_ensemble", "ASR ensemble"),
]


#: Counts that may be fractional, shown as counts (not with 4 decimals below 100).
COUNT_COLUMNS = ("client_epochs",)


#: The membership-inference columns: one ``MIA`` column saying "no signal" instead
#: when the audit has none (:func:`audits.audit.with_signal`).
MIA_COLUMNS = ("mia_f1", "mia_auc", "mia_tpr_at_1fpr")
NO_SIGNAL = "no signal"


def mia_signal(summary: RunSummary) -> bool | None:
    """The audit's ``mia_signal`` (the original model's); None if not recorded."""
    signal = summary.original.audit.get("signal") if summary.original else None
    return None if signal is None else bool(signal)


def no_signal_line(summary: RunSummary) -> str:
    """One line under the table: why the MIA columns say "no signal", what to run."""
    audit = summary.original.audit
    interval = (f", 95% interval {audit['auc_low']:.3f}-{audit['auc_high']:.3f}"
                if "auc_low" in audit else "")
    return (f"MIA: {NO_SIGNAL} (original model's AUC {audit['auc']:.3f}{interval}, "
            "not above 0.5): the audit cannot show forgetting here; scores in "
            f"summary.json (mia_*). {signal_hint(summary)}")


def signal_hint(summary: RunSummary) -> str:
    """What to run for an audit with signal: the memorize preset, unless this run had it."""
    from cli.config import preset_values

    config = summary.config or {}
    if all(config.get(key) == value for key, value in preset_values("memorize").items()
           if isinstance(value, int | float)):  # bool too: its settings, not its requests
        return ("This run has the memorize preset's settings already: more local "
                "epochs or fewer samples per client give the audit more to find")
    return "With signal: --preset memorize (or --preset verify, a backdoor check)"


#: The LiRA table's columns: summary key (without ``mia_``) and heading.
LIRA_COLUMNS = (
    ("lira_auc", "AUC"), ("lira_tpr_at_1fpr", "TPR@1%FPR"),
    ("lira_tpr_at_01fpr", "TPR@0.1%FPR"), ("lira_client_auc", "client AUC"),
    ("lira_client_tpr_at_1fpr", "client TPR@1%FPR"),
)
UNREAD = "too few"


def _with_interval(audit: dict, key: str) -> str:
    """``0.6120 [0.5710, 0.6550]``; ``too few`` for a rate with too few non-members."""
    if key not in audit:
        return ""
    if audit[key] is None:
        return UNREAD
    ci = audit.get(f"{key}_ci")
    return f"{audit[key]:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "")


def lira_table(summary: RunSummary) -> str:
    """Offline LiRA per model: per example and per forgotten client, 95% intervals.

    Empty when the run has no LiRA (``mia-references`` = 0).
    """
    models = {"original": summary.original, **(summary.frameworks or {})}
    quiet = summary.original is not None and \
        summary.original.audit.get("lira_signal") is False
    rows = [[name] + [NO_SIGNAL if quiet else _with_interval(m.audit, k)
                      for k, _ in LIRA_COLUMNS]
            for name, m in models.items() if m is not None and "lira_auc" in m.audit]
    if not rows:
        return ""
    lira = (summary.verification or {}).get("mia", {}).get("lira", {})
    out = [f"LiRA: {lira.get('variant', 'offline')}; {lira.get('references')} "
           f"reference models, variance {lira.get('variance')}; "
           f"{lira.get('n_targets')} targets against {lira.get('n_nonmembers')} "
           f"non-members; {lira.get('forgotten_clients')} forgotten clients against "
           f"{lira.get('pseudo_clients')} pseudo-clients of non-members; "
           f"[95% bootstrap interval]", "",
           table(["model"] + [h for _, h in LIRA_COLUMNS], rows)]
    if quiet:
        audit = summary.original.audit
        out.append(f"LiRA: {NO_SIGNAL} (original model's AUC "
                   f"{_with_interval(audit, 'lira_auc')} not above 0.5, TPR@1%FPR "
                   f"{_with_interval(audit, 'lira_tpr_at_1fpr')} not above 0.01): it "
                   "cannot show forgetting here; scores in summary.json (mia_lira_*). "
                   + signal_hint(summary))
        return "\n".join(out)
    out += [f"  {line}" for line in lira.get("unread", [])]
    out += [f"  {name}: each forgotten client's p-value against the pseudo-clients: "
            + ", ".join(f"{p:.3f}" for p in m.audit["lira_client_pvalues"])
            for name, m in models.items()
            if m is not None and m.audit.get("lira_client_pvalues")]
    return "\n".join(out)


#: The U-LiRA table's columns: the references' game, the run's model.
ULIRA_COLUMNS = (
    ("ulira_game_auc", "game AUC"), ("ulira_game_tpr_at_1fpr", "game TPR@1%FPR"),
    ("ulira_auc", "run's model AUC"), ("ulira_tpr_at_1fpr", "run's model TPR@1%FPR"),
)


def ulira_table(summary: RunSummary) -> str:
    """U-LiRA of the original and the referenced frameworks; empty without."""
    models = {"original": summary.original, **(summary.frameworks or {})}
    rows = [[name] + [_with_interval(m.audit, k) for k, _ in ULIRA_COLUMNS]
            for name, m in models.items() if m is not None and "ulira_auc" in m.audit]
    u = (summary.verification or {}).get("mia", {}).get("ulira", {})
    if u.get("skipped"):
        return f"U-LiRA not run: {u['skipped']}"
    if not rows:
        return ""
    shapes = u.get("shapes") or {"shard": {"clients": u.get("shard_clients"),
                                           "forgotten_clients": u.get("forgotten_clients"),
                                           "client_size": u.get("client_size")}}
    kinds = "; ".join(
        f"{label}-shaped: {s.get('clients')} clients, {s.get('forgotten_clients')} "
        f"forgotten of {s.get('client_size')} samples" for label, s in shapes.items())
    exact = u.get("exact_by_construction") or []
    return "\n".join([
        f"U-LiRA: {u.get('references')} references of each shape ({kinds}; "
        f"{u.get('recipe')}) from a pool of {u.get('pool')} targets; original: "
        "learned vs never saw, the others: unlearned with their own rule vs never saw "
        "[95% bootstrap interval]", "",
        table(["model"] + [h for _, h in ULIRA_COLUMNS], rows),
        *[f"  {line}" for line in u.get("unread", [])],
        *([f"  {', '.join(exact)}: retrain without the forgotten clients, exact by "
           "construction (not referenced)"] if exact else [])])


def stages_table(stages: list[StageSummary]) -> str:
    """A staged run, one row per stage: clients, requests, accuracy, unlearning cost."""
    def cost(entry: StageSummary, name: str) -> object:
        spent = entry.unlearning.get(name)
        return _count(float(spent["client_epochs"])) if spent else ""

    def ids(pids: list[int]) -> str:
        return ",".join(map(str, pids)) or "-"

    rows = [[e.stage, f"{e.rounds[0]}-{e.rounds[1]}", e.present, ids(e.joined),
             ids(e.left), ids(e.forgotten), e.learning["accuracy"], e.accuracy,
             " ".join(f"{a:.3f}" for a in e.shard_accuracy or []),
             cost(e, proposed()), cost(e, reference())] for e in stages]
    return "stages (accuracy: ensemble after learning / after the stage's requests)\n" + \
        table(["stage", "rounds", "clients", "joined", "left", "forgotten",
               "learned", "after", "shards after", f"{proposed()} client-epochs",
               f"{reference()} client-epochs"], rows, cell=_cell)


def _add_retrained_shards(summary: RunSummary, frameworks: dict[str, dict],
                          columns: list[tuple[str, str]]) -> None:
    """Add a column after accuracy: the retrained shards' mean accuracy.

    Per sharded framework (:meth:`FrameworkSummary.retrained_shard_accuracy`):
    its ensemble's accuracy can hide a broken shard.
    """
    for name, result in (summary.frameworks or {}).items():
        shards = result.retrained_shard_accuracy()
        if shards is not None:
            frameworks[name]["retrained_shards"] = shards
    if any("retrained_shards" in r for r in frameworks.values()):
        keys = [k for k, _ in columns]
        columns.insert(keys.index("accuracy") + 1 if "accuracy" in keys else 0,
                       ("retrained_shards", "retrained shards' acc"))


def frameworks_table(summary: RunSummary) -> str:
    """The unlearning comparison: one row per framework, plus SE's expectations."""
    frameworks = {n: f.to_json() for n, f in (summary.frameworks or {}).items()}
    quiet = mia_signal(summary) is False  # one "MIA" column: "no signal"
    columns = [(k, h) for k, h in FRAMEWORK_COLUMNS
               if any(k in r for r in frameworks.values())
               and not (quiet and k in MIA_COLUMNS)]
    _add_retrained_shards(summary, frameworks, columns)
    if summary.original is not None:  # the learned model, before unlearning
        frameworks = {"original": summary.original.to_json(), **frameworks}
    rows = [[name] + [_count(r.get(k, "")) if k in COUNT_COLUMNS else r.get(k, "")
                      for k, _ in columns] for name, r in frameworks.items()]
    if quiet:
        columns.append(("mia", "MIA"))
        rows = [row + [NO_SIGNAL if any(k in r for k in MIA_COLUMNS) else ""]
                for row, r in zip(rows, frameworks.values(), strict=True)]
    plan = summary.unlearning
    staged = " (accuracy right before / after the last request; final models: " \
        "the stages table)" if summary.stages else ""
    out = [f"unlearning ({plan.mode if plan else ''}): requests "
           f"{plan.requests if plan else None}{staged}", "",
           table(["framework"] + [h for _, h in columns], rows, cell=_cell)]
    if quiet:
        out.append(no_signal_line(summary))
    out += _verification_lines(summary)
    name, ref = proposed(), reference()
    se, fr = (summary.frameworks or {}).get(name), (summary.frameworks or {}).get(ref)
    if se and fr and se.retrain_compute_s and fr.retrain_compute_s:
        out.append(f"\n{name} / {ref} retraining compute: "
                   f"{se.retrain_compute_s / fr.retrain_compute_s:.3f}")
    if se and fr and se.modelled_wall_s and fr.modelled_wall_s:
        out.append(f"{name} / {ref} modelled wall time: "
                   f"{se.modelled_wall_s / fr.modelled_wall_s:.3f} ({name} "
                   f"{se.modelled_wall_s:.1f} s, {ref} {fr.modelled_wall_s:.1f} s)")
    out += gap_lines(summary)
    if se and se.expected:
        e = se.expected
        out.append(f"{name} {e['mode']} K={e['num_requests']}: measured shard compute "
                   f"{e['measured_total_s']:.1f} s, paper's expectation "
                   f"{e['expected_total_s']:.1f} s (mean shard cost "
                   f"{e['mean_shard_cost_s']:.1f} s)")
    return "\n".join(out)


def gap_lines(summary: RunSummary) -> list[str]:
    """The distance to FR split in two, where the exact shard reference ran.

    The price of isolation (the exact shard reference minus FR: S models on 1/S
    of the data each) and the price of approximation (each other sharded
    method minus the exact shard reference), in the task's headline metric
    (accuracy points, or nats of test loss).
    """
    frameworks, metric = summary.frameworks or {}, summary.headline_metric()
    exact, ref = shard_reference(), reference()
    if exact not in frameworks or ref not in frameworks:
        return []

    def score(name: str) -> float | None:
        return getattr(frameworks[name], metric)

    unit, scale = ("points", 100.0) if metric == "accuracy" else ("nats", 1.0)
    if score(exact) is None or score(ref) is None:
        return []
    out = [f"price of isolation ({exact} - {ref}): "
           f"{(score(exact) - score(ref)) * scale:+.2f} {unit} of test {metric}"]
    for name, result in frameworks.items():
        if name not in (exact, ref) and not has(name, "on_baseline") \
                and getattr(result, metric) is not None:
            out.append(f"price of approximation ({name} - {exact}): "
                       f"{(score(name) - score(exact)) * scale:+.2f} {unit}")
    return out


def wall_table(summary: RunSummary) -> str:
    """Where each framework's modelled wall time went (``wall_breakdown``), seconds."""
    rows = [[name, f.modelled_wall_s, *(f.wall_breakdown.get(k) for k, _ in WALL_COLUMNS)]
            for name, f in (summary.frameworks or {}).items() if f.wall_breakdown]
    if not rows:
        return ""
    return ("where the modelled wall time went (seconds along each round's critical "
            "path; rounds: all / asking clients)\n"
            + table(["framework", "modelled wall", *(h for _, h in WALL_COLUMNS)], rows,
                    cell=_cell))


def _verification_lines(summary: RunSummary) -> list[str]:
    """Backdoor and shadow-attack settings, FE's original's ASR, the targets' rounds."""
    verification = summary.verification or {}
    out = []
    backdoor = verification.get("backdoor")
    if backdoor and backdoor.get("kind") == "text":
        out.append(f"backdoor: {backdoor['trigger']} then {backdoor['continuation']!r} "
                   f"on {backdoor['fraction']:g} of the blocks of clients "
                   f"{backdoor['poisoned_clients']}; ASR on "
                   f"{backdoor['triggered_test_contexts']} test contexts ending in the "
                   "phrase, greedy continuation (sharded: impacted shard)")
    elif backdoor:
        out.append(f"backdoor: {backdoor['trigger']} on {backdoor['fraction']:g} of the "
                   f"images of clients {backdoor['poisoned_clients']}, relabelled "
                   f"{backdoor['target']}; ASR on {backdoor['triggered_test_images']} "
                   "triggered test images of other classes (sharded: impacted shard)")
    base = summary.baseline_learning
    if base is not None and base.backdoor_asr is not None:
        out.append(f"FE's own original (unsharded): backdoor ASR {base.backdoor_asr:.4f}")
    mia = verification.get("mia")
    if mia:
        out.append(f"membership inference: {mia['attack']}; {mia['shadows']} shadows "
                   f"of {mia['shadow_in_samples']} samples, {mia['shadow_recipe']} "
                   f"({mia['shadow_pool']}); targets: clients {mia['targets']}")
        if "n_targets" in mia:
            out.append(f"  {mia['n_targets']} targets; non-members: {mia['heldout']}")
    rounds = verification.get("forgotten_rounds")
    if rounds:
        out.append("learning rounds each forgotten client took part in: "
                   + ", ".join(f"client {p}: {n}" for p, n in rounds.items()))
    return ["", *out] if out else []


def main(argv: list[str]) -> int:
    """Print the tables of the summary.json named in ``argv[0]``."""
    if len(argv) != 1:
        print("usage: python -m cli.report SUMMARY_JSON", file=sys.stderr)
        return 2
    print(render(RunSummary.load(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
