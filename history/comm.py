"""The communication-time model shared by every cost table (paper Sec. 5.1).

Every transfer of a model or a coded slice, server to client or back, costs a
fixed delay plus its bits over the link rate; model-free messages (requests,
acks) are not counted.
"""

from __future__ import annotations

BASE_DELAY_S = 0.1
"""Fixed cost of one transfer, seconds."""


def transfer_seconds(nbytes: int, link_rate_mbps: float) -> float:
    """Modelled time of one transfer: 0.1 s + bits / (rate in Mbit/s * 1e6).

    Parameters
    ----------
    nbytes : int
        Bytes carried by the transfer.
    link_rate_mbps : float
        Link rate, Mbit/s (> 0).

    Returns
    -------
    float
        Seconds.
    """
    return BASE_DELAY_S + 8.0 * nbytes / (link_rate_mbps * 1e6)
