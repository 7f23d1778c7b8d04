import os

from tgc_rl.reward import wire
from tgc_rl.tasks import Score, TaskItem


def test_frames_round_trip_through_a_pipe():
    r, w = os.pipe()
    item = TaskItem(id="a", prompt="p", answer="1", meta={"tests": [1, 2]})
    wire.write_frame(w, "score", (7, item, "response"))
    os.close(w)
    assert wire.read_frame(r) == ("score", (7, item, "response"))
    assert wire.read_frame(r) is None  # EOF
    os.close(r)


def test_the_buffer_yields_only_whole_frames_however_bytes_arrive():
    data = wire.encode("result", (1, Score(1.0), 0.1)) + wire.encode("ready", {"pid": 3})
    buf = wire.FrameBuffer()
    frames = []
    for i in range(len(data)):  # one byte at a time
        frames += buf.feed(data[i : i + 1])
    assert frames == [("result", (1, Score(1.0), 0.1)), ("ready", {"pid": 3})]
