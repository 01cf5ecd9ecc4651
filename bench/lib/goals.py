"""The `goals` record (ARCHITECTURE.md section 8).

Theory of operation: every scenario's JSON carries `goals`, one entry per number the
product is held to: {"goal", "target" (">= 0.95"), "measured", "unit", "met"}. A goal whose
figure could not be measured is listed with measured null and met false, so a script
reading the record never mistakes a missing number for a met goal.
"""

OPS = {">=": lambda m, t: m >= t, "<=": lambda m, t: m <= t}


def goal(name, op, target, measured, unit="x"):
    met = measured is not None and OPS[op](measured, target)
    return {"goal": name, "target": f"{op} {target}", "measured": measured, "unit": unit,
            "met": bool(met)}


def new_over_old(name, ratio_value, rev, floor=0.95):
    """Goal for one figure of the old-vs-new comparison: new / old >= floor."""
    return goal(f"{name}, new / old ({rev})", ">=", floor, ratio_value)


def print_goals(goals):
    """One line per goal, for the human output."""
    lines = ["goals:"]
    for g in goals:
        mark = "met    " if g["met"] else "NOT MET"
        m = "-" if g["measured"] is None else f"{g['measured']:.3f}"
        lines.append(f"  {mark} {g['goal']}: {m} {g['unit']} (target {g['target']})")
    return "\n".join(lines)
