"""bench/probe_recognize.py, the hand-written MATCH-structured MATCH_RECOGNIZE kernel that
issue 32's design is measured against, gives the generated engine's rows (so its timings
compare like with like)."""

from cep_service.bench.probe_recognize import run, step_table


def test_the_probe_gives_the_generated_engines_rows():
    out = run(20_000, symbols=40, repeat=1)
    assert out["same_rows_as_generated"] is True and out["rows"] > 100
    assert all(out[f"{name}_kernel_events_per_s"] > 0 for name in ("match", "recognize", "probe"))


def test_the_step_table_has_no_way_back_to_the_start():
    table = step_table()
    assert all(table[state * 16 + bits] & 7 != 1 for state in range(1, 6) for bits in range(16))
    assert table[1 * 16 + 1] == 2 and table[1 * 16] == 0  # S then R1, or the run ends
