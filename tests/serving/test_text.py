"""A request's text as it streams: new text only, an unfinished character or a possible stop
string held back, the text cut before the first stop string."""

from __future__ import annotations

from runtime.serving.text import TextStream


class Pieces:
    """decode: the pieces of the ids joined (id 9 is half a character until id 10 follows)."""

    PIECES = {1: "he", 2: "llo", 3: " wor", 4: "ld", 5: "!", 9: "\ufffd", 10: "é"}

    def decode(self, ids):
        text = "".join(self.PIECES[i] for i in ids)
        return text.replace("\ufffdé", "é")


def _feed(stream: TextStream, ids) -> list[str]:
    return [stream.push(i) for i in ids]


def test_new_text_only():
    stream = TextStream(Pieces())
    assert _feed(stream, [1, 2, 3, 4]) == ["he", "llo", " wor", "ld"]
    assert stream.flush() == "" and not stream.stopped


def test_an_unfinished_character_waits_for_its_next_token():
    stream = TextStream(Pieces())
    assert _feed(stream, [1, 9, 10]) == ["he", "", "é"]


def test_a_stop_string_across_tokens_cuts_the_text():
    stream = TextStream(Pieces(), ("lo wo",))
    assert _feed(stream, [1, 2]) == ["he", "l"]  # "lo" might begin the stop string: held
    assert stream.push(3) == "" and stream.stopped
    assert stream.flush() == ""


def test_a_held_tail_that_is_no_stop_string_comes_out():
    stream = TextStream(Pieces(), ("lo!",))
    assert _feed(stream, [1, 2, 3]) == ["he", "l", "lo wor"]
    assert stream.flush() == ""
    end = TextStream(Pieces(), ("ld?",))
    assert _feed(end, [1, 2, 3, 4]) == ["he", "llo", " wor", ""]
    assert end.flush() == "ld"  # the sequence ended: the held tail is text after all


def test_without_a_tokenizer_there_is_no_text():
    stream = TextStream(None)
    assert _feed(stream, [1, 2]) == ["", ""] and stream.tokens == [1, 2]


class Reference(TextStream):
    """The plain definition: search the whole text, try every tail against every prefix."""

    def push(self, token: int) -> str:
        self.tokens.append(token)
        if self.stopped:
            return ""
        text = self.tokenizer.decode(self.tokens)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._take(text, cut)
        held = max((k for s in self.stop for k in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:k])), default=0)
        return self._take(text, len(text) - held)


class Words:
    def __init__(self, pieces: list[str]):
        self.pieces = pieces

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_random_pieces_and_stop_strings_stream_as_the_plain_definition():
    import random

    rng = random.Random(0)
    for _ in range(3000):
        pieces = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 3)))
                  for _ in range(rng.randint(1, 12))]
        stops = tuple("".join(rng.choice("ab") for _ in range(rng.randint(1, 5)))
                      for _ in range(rng.randint(1, 3)))
        fast, plain = TextStream(Words(pieces), stops), Reference(Words(pieces), stops)
        for i in range(len(pieces)):
            assert fast.push(i) == plain.push(i), (pieces, stops, i)
            assert fast.stopped == plain.stopped
        assert fast.flush() == plain.flush()


def test_a_long_stop_string_costs_its_length_not_its_square():
    import time

    stop = "c" * 40000  # no tail of the text begins it: the plain definition tries them all
    stream = TextStream(Words(["ab" * 6] * 2000), (stop,))
    started = time.perf_counter()
    out = "".join(stream.push(i) for i in range(2000))
    assert out == "ab" * 12000 and stream.flush() == ""
    assert time.perf_counter() - started < 5  # the plain definition: minutes
