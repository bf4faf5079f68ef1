"""Timed-out partial matches (`ON TIMEOUT EMIT PARTIAL`) for the AIP kernel's runs.

A run (skip-till-next-match, strict-contiguity) expires when its partition's event time
passes `first.ts + W`, or at flush. Generated here, from the `AipGenerator` of the query:

- `_time_out(p, now, force, <channel tables>, evp, IT, ibase, icnt, NR, NP, tom, toe_i,
  toe_f, t_out, t_el)`: every run of partition p that has expired (all of them when
  `force`) leaves its segment (the others keep their order) and is written out as a
  partial composite: `tom[m] = (p, first element row, element count)`, `toe_i`/`toe_f`
  one row per bound event (variable index, then the event's columns) in step order, a
  Kleene variable's elements oldest first. The process kernel calls it for the arriving
  event's partition before the event is stored (so the bound events are all still in the
  channel tables) or offered to the runs.
- `time_out_all(punct, force, <arenas>, base, cnt, evicted, last_ts, IT, ibase, icnt, NR,
  NP, parts)`: the same for the partitions `parts` (punctuation and flush: all of them;
  idle-key eviction: those evicted, forced).

Runs never use equality classes, so a run's key is its partition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cep_core.kernels.seq_aip_runtime import R_FIRST, R_MASK
from cep_core.compiler.seq_codegen import indent as _indent
from cep_core.compiler.seq_plan import VarKind

if TYPE_CHECKING:
    from cep_core.compiler.seq_aip import AipGenerator


def timeout_source(gen: AipGenerator) -> list[str]:
    """The two generated functions above, as source lines."""
    return _time_out(gen) + _time_out_all(gen)


def _time_out(gen: AipGenerator) -> list[str]:
    S, W, width = gen.S, gen.W, gen.width
    nI, nF = gen.layout.n_int, gen.layout.n_float
    lines = ["@njit(cache=True)",
             f"def _time_out(p, now, force, {gen.channel_params()}, evp, IT, ibase, icnt, NR, "
             "NP, tom, toe_i, toe_f, t_out, t_el):"]
    body = ["kb = np.empty(16, np.int64)",
            f"for st in range({S}):",
            f"    seg = p * {S} + st",
            "    b = ibase[seg]",
            "    w = 0",
            "    for r in range(icnt[seg]):",
            "        ri = b + r",
            f"        if not (force or now > IT[ri, {R_FIRST}] + {W}):",
            "            if w != r:",
            f"                for z in range({width}):",
            "                    IT[b + w, z] = IT[b + r, z]",
            "            w += 1",
            "            continue"]
    write = ["if t_out >= tom.shape[0]:",
             "    tom = _grow_rows(tom, t_out + 1)",
             f"M = IT[ri, {R_MASK}]",
             "tom[t_out, 0] = p",
             "tom[t_out, 1] = t_el"]

    def element(v: int, c: int, row: str) -> list[str]:
        return ["if t_el >= toe_i.shape[0]:",
                "    toe_i, toe_f = _grow_el(toe_i, toe_f, t_el + 1)",
                f"toe_i[t_el, 0] = {v}",
                f"for z in range({nI}):",
                f"    toe_i[t_el, z + 1] = I{c}[{row}, z]",
                f"for z in range({nF}):",
                f"    toe_f[t_el, z] = F{c}[{row}, z]",
                "t_el += 1"]

    for var in gen.positive:
        v, c, s = var.index, var.channel, gen.slot[var.name]
        if var.kind == VarKind.KLEENE:
            write += [f"kn = IT[ri, {s + 1}]",
                      "if kn > 0:",
                      f"    kb, km = _kmat(NR, NP, IT[ri, {s}], kn, evp[{c}], kb, np.int64(-1))",
                      "    for j in range(km):"]
            write += _indent(element(v, c, "kb[j]"), 2)
        else:
            write += [f"if (M & {gen.bit[var.name]}) != 0:"]
            write += _indent(element(v, c, f"IT[ri, {s}] - evp[{c}]"))
    write += ["tom[t_out, 2] = t_el - tom[t_out, 1]", "t_out += 1"]
    body += _indent(write, 2)
    body += ["    icnt[seg] = w",
             "return tom, toe_i, toe_f, t_out, t_el"]
    return lines + _indent(body) + [""]


def _time_out_all(gen: AipGenerator) -> list[str]:
    lines = ["@njit(cache=True)",
             f"def time_out_all(punct, force, {gen.arena_params()}, base, cnt, evicted, last_ts, "
             "IT, ibase, icnt, NR, NP, parts):"]
    body = gen.timeout_output_init()
    body += ["for p in parts:",
             "    now = max(last_ts[p], punct)"]
    body += _indent(gen.fetch_lines())
    body += ["    tom, toe_i, toe_f, t_out, t_el = _time_out("
             f"p, now, force, {gen.channel_params()}, evicted[p], IT, ibase, icnt, NR, NP, "
             "tom, toe_i, toe_f, t_out, t_el)",
             "return t_out, t_el, tom, toe_i, toe_f"]
    return lines + _indent(body) + [""]
