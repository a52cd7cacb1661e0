"""The report's view of ``parallelism`` dumps: one node and emulated clusters side by side.

Every dump is one network: ``local`` (one node) or K nodes x R ranks at a link rate. The table
puts each (size, N, layout) on a row with, per network, the step time, the exposed
communication, the bytes per rank (handed over, sent by a bandwidth-optimal algorithm, and,
across nodes, what the node's link carried) and the pipeline bubble beside (K-1)/(M+K-1). The
figure draws the step times, the bytes per rank and the bubble, one bar per network.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from benchmarks._plots import _figure

MIB = float(1 << 20)


def network(row) -> str:
    """'1 node x 4' or '2 nodes x 2, 1gbit' for a row of a parallelism dump."""
    if int(row["nodes"]) == 1:
        return f"1 node x {int(row['world_size'])}"
    return f"{int(row['nodes'])} nodes x {int(row['ranks_per_node'])}, {row['rate']}"


def combined(frames):
    """One DataFrame of every parallelism dump's rows, with a ``network`` column."""
    import pandas as pd
    df = pd.concat(frames, ignore_index=True)
    df["network"] = [network(r) for _, r in df.iterrows()]
    return df


def comparison_table(frames) -> str:
    """Per (size, N, layout) and network: step and comm ms, MiB per rank handed / sent / on the link, bubble."""
    df = combined(frames)
    df["MiB handed"] = df["comm_bytes"] / MIB
    df["MiB sent"] = df["sent_bytes"] / MIB
    df["MiB link"] = df["link_bytes"] / MIB
    df["bubble (theory)"] = [f"{b:.2f} ({t:.2f})" if p > 1 else "-"
                             for b, t, p in zip(df["bubble"], df["bubble_theory"], df["pp"])]
    df["peak MiB"] = [f"{lo:.0f}-{hi:.0f}" for lo, hi in zip(df["peak_rss_min_mib"], df["peak_rss_mib"])]
    for column in ("step_ms", "comm_ms"):
        df[column] = [f"{v:.1f}" for v in df[column]]
    keep = ["model_size", "world_size", "layout", "network", "step_ms", "comm_ms", "MiB handed", "MiB sent",
            "MiB link", "bubble (theory)", "peak MiB", "repeats"]
    out = df[keep].sort_values(["model_size", "world_size", "layout", "network"], kind="stable")
    return ("== parallelism across networks (per step; bytes per rank; peak: smallest-largest rank)\n"
            + out.to_string(index=False, float_format="{:.3g}".format, na_rep="-"))


def _bars(ax, df, labels, networks, column, scale=1.0):
    """Grouped horizontal bars: one group per label, one bar per network."""
    height = 0.8 / max(1, len(networks))
    for i, net in enumerate(networks):
        part = df[df["network"] == net].set_index("label")[column].reindex(labels) / scale
        ax.barh(np.arange(len(labels)) + i * height, part.to_numpy(), height=height, label=net)
    ax.set_yticks(np.arange(len(labels)) + height * (len(networks) - 1) / 2, labels=labels, fontsize=7)
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)


def figure(frames, meta: dict) -> Figure:
    """Step time, MiB sent per rank (and carried by the links) and the bubble, per layout and network."""
    df = combined(frames)
    df["label"] = [f"{s} N={n} {lay}" for s, n, lay in zip(df["model_size"], df["world_size"], df["layout"])]
    labels = list(dict.fromkeys(df["label"]))
    networks = list(dict.fromkeys(df["network"]))
    fig = _figure(13, 1.8 + 0.28 * len(labels) * max(1, len(networks)) / 2,
                  "GPT step under each layout, one node and emulated clusters", meta,
                  world_size=",".join(str(n) for n in sorted(set(df["world_size"]))))
    step, sent, bubble = fig.subplots(1, 3, sharey=True)
    _bars(step, df, labels, networks, "step_ms")
    step.set_xlabel("step time (ms, median; slowest rank)")
    _bars(sent, df, labels, networks, "sent_bytes", MIB)
    across = df[df["nodes"] > 1]
    if len(across):
        height = 0.8 / max(1, len(networks))
        for i, net in enumerate(networks):
            part = across[across["network"] == net].set_index("label")["link_bytes"].reindex(labels) / MIB
            sent.scatter(part.to_numpy(), np.arange(len(labels)) + i * height, marker="|", s=60, color="black",
                         label="on the link" if i == networks.index(across["network"].iloc[0]) else None, zorder=3)
    sent.set_xscale("log")
    sent.set_xlabel("MiB per rank per step, log (bar: bandwidth-optimal; |: link)")
    _bars(bubble, df, labels, networks, "bubble")
    theory = df.drop_duplicates("label").set_index("label")["bubble_theory"].reindex(labels)
    bubble.scatter(theory.to_numpy(), np.arange(len(labels)) + 0.4 - 0.4 / max(1, len(networks)), marker="x",
                   color="black", label="(K-1)/(M+K-1)", zorder=3)
    bubble.set_xlabel("pipeline bubble (share of the step)")
    handles, names = step.get_legend_handles_labels()
    for ax in (sent, bubble):
        for handle, name in zip(*ax.get_legend_handles_labels()):
            if name not in names:
                handles.append(handle)
                names.append(name)
    fig.legend(handles, names, loc="outside lower center", ncols=len(networks) + 2, fontsize=8, frameon=False)
    return fig
