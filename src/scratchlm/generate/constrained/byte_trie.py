"""A byte trie kept implicit in a sorted list: no node objects, built by one sort.

The keys (token bytes, with their ids) are sorted. Every trie node is the range [lo, hi) of the sorted
keys that share its prefix of d bytes, written (lo, hi, d); inside a range the keys that end at d come
first, then the children, one sub-range per next byte c, in byte order. A child's end is found by
binary search for the smallest key after the prefix + c:  bisect(keys, prefix + (c + 1)).

So the trie of a 262k-token vocabulary costs a sorted list of references (and ~0.3 s to sort) instead
of ~10^6 dict nodes (~10 s and hundreds of MB in Python), and a walk that prunes at the first refused
byte still touches only the nodes it keeps.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

Node = tuple[int, int, int]  # (lo, hi, depth)


class ByteTrie:
    """The trie of (key bytes, id) pairs; `children(node)` walks it (see the module docstring)."""

    def __init__(self, items: list[tuple[bytes, int]]) -> None:
        items = sorted(items)
        self.keys = [k for k, _ in items]
        self.ids = [i for _, i in items]
        self.root: Node = (0, len(self.keys), 0)

    def __len__(self) -> int:
        return len(self.keys)

    def children(self, node: Node) -> Iterator[tuple[int, Node, list[int], bool]]:
        """(byte c, child node, ids of the keys equal to prefix + c, whether longer keys follow) per child,
        in byte order."""
        lo, hi, d = node
        keys = self.keys
        while lo < hi and len(keys[lo]) == d:  # keys ending here (reported by the parent)
            lo += 1
        while lo < hi:
            c = keys[lo][d]
            end = hi if c == 255 else bisect_left(keys, keys[lo][:d] + bytes([c + 1]), lo, hi)
            stop = lo
            while stop < end and len(keys[stop]) == d + 1:
                stop += 1
            yield c, (lo, end, d + 1), self.ids[lo:stop], stop < end
            lo = end
