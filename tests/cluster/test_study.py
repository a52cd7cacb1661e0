"""benchmarks/cluster_study.py's summaries, from made-up sweeps whose figures are known."""

import csv

from benchmarks.cluster_study import fit_network, summarize, summarize_ddp

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


def test_network_fit_recovers_the_alpha_and_beta_the_times_were_made_from(tmp_path):
    from npddp.comm.algorithms.registry import algorithm
    alpha, beta = 40e-6, 1e9 / 8 * 0.9  # 0.9 of a 1 Gbit/s link, in bytes/s
    rows = []
    for world in (2, 4):
        for name in ("ring", "rd"):
            for n in (1 << 10, 1 << 16, 1 << 20, 1 << 24):
                cost = algorithm(name).cost(1.0, world)
                t = cost.steps * alpha + cost.sent * n / beta
                rows.append(dict(collective="allreduce", backend=name, transport="tcp", place="inplace", bytes=n,
                                 time_median_s=t))
        _write(tmp_path / f"ar{world}.csv", AR_FIELDS, rows)
        lines = fit_network(tmp_path / f"ar{world}.csv", 1e9, world)
        fitted = {ln.split()[0]: ln.split() for ln in lines[2:]}
        assert set(fitted) == {"ring/tcp", "rd/tcp"}
        for cells in fitted.values():
            assert abs(float(cells[1]) - 40.0) < 0.1 and cells[3] == "0.90" and float(cells[4]) < 0.01
        late = fit_network(tmp_path / f"ar{world}.csv", 1e9, world, 1 << 20)
        assert all(ln.split()[-1] == "2" for ln in late[2:]) and "sizes >= 1048576 B" in late[0]
        rows = []


def test_other_collectives_are_summarised_out_of_place_with_their_own_bus_factor(tmp_path):
    n = 16 << 20   # the all-gather's whole output; the ring puts (N-1)/N of it on each link
    times = {("raw", "mpi"): 0.5, ("ring", "mpi"): n * 8 / 1e9 / 2 / 0.8, ("naive", "mpi"): 0.4,
             ("auto", "mpi"): n * 8 / 1e9 / 2 / 0.8 * 1.25}
    rows = [dict(collective="allgather", backend=b, transport=t, place="outofplace", bytes=n, time_median_s=s)
            for (b, t), s in times.items()]
    _write(tmp_path / "ag.csv", AR_FIELDS, rows)
    lines = summarize(tmp_path / "ag.csv", 1e9, 2)
    assert lines[0].startswith("# allgather: median ms; share = (0.5 x bytes / time)")
    assert lines[1].split()[1:5] == ["raw", "ring", "naive", "auto"]
    last = lines[-1].split()
    assert last[0] == str(n) and last[-4:] == ["0.80", "-", "1.25", "-"]
    assert [ln.split()[0] for ln in fit_network(tmp_path / "ag.csv", 1e9, 2)[2:]] == []   # one size: nothing to fit
