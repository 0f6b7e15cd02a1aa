"""Numbered-list continuation for retrieval drafters: after ``k.`` opened the previous line, the
next line opens with ``k+1.``.

Chat models answer in numbered lists all the time, and the number that opens each item is the one
token a lookup drafter cannot get: every n-gram before it (``...coin.\\n``) was followed by a
different number each time. A ``ListCounter`` knows the token ids of the newline tokens and of
``"1."`` ... ``"99."`` at the start of a line (taken from the tokenizer once, when the n-gram store
is built, and kept in the store's metadata), so it can propose the next item's number, token by
token, and the drafter goes on from there with its tables. It is a rule, not a model: a wrong
guess costs one rejected draft token, like any other.

>>> c = ListCounter(newline={9}, numbers={1: [1, 5], 2: [2, 5], 3: [3, 5]})  # 5 is ".", 9 a newline
>>> c.next_token([1, 5, 7, 7, 9])        # "1. x x\\n" -> "2"
2
>>> c.next_token([1, 5, 7, 9, 2, 5, 7, 9, 3])  # inside "3." -> "."
5
>>> c.next_token([7, 7, 9]) is None      # the previous line is not a numbered item
True
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_NUMBER = 99  # numbers whose tokens are recorded ("1." ... "99.")
LOOKBACK = 256  # tokens searched back for the previous line (a longer item is not followed)


@dataclass
class ListCounter:
    """Token ids of line breaks and of each item number ``"k."`` as it opens a line."""

    newline: set = field(default_factory=set)  # ids of tokens whose text ends with a line break
    numbers: dict = field(default_factory=dict)  # {k: [ids of "k." at the start of a line]}

    def __post_init__(self):
        self.newline = {int(t) for t in self.newline}
        self.numbers = {int(k): [int(t) for t in v] for k, v in self.numbers.items()}
        self._by_first: dict[int, list[int]] = {}  # first token -> numbers starting with it, longest first
        for k in sorted(self.numbers, key=lambda k: -len(self.numbers[k])):
            if self.numbers[k]:
                self._by_first.setdefault(self.numbers[k][0], []).append(k)

    @classmethod
    def from_tokenizer(cls, tokenizer, max_number: int = MAX_NUMBER) -> ListCounter:
        """Read the ids off ``tokenizer``: ``"k."`` is tokenized after a newline, which is then dropped."""
        nl = tokenizer("\n", add_special_tokens=False)["input_ids"]
        if len(nl) != 1:
            raise ValueError(f"this tokenizer splits a newline into {len(nl)} tokens: list counting needs one")
        newline = {i for t, i in tokenizer.get_vocab().items()
                   if tokenizer.convert_tokens_to_string([t]).endswith("\n")}
        numbers = {}
        for k in range(1, max_number + 1):
            ids = tokenizer(f"\n{k}.", add_special_tokens=False)["input_ids"]
            if ids[:1] == nl:
                numbers[k] = ids[1:]
        return cls(newline, numbers)

    def to_meta(self) -> dict:
        return {"newline": sorted(self.newline), "numbers": {str(k): v for k, v in self.numbers.items()}}

    @classmethod
    def from_meta(cls, meta: dict | None) -> ListCounter | None:
        return cls(meta["newline"], meta["numbers"]) if meta else None

    def _number_at(self, seq: list, start: int) -> int | None:
        """The item number whose tokens open ``seq`` at ``start``, or None."""
        for k in self._by_first.get(seq[start], ()) if start < len(seq) else ():
            toks = self.numbers[k]
            if seq[start:start + len(toks)] == toks:
                return k
        return None

    def next_token(self, seq: list) -> int | None:
        """The next token of the next item's number, if ``seq`` [n] ends at (or inside) a line that
        should open with one; else None."""
        seq = seq[-LOOKBACK:]
        line = len(seq)  # start of the current line
        while line > 0 and seq[line - 1] not in self.newline:
            line -= 1
        if line == 0:
            return None
        partial = seq[line:]
        prev = line - 1  # the newline ending the previous line; find that line's start (skip blank lines)
        while prev > 0 and seq[prev - 1] in self.newline:
            prev -= 1
        start = prev
        while start > 0 and seq[start - 1] not in self.newline:
            start -= 1
        if start == prev or (start == 0 and len(seq) == LOOKBACK):
            return None  # no previous line, or it starts beyond the lookback
        k = self._number_at(seq, start)
        want = self.numbers.get(k + 1) if k is not None else None
        if want is None or len(partial) >= len(want) or want[:len(partial)] != partial:
            return None
        return want[len(partial)]
