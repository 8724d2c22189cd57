"""Read a Horovod timeline and say where the time went. Framework-free; matplotlib only to plot.

What Horovod 0.28.1 writes (``HOROVOD_TIMELINE=FILE``; only rank 0, the coordinator, writes it):
a Chrome-trace JSON array, one "process" per tensor (``M`` records name ``pid`` N after the
tensor, e.g. ``allreduce.grad.w``). Per tensor, top-level spans (``B`` ... ``E``) alternate:
``NEGOTIATE_ALLREDUCE`` (ranks agreeing the tensor is ready everywhere; inside it one ``X``
tick per rank, named by the rank, when rank 0 learns that rank is ready; no ticks when the
response cache answered) and the operation (``ALLREDUCE``, ``BROADCAST``...) whose ``E``
carries ``dtype`` and ``shape``. Inside the operation, activities follow each other:
``INIT_FUSION_BUFFER``, ``MEMCPY_IN_FUSION_BUFFER``, ``MPI_ALLREDUCE`` / ``GLOO_ALLREDUCE``,
``MEMCPY_OUT_FUSION_BUFFER`` (GPUs add ``QUEUE``, ``WAIT_FOR_DATA``...).
``HOROVOD_TIMELINE_MARK_CYCLES=1`` adds an instant ``CYCLE_START`` record per cycle. Times are
integer microseconds since Horovod started. Every record ends with ``]`` that the next one
overwrites, but a rank 0 killed mid-write leaves a file cut anywhere: ``parse`` accepts that.
At shutdown Horovod drops the records still queued, so the last spans may never end; without
the file's folder it writes nothing and only logs an error (``hvdkit run`` creates the folder).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.errors import ConfigError
from ..launcher.timeline_flags import MARK_CYCLES, TIMELINE, ensure_folder, timeline_path

__all__ = [
    "TIMELINE",
    "MARK_CYCLES",
    "CATEGORIES",
    "TensorStats",
    "Summary",
    "timeline_path",
    "ensure_folder",
    "parse",
    "summarise",
    "format_summary",
    "write_json",
]

COMM_PREFIXES = ("MPI_", "GLOO_", "NCCL_", "CCL_", "DDL_")  # activities that move data between ranks
OTHER = "(other)"  # time inside an operation that no activity covers
# The span is split in this order of precedence: an instant counts for the first that applies.
CATEGORIES = ("communication", "other_op_work", "negotiation", "outside_horovod")
_LABELS = {
    "communication": "communication (MPI_/GLOO_/NCCL_ activities)",
    "other_op_work": "other work inside operations (copies, fusion)",
    "negotiation": "negotiation (waiting until every rank is ready)",
    "outside_horovod": "outside Horovod (no tensor in flight)",
}
_DTYPE_BYTES = {
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "uint16": 2,
    "int16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "float32": 4,
    "int64": 8,
    "float64": 8,
}


def parse(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], bool]:
    """``(records, truncated)``: the trace records (dicts) of timeline ``path``, in file order.

    A file that ends early (no closing ``]``, a trailing comma, a last record cut mid-write) is
    read up to its last complete record, with ``truncated`` True. Anything else that is not a
    Horovod timeline raises ConfigError naming the file, line, column and byte offset.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"timeline {path!r} does not exist; pass the FILE given to hvdkit run --timeline") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"timeline {path!r} is not a Horovod timeline: byte {e.start} is not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"cannot read timeline {path!r}: {e.strerror}") from None
    pos = _skip_space(text, 0)
    if pos == len(text):
        raise ConfigError(
            f"timeline {path!r} is empty: rank 0 writes it once the first collective runs (and a running "
            "job may not have flushed it yet); check that the job called Horovod collectives"
        )
    if text[pos] != "[":
        raise _garbage(path, text, pos, "expected '[' that starts a Chrome-trace JSON array")
    decoder, records, pos = json.JSONDecoder(), [], pos + 1
    while True:
        pos = _skip_space(text, pos)
        if pos == len(text):
            return records, True
        if text[pos] == "]":
            rest = _skip_space(text, pos + 1)
            if rest < len(text):
                raise _garbage(path, text, rest, "text after the closing ']'")
            return records, False
        try:
            record, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            # "Unterminated string" means no quote is left in the file: both are a cut-off last record
            if e.msg.startswith("Unterminated string") or _skip_space(text, e.pos) == len(text):
                return records, True
            raise _garbage(path, text, e.pos, e.msg) from None
        if not isinstance(record, dict) or not isinstance(record.get("ph"), str):
            raise _garbage(path, text, pos, "a record that is not a trace event (an object with 'ph')")
        if record["ph"] in ("B", "E", "X", "i") and not isinstance(record.get("ts"), (int, float)):
            raise _garbage(path, text, pos, f"a '{record['ph']}' record without a numeric 'ts'")
        records.append(record)
        pos = _skip_space(text, end)
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos < len(text) and text[pos] != "]":
            raise _garbage(path, text, pos, "expected ',' or ']' after a record")


def _skip_space(text, pos):
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _garbage(path, text, pos, what):
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    offset = len(text[:pos].encode("utf-8"))
    return ConfigError(
        f"timeline {path!r} is not a Horovod timeline at line {line}, column {column} (byte {offset}): "
        f"{what}; give the file written by hvdkit run --timeline (HOROVOD_TIMELINE)"
    )


@dataclass
class TensorStats:
    """One tensor's operations, as the timeline records them (times in microseconds).

    ``activities`` includes ``(other)``, the part of the operations no activity covers, so its
    values sum exactly to ``op_us``. Tensors fused into one operation each count its full time.
    """

    name: str
    ops: int = 0
    op_us: int = 0
    op_kinds: dict = field(default_factory=dict)  # e.g. {"ALLREDUCE": 3}
    activities: dict = field(default_factory=dict)
    negotiations: int = 0
    negotiate_us: int = 0
    dtype: str | None = None
    shape: list | None = None
    bytes: int | None = None


@dataclass
class Summary:
    """Where the time in one timeline went.

    ``span_us`` runs from the first to the last tensor record. ``breakdown`` splits it over
    ``CATEGORIES``: each instant goes to the first category any tensor is in at that instant
    (the union of busy intervals, so overlapping tensors count once), and the rest is
    ``outside_horovod``; the four values sum exactly to ``span_us``.
    """

    path: str
    span_us: int
    breakdown: dict
    tensors: list  # TensorStats, most time in operations first
    readiness: dict
    cycles: int = 0  # CYCLE_START markers (HOROVOD_TIMELINE_MARK_CYCLES)
    truncated: bool = False
    unfinished: int = 0  # spans still open where the file ends
    start_epoch_us: int | None = None  # wall clock of Horovod's time 0

    @property
    def fractions(self) -> dict[str, float]:
        return {k: (v / self.span_us if self.span_us else 0.0) for k, v in self.breakdown.items()}

    def largest(self, k: int) -> list[TensorStats]:
        sized = [t for t in self.tensors if t.bytes is not None]
        return sorted(sized, key=lambda t: (-t.bytes, t.name))[:k]

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "tensors"}
        out["fractions"] = self.fractions
        out["largest"] = [t.name for t in self.largest(top)]
        out["tensors"] = [asdict(t) for t in self.tensors]
        return out


def summarise(path: str | os.PathLike[str], same_cycle_us: int = 500) -> Summary:
    """The Summary of timeline ``path``.

    Readiness: in a negotiation with ticks from several ranks, the rank whose tick came last,
    at least ``same_cycle_us`` after the others, arrived last (rank 0 handles one cycle's
    messages within microseconds, and cycles are ~1 ms apart); closer ticks count as together.
    """
    records, truncated = parse(path)
    names, start_epoch, cycles = {}, None, 0
    stacks, tensors, intervals, ticks_of = {}, {}, [], []
    for r in records:
        ph, pid = r["ph"], r.get("pid")
        if ph == "M":
            args = r.get("args") or {}
            if r.get("name") == "process_name" and "name" in args:
                names[pid] = str(args["name"])
            start_epoch = args.get("start_time_since_epoch_in_micros", start_epoch)
        elif ph == "i":
            cycles += r.get("name") == "CYCLE_START"
        elif ph == "B":
            stacks.setdefault(pid, []).append([r.get("name", "?"), int(r["ts"]), [], []])
        elif ph == "X" and stacks.get(pid):
            stacks[pid][-1][3].append((r.get("name"), int(r["ts"])))
        elif ph == "E" and stacks.get(pid):
            name, start, children, ticks = stacks[pid].pop()
            end = int(r["ts"])
            if len(stacks[pid]) == 1:  # an activity: its operation accounts for it when that closes
                stacks[pid][-1][2].append((name, start, end))
            if stacks[pid]:  # (deeper spans are part of their activity)
                continue
            t = tensors.setdefault(pid, TensorStats(names.get(pid, f"pid {pid}")))
            _close(t, name, start, end, children, r.get("args") or {}, intervals)
            if name.startswith("NEGOTIATE_"):
                ticks_of.append(ticks)
    span = max(i[1] for i in intervals) - min(i[0] for i in intervals) if intervals else 0
    return Summary(
        path=str(path),
        span_us=span,
        breakdown=_breakdown(intervals, span),
        tensors=sorted(tensors.values(), key=lambda t: (-t.op_us, t.name)),
        readiness=_readiness(ticks_of, same_cycle_us),
        cycles=cycles,
        truncated=truncated,
        unfinished=sum(len(s) for s in stacks.values()),
        start_epoch_us=start_epoch,
    )


def _close(t, name, start, end, children, args, intervals):
    """Add one finished top-level span of tensor ``t``; record its busy intervals by category."""
    if name.startswith("NEGOTIATE_"):
        t.negotiations += 1
        t.negotiate_us += end - start
        intervals.append((start, end, 2))
        return
    t.ops += 1
    t.op_us += end - start
    t.op_kinds[name] = t.op_kinds.get(name, 0) + 1
    covered = 0
    for child, c_start, c_end in children:
        t.activities[child] = t.activities.get(child, 0) + (c_end - c_start)
        covered += c_end - c_start
        if child.startswith(COMM_PREFIXES):
            intervals.append((c_start, c_end, 0))
    t.activities[OTHER] = t.activities.get(OTHER, 0) + (end - start - covered)
    intervals.append((start, end, 1))
    if "dtype" in args:
        t.dtype = str(args["dtype"])
        t.shape = [int(d) for d in re.findall(r"\d+", str(args.get("shape", "")))]
        size = _DTYPE_BYTES.get(t.dtype.lower())
        t.bytes = size * math.prod(t.shape) if size else None


def _breakdown(intervals, span):
    """Microseconds per category over the span: a sweep that gives each instant to the first busy category."""
    edges = sorted([(s, 1, c) for s, _, c in intervals] + [(e, -1, c) for _, e, c in intervals])
    busy, out = [0, 0, 0], dict.fromkeys(CATEGORIES, 0)
    for i, (t, delta, c) in enumerate(edges):
        busy[c] += delta
        if i + 1 < len(edges) and edges[i + 1][0] > t:
            active = next((k for k in range(3) if busy[k] > 0), 3)
            out[CATEGORIES[active]] += edges[i + 1][0] - t
    out["outside_horovod"] = span - sum(out[c] for c in CATEGORIES[:3])
    return out


def _readiness(ticks_of, same_cycle_us):
    ranks, last, late_us, together, single = set(), {}, {}, 0, 0
    with_ticks = [t for t in ticks_of if t]
    for ticks in with_ticks:
        by_rank = {}
        for name, ts in ticks:
            if str(name).isdigit():
                by_rank[int(name)] = max(ts, by_rank.get(int(name), ts))
        ranks.update(by_rank)
        if len(by_rank) < 2:
            single += 1
            continue
        order = sorted(by_rank.items(), key=lambda kv: kv[1])
        (rank, latest), before = order[-1], order[-2][1]
        if latest - before < same_cycle_us:
            together += 1
            continue
        last[rank] = last.get(rank, 0) + 1
        late_us[rank] = late_us.get(rank, 0) + latest - order[0][1]
    return {
        "negotiations": len(ticks_of),
        "with_ticks": len(with_ticks),
        "without_ticks": len(ticks_of) - len(with_ticks),  # answered by the response cache
        "ranks": sorted(ranks),
        "last": {str(r): last.get(r, 0) for r in sorted(ranks)},
        "late_us": {str(r): late_us.get(r, 0) for r in sorted(ranks)},  # how long the first-ready rank waited
        "together": together,
        "single_rank": single,
        "same_cycle_us": same_cycle_us,
    }


def format_ms(us: float) -> str:
    """Microseconds as milliseconds with two decimals, as the reports print them."""
    return f"{us / 1000:.2f}"


def _size(n):
    if n is None or n < 1024:
        return "-" if n is None else f"{n} B"
    exp = min(3, (n.bit_length() - 1) // 10)
    return f"{n / 1024**exp:.1f} {('KiB', 'MiB', 'GiB')[exp - 1]}"


def format_summary(s: Summary, top: int = 10) -> str:
    """A plain-text report of Summary ``s``: the span breakdown, the ``top`` tensors, readiness."""
    ops = sum(t.ops for t in s.tensors)
    lines = [
        f"Horovod timeline {s.path} (written by rank 0): {len(s.tensors)} tensors, {ops} operations, "
        f"span {format_ms(s.span_us)} ms" + (f", {s.cycles} cycles marked" if s.cycles else "")
    ]
    if s.truncated:
        lines.append("note: the file is cut off mid-record (rank 0 stopped while writing); read up to the cut")
    if s.unfinished:
        lines.append(
            f"note: {s.unfinished} spans never end in the file and are left out (Horovod drops the records "
            "still queued when it shuts down, so the last operations of a job often lack their end)"
        )
    lines.append("where the span went (each instant counted once, in this order):")
    for c in CATEGORIES:
        lines.append(f"  {_LABELS[c]:<50} {format_ms(s.breakdown[c]):>10} ms {100 * s.fractions[c]:6.1f}%")
    shown = s.tensors[:top]
    lines.append(f"top {len(shown)} of {len(s.tensors)} tensors by time in operations (ms; fused tensors share time):")
    width = max([len(t.name) for t in shown] + [6])
    lines.append(f"  {'tensor':<{width}} {'ops':>5} {'size':>10} {'negotiate':>10} {'op total':>10}  activities")
    for t in shown:
        acts = ", ".join(f"{k} {format_ms(v)}" for k, v in sorted(t.activities.items(), key=lambda kv: -kv[1]))
        lines.append(
            f"  {t.name:<{width}} {t.ops:>5} {_size(t.bytes):>10} {format_ms(t.negotiate_us):>10} "
            f"{format_ms(t.op_us):>10}  {acts}"
        )
    big = s.largest(top)
    if big:
        lines.append("largest tensors: " + ", ".join(f"{t.name} {_size(t.bytes)}" for t in big))
    lines.extend(_readiness_lines(s.readiness))
    return "\n".join(lines) + "\n"


def _readiness_lines(rd):
    if not rd["with_ticks"]:
        return [
            f"negotiation readiness: none of {rd['negotiations']} negotiations recorded per-rank ticks "
            "(the response cache answered them; HOROVOD_CACHE_CAPACITY=0 records every one)"
        ]
    cached = f"; {rd['without_ticks']} answered by the response cache had none" if rd["without_ticks"] else ""
    lines = [
        f"negotiation readiness ({rd['with_ticks']} of {rd['negotiations']} negotiations recorded per-rank ticks"
        f"{cached}):"
    ]
    for r in rd["ranks"]:
        n = rd["last"][str(r)]
        lines.append(
            f"  rank {r} was ready last {n} time{'s' * (n != 1)} (the first-ready rank waited "
            f"{format_ms(rd['late_us'][str(r)])} ms in all)"
        )
    lines.append(f"  every rank ready within {rd['same_cycle_us']} us (the same cycle): {rd['together']} times")
    return lines


def write_json(summary: Summary, out: str | os.PathLike[str], top: int = 10) -> None:
    """Write ``summary`` as JSON to ``out``."""
    try:
        with open(out, "w") as f:
            json.dump(summary.to_dict(top), f, indent=1)
    except OSError as e:
        raise ConfigError(f"cannot write --json {out!r}: {e.strerror}; choose a writable path") from None
