"""Numbers for people: formatting, text tables, medians and ratios.

Theory of operation: a ratio is always `a / b` of two medians measured in the same
run, rounded to 3 places; a missing side gives None (printed as "-"), never 0.
"""

import statistics


def median_of(samples, key):
    vals = [s[key] for s in samples if s.get(key) is not None]
    return statistics.median(vals) if vals else None


def ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return round(a / b, 3)


def fmt(v, nd=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{nd}f}"
    return str(v)


def table(headers, rows):
    """Left-aligned first column, right-aligned others, two spaces between."""
    w = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(str(c).rjust(w[i]) if i else str(c).ljust(w[i])
                         for i, c in enumerate(cells))
    return "\n".join([line(headers), "  ".join("-" * x for x in w)] + [line(r) for r in rows])
