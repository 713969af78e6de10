"""The lab's figure: each strategy's measured time (median, whiskers at the fastest and slowest repetition)
beside the cost model's prediction."""

from ..plotstyle import DARK_GREY, figure_context, style


def plot_lab(report, path):
    entries = report["strategies"]
    with figure_context() as Figure:
        figure = Figure(figsize=(8, 4.5))
        axes = figure.add_subplot()
        positions = range(len(entries))
        measured = [e["measured_ms"] for e in entries]
        low = [e["measured_ms"] - min(e["reps_ms"]) for e in entries]
        high = [max(e["reps_ms"]) - e["measured_ms"] for e in entries]
        colour, _ = style(0)
        axes.bar([p - 0.2 for p in positions], measured, width=0.4, color=colour, label="measured (median)",
                 yerr=[low, high], ecolor=DARK_GREY, capsize=4)
        colour, _ = style(1)
        axes.bar([p + 0.2 for p in positions], [e["predicted_ms"] for e in entries], width=0.4, color=colour,
                 label="cost model")
        for p, entry in zip(positions, entries):
            ratio = entry["measured_over_predicted"]
            if ratio is not None:
                axes.annotate(f"{ratio:.2f}x", (p, max(entry["measured_ms"], entry["predicted_ms"])),
                              textcoords="offset points", xytext=(0, 4), ha="center", fontsize=9)
        axes.set_xticks(list(positions), [e["name"].replace("_", " ") for e in entries])
        axes.set_ylabel("one synchronization (ms)")
        axes.set_title(f"{report['topology']}: {len(report['islands'])} islands x {report['vector_bytes'] / 1e6:g} MB, "
                       f"delay x{report['delay_scale']:g}, rate x{report['rate_scale']:g}")
        axes.legend(frameon=False)
        figure.tight_layout()
        figure.savefig(path)
