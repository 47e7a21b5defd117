"""The ``audit`` section against the ``unlearning`` section: what only the server knows.

The section itself, and what it checks alone, is the audits' own
(:class:`audits.config.AuditConfig`); which methods U-LiRA references and which
request the backdoor's poisoned clients are is the method registry's and the
unlearning section's, so it is checked here.
"""

from __future__ import annotations

import server_app.config.methods as registry
from audits.config import AuditConfig
from server_app.config.unlearning import UnlearningConfig
from task.values import bad


def ulira_methods() -> list[str]:
    """The methods the U-LiRA audit references (:mod:`audits.ulira_audit`).

    The approximate ones: a method that retrains is exact by construction, so its
    game is chance.
    """
    return [m.name for m in registry.builtins() if m.is_referenced()]


def check_against(audit: AuditConfig, unlearning: UnlearningConfig) -> None:
    """Raise :class:`task.values.ConfigError`: U-LiRA's methods, the backdoor's request.

    After :meth:`AuditConfig.validate`: ``mia-unlearn-references`` needs
    ``mia-shadows`` >= 1 and a method U-LiRA references (any calibration
    interval: the references replay with the method's own strategy); a backdoor
    needs ``forget-clients`` (or, the image trigger, ``forget-records``) to name
    the poisoned clients.
    """
    k = audit.mia_unlearn_references
    if k:
        referenced = [m for m in unlearning.method_infos if m.is_referenced()]
        if not audit.mia_shadows or not referenced:
            raise bad("mia-unlearn-references", k,
                      "0 unless mia-shadows >= 1 and frameworks has one of "
                      f"{', '.join(ulira_methods())} (the others retrain: exact by "
                      "construction)")
    if not audit.backdoor:
        return
    key, value = (("backdoor-trigger", audit.backdoor_trigger) if audit.backdoor_trigger
                  else ("backdoor-phrase", audit.backdoor_phrase))
    if audit.backdoor_phrase and unlearning.forget_records.strip():
        raise bad(key, value, "'' with forget-records (the text backdoor poisons "
                  "whole clients; the records variant is the image trigger's)")
    if not unlearning.forget_client_list and not unlearning.forget_records.strip():
        raise bad(key, value, f"{'0' if audit.backdoor_trigger else repr('')} unless "
                  "forget-clients names the poisoned clients (the clients of the "
                  "one unlearning request) or forget-records the poisoned records")
