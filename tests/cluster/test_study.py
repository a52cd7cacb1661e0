"""benchmarks/cluster_study.py's summaries, from made-up sweeps whose figures are known."""

import csv

from benchmarks.cluster_study import summarize, summarize_ddp

AR_FIELDS = ["collective", "backend", "transport", "place", "bytes", "time_median_s"]


def _write(path, fields, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def test_share_of_the_link_and_auto_over_the_best_fixed(tmp_path):
    n = 16 << 20
    times = {("ring", "mpi"): n * 8 / 1e9 / 0.9, ("ring", "tcp"): n * 8 / 1e9 / 0.95, ("rd", "mpi"): 0.3,
             ("rd", "tcp"): 0.2, ("auto", "mpi"): n * 8 / 1e9 / 0.9 * 1.5, ("auto", "tcp"): n * 8 / 1e9 / 0.95}
    rows = [dict(collective="allreduce", backend=b, transport=t, place=place, bytes=n,
                 time_median_s=s if place == "inplace" else 99) for (b, t), s in times.items()
            for place in ("inplace", "outofplace")]
    _write(tmp_path / "ar.csv", AR_FIELDS, rows)
    last = summarize(tmp_path / "ar.csv", 1e9, 2)[-1].split()
    assert last[0] == str(n) and last[-4:] == ["0.90", "0.95", "1.50", "1.00"]


def test_ddp_prediction_is_two_n_minus_one_over_n_bytes_over_the_rate(tmp_path):
    fields = ["model", "params", "backend", "step_ms", "comm_ms", "comm_fraction", "comm_bytes"]
    rows = [dict(model="tiny", params=1000000, backend="none", step_ms=50, comm_ms=0, comm_fraction=0, comm_bytes=0),
            dict(model="tiny", params=1000000, backend="ring", step_ms=100, comm_ms=60, comm_fraction=0.6,
                 comm_bytes=4000000)]
    _write(tmp_path / "ddp.csv", fields, rows)
    last = summarize_ddp(tmp_path / "ddp.csv", 1e9, 2)[-1].split()
    # 2 (2-1)/2 x 4 MB x 8 / 1 Gbit/s = 32 ms; share 32 / (32 + 50)
    assert last[:2] == ["tiny", "1000000"] and last[-2:] == ["32.0", f"{32 / 82:.2f}"] and last[-3] == "0.50"
