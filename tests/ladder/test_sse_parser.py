import json

from hypothesis import given
from hypothesis import strategies as st

from ladder.sse import SSEParser

EVENTS = [{"choices": [{"delta": {"content": "日本é"}}]}, {"choices": [{"delta": {"content": " w€"}}]}]
STREAM = b"".join(b"data: " + json.dumps(e, ensure_ascii=False).encode() + b"\n\n" for e in EVENTS) \
    + b"data: [DONE]\n\n"
EXPECTED = [json.dumps(e, ensure_ascii=False).encode() for e in EVENTS] + [b"[DONE]"]


def feed_all(parts: list[bytes]) -> list[bytes]:
    parser = SSEParser()
    return [e for part in parts for e in parser.feed(part)]


def test_whole_stream_in_one_read():
    assert feed_all([STREAM]) == EXPECTED


def test_every_two_way_split_gives_the_same_events_including_inside_multibyte_chars():
    for cut in range(1, len(STREAM)):
        events = feed_all([STREAM[:cut], STREAM[cut:]])
        assert events == EXPECTED, cut
        assert json.loads(events[0])["choices"][0]["delta"]["content"] == "日本é"


def test_byte_at_a_time():
    assert feed_all([bytes([b]) for b in STREAM]) == EXPECTED


def test_comment_lines_and_ping_only_events_are_skipped():
    stream = b": ping\n\n" + b": keep-alive\ndata: a\n\n" + b":\n\n" + b"data: b\n\n"
    assert feed_all([stream]) == [b"a", b"b"]


def test_crlf_and_cr_line_ends_even_when_a_crlf_is_split_across_reads():
    crlf = STREAM.replace(b"\n", b"\r\n")
    for cut in range(1, len(crlf)):
        assert feed_all([crlf[:cut], crlf[cut:]]) == EXPECTED, cut
    # A lone trailing CR may still become a CRLF, so the last event waits for one more byte.
    assert feed_all([STREAM.replace(b"\n", b"\r"), b":"]) == EXPECTED


def test_multi_line_data_joined_with_newline_and_other_fields_ignored():
    stream = b"event: message\nid: 7\ndata: {\"a\":\ndata:1}\nretry: 10\n\n"
    assert feed_all([stream]) == [b'{"a":\n1}']


def test_incomplete_event_is_held_until_its_blank_line():
    parser = SSEParser()
    assert parser.feed(b"data: x\n") == []
    assert parser.feed(b"\n") == [b"x"]


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_partition_of_the_stream_gives_the_same_events(cuts):
    points = sorted(set(cuts) | {0, len(STREAM)})
    assert feed_all([STREAM[a:b] for a, b in zip(points, points[1:])]) == EXPECTED
