"""The request stream fed from a forked feeder: the same requests, in order, to every
reader, a hand-over from the middle of the stream, and no feeder left behind.

Each test forks, so each runs its script in a fresh interpreter (``in_fresh_interpreter``).
"""

from __future__ import annotations

from tests.sim.fresh import in_fresh_interpreter

SETUP = """
    import json, os
    from dataclasses import fields
    from cachescale.sim.scenario import load_builtin
    from cachescale.sim.streams import open_stream
    from cachescale.sim.stream_feed import BATCH_REQUESTS, StreamFeed

    scenario = load_builtin("rag-rechunk").model_copy(update={"duration_s": 600.0})
    def row(request):
        return [getattr(request, f.name) if f.name != "block_hashes"
                else [h.hex() for h in request.block_hashes] for f in fields(request)]
    def expected():
        return [row(r) for r in open_stream(scenario)]
    def no_child_left():
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        return False
"""


def test_a_feed_reads_every_request_of_the_stream_in_order() -> None:
    outcome = in_fresh_interpreter(
        SETUP
        + """
    feed = StreamFeed(open_stream(scenario), readers=1)
    fed = [row(r) for r in feed.reader]
    feed.close()
    want = expected()
    print(json.dumps([len(want) > 3 * BATCH_REQUESTS, fed == want, no_child_left()]))
    """
    )
    assert outcome == [True, True, True]


def test_a_reader_handed_over_mid_stream_reads_the_rest_in_a_child() -> None:
    outcome = in_fresh_interpreter(
        SETUP
        + """
    from itertools import islice
    from cachescale.sim.forked import Forked

    feed = StreamFeed(open_stream(scenario), readers=2)
    head = [row(r) for r in islice(feed.reader, 2 * BATCH_REQUESTS + 17)]
    handed = feed.hand_over()
    def rest():
        feed.adopt(handed)
        return [row(r) for r in feed.reader]
    child = Forked(rest)
    feed.handed_over(handed)
    parents = [row(r) for r in feed.reader]
    childs = child.result()
    feed.close()
    want = expected()
    print(json.dumps([head + parents == want, head + childs == want, no_child_left()]))
    """
    )
    assert outcome == [True, True, True]


def test_a_reader_that_stops_early_still_ends_its_feeder() -> None:
    outcome = in_fresh_interpreter(
        SETUP
        + """
    import time
    feed = StreamFeed(open_stream(scenario), readers=2)
    first = next(feed.reader)
    started = time.monotonic()
    feed.close()
    print(json.dumps([row(first) == expected()[0], time.monotonic() - started < 30,
                      no_child_left()]))
    """
    )
    assert outcome == [True, True, True]


def test_a_feeder_that_dies_is_an_error_not_the_end_of_the_stream() -> None:
    outcome = in_fresh_interpreter(
        SETUP
        + """
    import signal
    from cachescale.sim.forked import ForkedError
    feed = StreamFeed(open_stream(scenario), readers=1)
    next(feed.reader)
    os.kill(feed._pid, signal.SIGKILL)
    said = None
    try:
        for _ in feed.reader:
            pass
    except ForkedError as error:
        said = str(error)
    os.waitpid(feed._pid, 0)
    print(json.dumps(said))
    """
    )
    assert outcome is not None
    assert outcome.startswith("the request stream's feeder ended")
