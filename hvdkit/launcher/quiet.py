"""What `hvdkit run` leaves out of the ranks' and the launcher's output unless asked. Pure.

Two kinds of text bury hvdkit's own lines without telling the user anything new:

- **Start-up chatter** of every rank and of ``horovodrun``: TensorFlow's C++ INFO lines
  (oneDNN, cpu_feature_guard and the like, through absl) and absl's notice that such lines go to
  stderr. Dropped; warnings and errors (``W``/``E``/``F`` lines) always pass.
- **The launcher's own failure report** (mpirun's dash-framed "exited with non-zero status"
  banners; horovodrun's "Process N exit with status code" lines and its RuntimeError traceback).
  Held back until the job ends: when hvdkit names the failed rank itself, they repeat it and are
  dropped; otherwise (no rank reported a failure) they are shown, since they are all there is.

With ``HVDKIT_LOG_LEVEL=DEBUG`` in the launcher's environment nothing is left out.
"""

from __future__ import annotations

import re

__all__ = ["OutputFilter", "is_startup_chatter"]

# absl's C++ log line prefix: severity, MMDD, time, thread id, file:line]. Only INFO is chatter.
_CXX_INFO = re.compile(r"^I\d{4} [\d:.]+\s+\d+ [\w.-]+:\d+\] ")
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# cpu_feature_guard's INFO message goes on over a second line without a prefix.
_CPU_FEATURES = re.compile(
    r"^To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.$"
)
_RANK_PREFIX = re.compile(r"^\[rank \d+(?:/\d+)?\] ")

_DASHES = re.compile(r"^-{20,}$")
# Text inside an mpirun banner that says a process failed (hvdkit says which, and how).
_MPIRUN_FAILURE = (
    "returned\na non-zero exit code",
    "exited with non-zero status",
    "exited on signal",
    "aborted the job",
    "has exited, but",
)
_HOROVODRUN_ERROR = "RuntimeError: Horovod detected that one or more processes exited with non-zero status"
_HOROVODRUN_TAIL = re.compile(r"^(Process name: \d+|Exit code: -?\d+|)$")
_HOROVODRUN_LINE = re.compile(
    r"^(Process \d+ exit with status code -?\d+\.|Terminating remaining workers after failure of Process \d+\.)$"
)


def is_startup_chatter(text: str) -> bool:
    """True for a line (a rank's, with its ``[rank N]`` prefix, or the launcher's) that is start-up chatter."""
    body = _RANK_PREFIX.sub("", text, count=1).rstrip("\n")
    return body == _ABSL_NOTICE or bool(_CXX_INFO.match(body)) or bool(_CPU_FEATURES.match(body))


class OutputFilter:
    """Feed it ``(stream, text)`` lines in order; it returns those to show now and keeps the
    launcher's failure report until ``end(rank_failed)`` says whether hvdkit reports the failure.

    ``verbose`` (HVDKIT_LOG_LEVEL=DEBUG) passes everything through unchanged.
    """

    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose
        self.dropped = 0
        self._held = []  # launcher failure text, shown only when hvdkit has no report of its own
        self._banner = None  # the lines of an mpirun banner being read, or None
        self._traceback = None  # the lines of a launcher traceback being read, or None
        self._after_horovodrun_error = False  # its "Process name:"/"Exit code:" lines follow

    def feed(self, stream: str, text: str) -> list[tuple[str, str]]:
        """The lines to show now for one input line (often just that line, or nothing)."""
        if self.verbose:
            return [(stream, text)]
        if is_startup_chatter(text):
            self.dropped += 1
            return []
        if _RANK_PREFIX.match(text):  # a rank's line: never part of the launcher's report
            return self._release() + [(stream, text)]
        return self._launcher_line(stream, text)

    def _launcher_line(self, stream, text):
        body = text.rstrip("\n")
        if self._banner is not None:
            self._banner.append((stream, text))
            return self._close_banner() if _DASHES.match(body) else []
        if self._traceback is not None:
            return self._traceback_line(stream, text, body)
        if _DASHES.match(body):
            self._banner = [(stream, text)]
            return []
        if body == "Traceback (most recent call last):":
            self._traceback = [(stream, text)]
            return []
        if _HOROVODRUN_LINE.match(body) or (self._after_horovodrun_error and _HOROVODRUN_TAIL.match(body)):
            self._held.append((stream, text))
            return []
        self._after_horovodrun_error = False
        return [(stream, text)]

    def _traceback_line(self, stream, text, body):
        self._traceback.append((stream, text))
        if body.startswith(" ") or body.startswith("\t") or not body:  # frames and source lines
            return []
        lines, self._traceback = self._traceback, None
        if body.startswith(_HOROVODRUN_ERROR):  # horovodrun's own "a process failed": hvdkit says it
            self._held.extend(lines)
            self._after_horovodrun_error = True
            return []
        return lines  # any other error of the launcher is news: show it whole

    def _close_banner(self):
        lines, self._banner = self._banner, None
        text = "".join(t for _, t in lines)
        if any(phrase in text for phrase in _MPIRUN_FAILURE):
            self._held.extend(lines)
            return []
        return lines

    def _release(self):
        lines = (self._banner or []) + (self._traceback or [])
        self._banner = self._traceback = None
        return lines

    def end(self, rank_failed: bool) -> list[tuple[str, str]]:
        """The lines still to show once the job is over: the launcher's own report, unless
        ``rank_failed`` (hvdkit names the failed rank itself); a banner cut short is shown."""
        lines = self._release()
        held, self._held = self._held, []
        if rank_failed:
            self.dropped += len(held)
            return lines
        return held + lines
