"""Counter updates gathered between flushes: what a flush writes, and when one is due."""

from adaflash.serving.tally import Tally


def test_a_flush_writes_each_changed_series_once_with_its_sum_in_the_order_first_added():
    tally, written = Tally(0.25), []
    tally.add(("calls", "target"), 1)
    for n in (1, 1, 3):
        tally.add(("tokens", "ar"), n)
    tally.add(("calls", "target"), 1)
    tally.add(("accepted", "ar"), 0)  # a request that accepted nothing: nothing to write
    tally.flush(lambda s, n: written.append((s, n)), now=10.0)
    assert written == [(("calls", "target"), 2), (("tokens", "ar"), 5)]
    written.clear()
    tally.flush(lambda s, n: written.append(s), now=11.0)
    assert written == []  # nothing changed since


def test_a_flush_is_due_an_interval_after_the_last():
    tally = Tally(0.25)
    assert tally.due(0.0)
    tally.flush(lambda s, n: None, now=5.0)
    assert not tally.due(5.2) and tally.due(5.25)
