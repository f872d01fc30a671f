"""What the failover drivers (etcd_failover.py, fleet_failover.py) share: their time
limits, free ports on loopback, and how a trial's times are shown.

Standard library only; imported from the drivers' own directory.
"""

import socket

# A member, node or proxy that is not paused answers in well under a millisecond on
# loopback; a slower answer only means a busy machine.
QUERY_TIMEOUT_S = 0.5
# Longest one trial may take, from the pause to the last time measured.
TRIAL_TIMEOUT_S = 30.0
# Longest a cluster may take to start and elect its first leader.
START_TIMEOUT_S = 30.0


def free_port():
    """A free TCP port on 127.0.0.1 (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def show_ms(value):
    """A time in milliseconds as a trial's progress line shows it ("-": not reached)."""
    return "-" if value is None else f"{value:.0f}"
