"""What every figure inwire writes shares: resolution, text size and a colour-blind-safe palette.

Colours are Okabe and Ito's ("Color Universal Design", 2008): eight hues told apart under the common forms of
colour blindness. Their yellow is left out of lines on white (it barely shows); black is kept for text and
marks. Figures are drawn on `matplotlib.figure.Figure` objects, not through pyplot, so nothing global changes
and a caller (a test) can look at the artists of a figure it was handed.
"""

import contextlib

DPI = 150
"""Resolution of every PNG: a 12-inch figure is 1,800 pixels wide."""

OKABE_ITO = {
    "orange": "#E69F00", "sky blue": "#56B4E9", "bluish green": "#009E73", "yellow": "#F0E442",
    "blue": "#0072B2", "vermillion": "#D55E00", "reddish purple": "#CC79A7", "black": "#000000",
}
DARK_GREY = "#4D4D4D"
LINE_COLOURS = tuple(OKABE_ITO[name] for name in ("blue", "vermillion", "bluish green", "reddish purple", "orange",
                                                  "sky blue", "black"))
"""Hues for lines and marks on white, in the order they are handed out."""
LINE_STYLES = ("-", "--", "-.", ":")
"""Beyond len(LINE_COLOURS) lines, colours repeat with the next dash pattern."""

RC = {
    "font.size": 11, "axes.titlesize": 11, "axes.labelsize": 11, "xtick.labelsize": 10, "ytick.labelsize": 10,
    "legend.fontsize": 10, "figure.titlesize": 13, "savefig.dpi": DPI, "figure.dpi": DPI,
    "axes.spines.top": False, "axes.spines.right": False,
}


def style(index):
    """Colour and dash pattern of the `index`-th line or group."""
    return LINE_COLOURS[index % len(LINE_COLOURS)], LINE_STYLES[(index // len(LINE_COLOURS)) % len(LINE_STYLES)]


@contextlib.contextmanager
def figure_context():
    """Matplotlib's settings for one figure, restored afterwards; yields the Figure class (Agg-backed)."""
    import matplotlib

    with matplotlib.rc_context(RC):
        from matplotlib.figure import Figure

        yield Figure
