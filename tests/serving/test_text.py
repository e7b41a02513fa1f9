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
