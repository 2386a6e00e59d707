"""Metric updates gathered between flushes: what a flush writes, and when one is due."""

from adaflash.serving.tally import Tally


def test_a_flush_writes_each_changed_series_once_with_its_sum_and_the_latest_gauge_value():
    tally, written = Tally(0.25), []
    for n in (1, 1, 3):
        tally.add(("tokens", "ar"), n)
    tally.add(("active", "ar"), 1)
    tally.add(("active", "ar"), -1)  # started and finished between flushes: nothing to write
    tally.set("queued", 4)
    tally.set("queued", 2)
    tally.flush(lambda s, n: written.append(("add", s, n)), lambda s, v: written.append(("set", s, v)), now=10.0)
    assert written == [("add", ("tokens", "ar"), 5), ("set", "queued", 2)]
    written.clear()
    tally.flush(lambda s, n: written.append(s), lambda s, v: written.append(s), now=11.0)
    assert written == []  # nothing changed since


def test_a_flush_is_due_an_interval_after_the_last():
    tally = Tally(0.25)
    assert tally.due(0.0)
    tally.flush(lambda s, n: None, lambda s, v: None, now=5.0)
    assert not tally.due(5.2) and tally.due(5.25)
