"""Token ids -> text, whole or streamed.

Every token id maps to the exact bytes it stands for (byte-level BPE: the GPT-2 byte alphabet
undone; SentencePiece: U+2581 -> space, <0xXX> -> that byte). Decoding concatenates those bytes
and decodes UTF-8 once, invalid sequences becoming U+FFFD. The streaming decoder feeds the same
bytes to an incremental UTF-8 decoder, which holds back an unfinished character until its last
byte arrives: so no piece ever ends inside a character, nothing is dropped or repeated, and the
pieces concatenate to exactly `decode(ids)`.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Sequence

TokenBytes = Callable[[int], bytes]


def decode_bytes(data: bytes, strip_leading_space: bool = False) -> str:
    text = data.decode("utf-8", errors="replace")
    if strip_leading_space and text.startswith(" "):
        text = text[1:]
    return text


class StreamDecoder:
    """Incremental detokenizer: `push(id) -> str` per generated token, `flush() -> str` at the end.

    A piece may be "" while a multi-byte character is incomplete; `flush()` emits whatever is
    still held (an unfinished character becomes U+FFFD, as in `decode`).
    """

    def __init__(self, token_bytes: TokenBytes, strip_leading_space: bool = False) -> None:
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip = strip_leading_space  # pending until the first character is out
        self.ids: list[int] = []

    def _emit(self, text: str) -> str:
        if self._strip and text:
            self._strip = False
            if text[0] == " ":
                text = text[1:]
        return text

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        return self._emit(self._utf8.decode(self._token_bytes(token_id)))

    def push_many(self, ids: Iterable[int]) -> str:
        return "".join(self.push(i) for i in ids)

    def flush(self) -> str:
        return self._emit(self._utf8.decode(b"", final=True))


def join_bytes(token_bytes: TokenBytes, ids: Sequence[int]) -> bytes:
    return b"".join(token_bytes(i) for i in ids)
