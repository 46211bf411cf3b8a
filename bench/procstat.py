"""CPU time of a process or one of its threads, from /proc (shared by the
benches that watch ckptd or a server while it works)."""
import os

TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid, tid=None):
    """User + system CPU seconds of process pid so far (all its threads), or
    of its thread tid alone. OSError when it is gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / TCK
