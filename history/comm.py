"""The communication-time model shared by every cost table (paper Sec. 5.1).

Every transfer of a model or a coded slice, server to client or back, costs a
fixed delay plus its bits over the link rate; model-free messages (requests,
acks) are not counted.
"""

from __future__ import annotations

BASE_DELAY_S = 0.1
"""Fixed cost of one transfer, seconds."""


def transfer_seconds(nbytes: int, link_rate_mbps: float,
                     base_delay_s: float = BASE_DELAY_S) -> float:
    """Modelled time of one transfer: base delay + bits / (rate in Mbit/s * 1e6).

    Parameters
    ----------
    nbytes : int
        Bytes carried by the transfer.
    link_rate_mbps : float
        Link rate, Mbit/s (> 0).
    base_delay_s : float
        Fixed seconds of a transfer (default: the paper's 0.1 s; a device
        profile may set its own, :mod:`server_app.config.profile`).

    Returns
    -------
    float
        Seconds.
    """
    return base_delay_s + 8.0 * nbytes / (link_rate_mbps * 1e6)
