from tgc_rl.sdk.job import _parse_sse


def test_events_are_split_on_blank_lines_with_type_id_and_data():
    lines = ["id: 3", "event: step", 'data: {"a": 1}', "", "id: 4", "event: log", "data: x", ""]
    assert list(_parse_sse(iter(lines))) == [("step", '{"a": 1}', 3), ("log", "x", 4)]


def test_comments_are_skipped_and_multiline_data_joined():
    lines = [": keep-alive", "", "event: end", "data: line1", "data: line2", ""]
    assert list(_parse_sse(iter(lines))) == [("end", "line1\nline2", None)]


def test_an_event_without_the_final_blank_line_is_still_delivered():
    assert list(_parse_sse(iter(["data: tail"]))) == [("message", "tail", None)]


def test_a_retry_hint_without_data_is_the_servers_reconnect_marker():
    lines = [
        ": stream lifetime reached",
        "retry: 1000",
        "",
        "id: 5",
        "event: retry",
        "retry: 7",
        "data: {}",
        "",
    ]
    assert list(_parse_sse(iter(lines))) == [("retry", "1000", None), ("retry", "{}", 5)]
    assert list(_parse_sse(iter(["retry: soon", ""]))) == []  # not a number: no marker
