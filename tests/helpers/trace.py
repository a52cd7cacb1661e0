"""Reading Chrome trace documents the timeline recorder writes: their spans, and spans that overlap unnested."""


def x_events(doc):
    """The complete ("X") events of a Chrome trace document."""
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def nesting_problems(doc) -> list:
    """Pairs of events on one (pid, tid) that overlap without one containing the other."""
    problems = []
    by_thread = {}
    for e in x_events(doc):
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for key, spans in by_thread.items():
        for i, (s1, e1, n1) in enumerate(spans):
            for s2, e2, n2 in spans[i + 1:]:
                overlap = s1 < e2 and s2 < e1
                nested = (s1 <= s2 and e2 <= e1) or (s2 <= s1 and e1 <= e2)
                if overlap and not nested:
                    problems.append((key, n1, n2))
    return problems
