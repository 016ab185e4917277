"""Tables (Markdown), plots (PNG) and the generated part of BENCHMARKS.md."""

from __future__ import annotations

import math
from pathlib import Path

BEGIN = "<!-- BEGIN GENERATED: bench/run.py rewrites everything down to END GENERATED -->"
END = "<!-- END GENERATED -->"


def fmt_time(row: dict | None, timeout: float) -> str:
    if row is None:
        return "-"
    status = row["status"]
    if status == "ok":
        cell = f"{row['median']:.3g}"
        if row.get("agrees") is False:
            cell += f" **WRONG ({row['deviation']:+d} pairs)**"
        elif row.get("deviation"):
            cell += f" ({row['deviation']:+d} pairs)"
        return cell
    if status == "timeout":
        return f"timeout (>{timeout:g} s)"
    if status == "skipped":
        return f"skipped ({row['message']})"
    return "error"


def peers_of(point: dict, peer_keys: list[str]) -> tuple[str | None, float | None]:
    """Fastest peer at this point among those that ran and agreed."""
    best = None
    for k in peer_keys:
        row = point["systems"].get(k)
        if row and row["status"] == "ok" and row.get("agrees", True):
            if best is None or row["median"] < best[1]:
                best = (k, row["median"])
    return best if best else (None, None)


def speedup(point: dict, key: str, peer_keys: list[str]) -> float | None:
    row = point["systems"].get(key)
    _, best = peers_of(point, peer_keys)
    if not row or row["status"] != "ok" or not row.get("agrees", False) or best is None:
        return None
    return best / row["median"]


def suite_keys(suite: list[dict]) -> list[str]:
    keys: list[str] = []
    for w in suite:
        for p in w["points"]:
            for k in p["systems"]:
                if k not in keys:
                    keys.append(k)
    return keys


def split_keys(keys: list[str]) -> tuple[list[str], list[str]]:
    ours = [k for k in keys if k.startswith("simjoin")]
    return ours, [k for k in keys if k not in ours]


# ---------------------------------------------------------------------------------------
# Plots


def plain_log_labels(axis) -> None:
    """Log-axis tick labels as plain numbers (0.2, 5, 100), not 2x10^-1."""
    from matplotlib.ticker import FuncFormatter

    def minor(v: float, _pos) -> str:
        # Over more than a decade label only 2x and 5x, so the axis does not crowd.
        lo, hi = sorted(axis.get_view_interval())
        if lo > 0 and hi / lo < 10:
            return f"{v:.2g}"
        lead = round(v / 10 ** math.floor(math.log10(v))) if v > 0 else 0
        return f"{v:g}" if lead in (2, 5) else ""

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def plot_workload(w: dict, labels: dict, path: Path, timeout: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.0), dpi=110)
    eps = [p["eps"] for p in w["points"]]
    markers = "osD^v<>ph*"
    for i, key in enumerate(suite_keys([w])):
        xs = [p["eps"] for p in w["points"] if p["systems"][key]["status"] == "ok"]
        ys = [p["systems"][key]["median"] for p in w["points"] if p["systems"][key]["status"] == "ok"]
        label = labels.get(key, key)
        failed = [p for p in w["points"] if p["systems"][key]["status"] in ("timeout", "error")]
        if failed:
            row = failed[0]["systems"][key]
            what = f"timeout > {timeout:g} s" if row["status"] == "timeout" else "error"
            label += f" ({what} at eps = {failed[0]['eps']:g})"
        style = "-" if key.startswith("simjoin") else "--"
        ax.plot(xs, ys, style, marker=markers[i % len(markers)], label=label)
    ax.set_yscale("log")
    plain_log_labels(ax.yaxis)
    ax.set_xlabel("eps")
    ax.set_ylabel("time (s, median)")
    ax.set_title(f"{w['workload']}: {w['description']}, n = {w['n']:,}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    sel = [(p["eps"], p["selectivity"]) for p in w["points"] if p["selectivity"] is not None]
    if sel:
        ax2 = ax.twinx()
        ax2.plot([s[0] for s in sel], [s[1] for s in sel], ":", color="gray", marker="x", label="selectivity")
        ax2.set_ylabel("selectivity (neighbours per point)", color="gray")
        ax2.set_yscale("log")
        plain_log_labels(ax2.yaxis)
        ax2.tick_params(axis="y", colors="gray")
        handles, names = ax.get_legend_handles_labels()
        more, more_names = ax2.get_legend_handles_labels()
        handles, names = handles + more, names + more_names
    else:
        handles, names = ax.get_legend_handles_labels()
    # Below the axes, where it hides no data.
    ax.legend(handles, names, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    if len(eps) > 1:
        span = max(eps) - min(eps)
        ax.set_xlim(min(eps) - 0.05 * span, max(eps) + 0.05 * span)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_speedups(suite: list[dict], labels: dict, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours, peers = split_keys(suite_keys(suite))
    ours = [k for k in ours if any(speedup(p, k, peers) for w in suite for p in w["points"])]
    if not ours:
        return False
    fig, axes = plt.subplots(1, len(ours), figsize=(7.6 * len(ours), 4.2), dpi=110, squeeze=False)
    for ax, key in zip(axes[0], ours):
        for w in suite:
            pts = [(p["selectivity"], speedup(p, key, peers)) for p in w["points"]]
            pts = [(s, v) for s, v in pts if s is not None and v is not None]
            if pts:
                ax.plot([s for s, _ in pts], [v for _, v in pts], "-o", label=w["workload"])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_log_labels(ax.yaxis)
        plain_log_labels(ax.xaxis)
        ax.set_xlabel("selectivity (neighbours per point)")
        ax.set_ylabel("speed-up over the best peer (x)")
        ax.set_title(f"{labels.get(key, key)} vs best peer (above 1 = simjoin faster)", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------------------
# Markdown


def suite_markdown(suite: list[dict], labels: dict, timeout: float, img_prefix: str, suite_name: str) -> list[str]:
    keys = suite_keys(suite)
    ours, peers = split_keys(keys)
    lines = []
    for w in suite:
        lines.append(f"#### {w['workload']}: {w['description']}, n = {w['n']:,}, d = {w['dim']} ({w['source']})")
        lines.append("")
        if img_prefix:
            lines.append(f"![{w['workload']}]({img_prefix}{w['workload']}.png)")
            lines.append("")
        head = ["eps", "selectivity", "pairs"] + [labels.get(k, k) for k in keys] + ["best peer"]
        head += [f"{labels.get(k, k)} speed-up" for k in ours] if peers else []
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for p in w["points"]:
            sel = f"{p['selectivity']:.3g}" if p["selectivity"] is not None else "?"
            pairs = f"{p['pairs']:,}" if p["pairs"] is not None else "?"
            cells = [f"{p['eps']:g}", sel, pairs] + [fmt_time(p["systems"].get(k), timeout) for k in keys]
            best_key, _ = peers_of(p, peers)
            cells.append(labels.get(best_key, best_key).split(" ")[0] if best_key else "-")
            if peers:
                for k in ours:
                    s = speedup(p, k, peers)
                    cells.append(f"**{s:.2f}x**" if s is not None and s >= 1 else (f"{s:.2f}x" if s else "-"))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def summary_lines(suite: list[dict], labels: dict) -> list[str]:
    ours, peers = split_keys(suite_keys(suite))
    lines = []
    for key in ours:
        per = []
        for w in suite:
            s = [speedup(p, key, peers) for p in w["points"]]
            s = [v for v in s if v is not None]
            if s:
                wins = sum(v >= 1 for v in s)
                geo = math.exp(sum(math.log(v) for v in s) / len(s))
                per.append(f"{w['workload']}: {wins}/{len(s)} eps won, {min(s):.2f}x-{max(s):.2f}x (geo-mean {geo:.2f}x)")
        if per:
            lines.append(f"- **{labels.get(key, key)}** against the fastest peer at each eps:")
            lines += [f"  - {x}" for x in per]
    return lines


def generated_markdown(results: dict, img_dir: str, has_speedup_plot: bool) -> str:
    m, o = results["machine"], results["options"]
    labels = results["systems"]
    v = m["versions"]
    lines = [BEGIN, "", "## Latest results", ""]
    lines.append(
        f"Run on {m['date_utc']} on `{m['host']}`: {m['cpu']}, {m['cores']} cores, "
        f"{m['memory_gib']} GiB, {m['os']}; simjoin commit `{m['simjoin_commit']}`; "
        f"Python {v.get('python')}, numpy {v.get('numpy')}, scipy {v.get('scipy')}, "
        f"scikit-learn {v.get('sklearn')}, faiss-cpu {v.get('faiss')}. "
        f"Vulkan devices: {', '.join(d['name'] for d in m['vulkan_devices']) or 'none found'}."
    )
    if "load_average_start" in m:
        lines[-1] += (
            f" Load average (1, 5, 15 min) at the start {m['load_average_start']}, at the end "
            f"{m.get('load_average_end')}: above 0 means other work shared the {m['cores']} cores."
        )
    lines.append("")
    lines.append(
        f"Command: `{o['command']}` (took {results['elapsed_s']:.0f} s). Each time is the median of "
        f"{o['repeats']} runs in seconds (fewer when the runs at that eps passed {o.get('repeat_budget_s', 0):g} s "
        f"in total; at least one), index build included, data already in memory "
        f"(simjoin: the `seconds` its `--stats` reports). Per-run timeout {o['timeout_s']:g} s; a system "
        f"that times out or fails at one eps is skipped at the larger ones. Selectivity = "
        f"2 x pairs / n (neighbours per point, self excluded). Speed-up = fastest peer's median / "
        f"simjoin's median at the same eps in the same run (only where simjoin's count agreed). "
        f"FAISS's count may differ from the exact one by up to {o['faiss_tolerance']:g} (relative) "
        f"and the difference is shown."
    )
    lines.append("")
    main = results["suites"]["main"]
    lines += ["### Workloads and eps", "", "| workload | source | n | d | eps (chosen by sampling) | selectivity measured |", "|---|---|---|---|---|---|"]
    for w in main:
        eps = ", ".join(f"{p['eps']:g}" for p in w["points"])
        sel = ", ".join(f"{p['selectivity']:.3g}" if p["selectivity"] is not None else "?" for p in w["points"])
        lines.append(f"| {w['workload']} ({w['description']}) | {w['source']} | {w['n']:,} | {w['dim']} | {eps} | {sel} |")
    lines.append("")
    lines += ["### Summary", ""] + (summary_lines(main, labels) or ["- no simjoin run agreed with a peer"]) + [""]
    if has_speedup_plot:
        lines += [f"![speed-up over the best peer]({img_dir}/speedup.png)", ""]
    lines += ["### Time (s) against eps", ""]
    lines += suite_markdown(main, labels, o["timeout_s"], f"{img_dir}/", "main")
    if "software-vulkan" in results["suites"]:
        lines += ["### simjoin on lavapipe (software Vulkan)", ""]
        lines.append(
            f"lavapipe runs compute shaders on the CPU: it is here to show the Vulkan path works end "
            f"to end and agrees, not for speed. It runs at n <= {o['lavapipe_n']:,} with a "
            f"{o['lavapipe_timeout_s']:g} s timeout, eps re-chosen for that size, beside simjoin CPU and scipy."
        )
        lines.append("")
        lines += suite_markdown(results["suites"]["software-vulkan"], labels, o["lavapipe_timeout_s"], "", "software")
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_report(results: dict, out: Path, markdown_path: Path | None) -> None:
    labels = results["systems"]
    for w in results["suites"]["main"]:
        plot_workload(w, labels, out / f"{w['workload']}.png", results["options"]["timeout_s"])
    has_speedup_plot = plot_speedups(results["suites"]["main"], labels, out / "speedup.png")
    rel = out.resolve()
    try:
        img_dir = str(rel.relative_to(markdown_path.parent.resolve())) if markdown_path else str(out)
    except ValueError:
        img_dir = str(rel)
    text = generated_markdown(results, img_dir, has_speedup_plot)
    (out / "results.md").write_text(text.replace(f"{img_dir}/", ""))
    if markdown_path is None:
        return
    old = markdown_path.read_text() if markdown_path.exists() else ""
    if BEGIN in old and END in old:
        new = old[: old.index(BEGIN)] + text + old[old.index(END) + len(END) + 1 :]
    else:
        new = old + ("\n" if old else "") + text
    markdown_path.write_text(new)
