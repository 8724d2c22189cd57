"""Ends a pool's jobs when the process that owns the pool ends without ending them (tests/support/pool.py).

Usage: python pool_reaper.py  (started by the pool, its stdin a pipe from the pool's process)

A pytest process that is interrupted or killed does not reach ``pool.close_all``, and a parked job's ranks are
stopped (SIGSTOP): they would stay for good. The pool writes one line per process of each job it starts, a
process id and whether it leads its process group (``PID 1`` / ``PID 0``), and one per job folder
(``dir PATH``); this process holds a pidfd of each
from that moment, so every signal it sends reaches that process or nothing, never a later holder of the
number. When its stdin ends (the pool's process closed it or ended: the write end is held by that process
only), it kills what is still running, the groups its leaders lead first (a group's number cannot pass to
another group while its leader lives), removes the job folders still there, and exits. SIGINT and SIGTERM to a job's foreground group do not
reach it: it runs in a session of its own.
"""

import os
import shutil
import signal
import sys


def main():
    held = []  # (pidfd, pid, leads its group)
    folders = []
    for line in sys.stdin:
        if line.startswith("dir "):
            folders.append(line[4:].rstrip("\n"))
            continue
        fields = line.split()
        if len(fields) != 2:
            continue
        pid, leader = int(fields[0]), fields[1] == "1"
        try:
            held.append((os.pidfd_open(pid), pid, leader))
        except ProcessLookupError:  # already gone: nothing to end
            pass
    for fd, pid, leader in held:
        if leader:
            try:
                signal.pidfd_send_signal(fd, 0)  # still there: its group is still its own
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for fd, _pid, _leader in held:
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(fd)
    for folder in folders:  # close_all removed those of the jobs it ended
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
