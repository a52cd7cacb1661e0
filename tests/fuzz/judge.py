"""The verdict on one program from every rank's file: passed, or a finding with its class and one line of detail.

A program passes when every rank's results equal NumPy's and agree bit for bit where every rank holds
the same result (unperturbed), or when every rank raised ``CollectiveMismatchError`` at or after the
perturbed call, having got NumPy's answer before it (perturbed). A perturbed point-to-point message
passes when its receiver raised a ``ValueError``/``TypeError`` (or, for a shorter message, received
its elements and nothing more) and every other rank went on. Anything else is a finding: a wrong
result, ranks that differ, a perturbation no rank noticed (silent), a timeout, a hang, a crash, an
error of another type, or a mismatch error that took longer than ``SLOW_S``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.fuzz import known
from tests.fuzz.program import P2P_FIELDS, Program

#: Kinds whose result is the same on every rank of the communicator.
SAME_EVERYWHERE = ("allreduce", "iallreduce", "allgather", "iallgather", "broadcast")
#: Finding classes, worst first.
CLASSES = ("wrong-result", "ranks-differ", "silent", "hang", "crash", "timeout", "error", "slow")
#: A mismatch error that takes longer than this (seconds, from the call's start) is a finding.
SLOW_S = 5.0


@dataclass(frozen=True)
class Verdict:
    """``outcome``: ok, mismatch (the expected error), limit (a documented timeout), known (KNOWN_OPEN) or finding."""

    outcome: str
    cls: str = ""
    detail: str = ""
    rule: str = ""

    @property
    def failed(self) -> bool:
        """True for a finding nothing explains."""
        return self.outcome == "finding"


def _first_error(errors: dict, test) -> str:
    rank, e = next((r, e) for r, e in sorted(errors.items()) if test(e))
    where = f" (npddp/{e['where']})" if e.get("where") else ""
    return f"rank {rank} at op {e['index']}: {e['module']}.{e['type']}{where}: {e['message'][:160]}"


def _problems(program: Program, files: dict, found: list) -> None:
    """Results that differ from NumPy's, and results that differ between ranks, before any perturbation."""
    p = program.perturbation
    limit = len(program.ops) if p is None else p.index
    same: dict = {}
    for rank, data in sorted(files.items()):
        for index, dig, problem, group in data["records"]:
            if index >= limit:
                continue
            if problem:
                found.append(("wrong-result", f"rank {rank} op {index} {program.ops[index].kind}: {problem}"))
            if program.ops[index].kind in SAME_EVERYWHERE:
                same.setdefault((index, group), {})[rank] = dig
    for (index, group), digests in sorted(same.items()):
        if len(set(digests.values())) > 1:
            found.append(("ranks-differ", f"op {index} {program.ops[index].kind}: digests by rank {digests}"))


def _perturbed(program: Program, transport: str, files: dict, found: list, slow_s: float) -> str:
    """Findings of a perturbed collective; returns ``limit`` where a documented limit explains a timeout."""
    p = program.perturbation
    errors = {r: d["error"] for r, d in files.items() if d["error"]}
    quiet = sorted(set(files) - set(errors))
    if quiet:
        found.append(("silent", f"ranks {quiet} finished without an error; perturbed: rank {p.rank} op {p.index} "
                                f"{program.ops[p.index].kind} {p.field}"))
    polls = {r: e for r, e in errors.items() if e["type"] == "PollHang"}
    if polls:
        found.append(("hang", _first_error(polls, lambda e: True)))
    timeouts = {r: e for r, e in errors.items() if e["timeout"]}
    others = {r: e for r, e in errors.items() if not e["mismatch"] and not e["timeout"]}
    if others:
        found.append(("error", _first_error(others, lambda e: True)))
    if timeouts:
        rule = known.matching(known.LIMITS, program, transport)
        if rule is not None and not quiet and not others:
            return rule.name
        found.append(("timeout", _first_error(timeouts, lambda e: True)))
    slow = {r: e for r, e in errors.items() if e["mismatch"] and e["elapsed"] > slow_s}
    if slow:
        found.append(("slow", _first_error(slow, lambda e: True) + f" (after {max(e['elapsed'] for e in slow.values())} s)"))
    return ""


def _p2p(program: Program, files: dict, found: list) -> None:
    """Findings of a perturbed point-to-point message: its receiver must refuse it (or, shorter, hold it exactly)."""
    p = program.perturbation
    src, dst = program.op_of(p.rank, p.index).messages[0][:2]
    for rank, data in sorted(files.items()):
        e = data["error"]
        if rank == dst:
            if e is None and p.field != "p2p-shorter":
                message = [r[2] for r in data["records"] if r[0] == p.index]
                found.append(("silent", f"rank {dst} {message[0] if message else 'received'} ({p.field})"))
            elif e is None:
                problems = [r[2] for r in data["records"] if r[0] == p.index and r[2]]
                if problems:
                    found.append(("wrong-result", f"rank {dst}: {problems[0]} ({p.field})"))
            elif not e["value"] or e["index"] != p.index:
                found.append(("timeout" if e["timeout"] else "error", _first_error({rank: e}, lambda e: True)))
        elif e is not None and not (rank == src and e["value"] and e["index"] == p.index):
            found.append(("timeout" if e["timeout"] else "error", _first_error({rank: e}, lambda e: True)))


def judge(program: Program, transport: str, files: dict, missing: str = "", slow_s: float = SLOW_S) -> Verdict:
    """The verdict on ``program`` run over ``transport``: ``files`` maps each rank that wrote its file to it;
    ``missing`` says why the others did not (``hang`` or ``crash`` and a detail); a mismatch error later than
    ``slow_s`` seconds after its call started is a finding."""
    found: list = []
    if missing:
        cls, _, detail = missing.partition(":")
        found.append((cls, f"ranks {sorted(set(range(program.size)) - set(files))} wrote nothing: {detail.strip()}"))
    _problems(program, files, found)
    p = program.perturbation
    limit = ""
    if p is None:
        errors = {r: d["error"] for r, d in files.items() if d["error"]}
        if errors:
            cls = ("hang" if any(e["type"] == "PollHang" for e in errors.values()) else
                   "timeout" if any(e["timeout"] for e in errors.values()) else "error")
            found.append((cls, _first_error(errors, lambda e: True)))
    elif p.field in P2P_FIELDS:
        _p2p(program, files, found)
    elif files:
        limit = _perturbed(program, transport, files, found, slow_s)
    if not found:
        return Verdict("limit", rule=limit) if limit else Verdict("ok" if p is None else "mismatch")
    cls, detail = min(found, key=lambda f: CLASSES.index(f[0]))
    rule = known.matching(known.KNOWN_OPEN, program, transport)
    return Verdict("known" if rule else "finding", cls, detail, rule.name if rule else "")
