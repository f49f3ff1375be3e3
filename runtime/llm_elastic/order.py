"""The global sample order: a seeded pseudo-random permutation per epoch, independent of the world size.

Position ``p`` of the infinite stream (epoch ``p // N``) maps to sample id ``perm_epoch(p % N)``. The
permutation is a keyed Feistel network over the next power of four above ``N`` with cycle-walking, so it
is a bijection of ``0..N-1`` computed in O(1) memory for any ``N`` (no table of billions of ids).
"""

from __future__ import annotations

import hashlib

MASK64 = (1 << 64) - 1
ROUNDS = 4


def _mix(value: int) -> int:
    """splitmix64 finaliser: a cheap, well-distributed 64-bit hash."""
    value = (value + 0x9E3779B97F4A7C15) & MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK64
    return value ^ (value >> 31)


class GlobalOrder:
    """Maps stream positions to sample ids; same seed and ``num_samples`` give the same order everywhere."""

    def __init__(self, num_samples: int, seed: int) -> None:
        if num_samples < 1:
            raise ValueError("num_samples must be at least 1")
        self.num_samples = num_samples
        self.seed = seed
        bits = max(2, (num_samples - 1).bit_length())
        self._half = (bits + 1) // 2
        self._mask = (1 << self._half) - 1
        self._keys: dict[int, tuple[int, ...]] = {}

    def _round_keys(self, epoch: int) -> tuple[int, ...]:
        keys = self._keys.get(epoch)
        if keys is None:
            material = hashlib.sha256(f"{self.seed}:{epoch}".encode()).digest()
            keys = tuple(int.from_bytes(material[8 * r : 8 * r + 8], "little") for r in range(ROUNDS))
            if len(self._keys) > 8:
                self._keys.clear()
            self._keys[epoch] = keys
        return keys

    def _permute_once(self, value: int, keys: tuple[int, ...]) -> int:
        left, right = value >> self._half, value & self._mask
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & self._mask)
        return (left << self._half) | right

    def sample_id(self, position: int) -> int:
        """The sample id at stream position ``position`` (>= 0)."""
        if position < 0:
            raise ValueError("position must not be negative")
        epoch, index = divmod(position, self.num_samples)
        keys = self._round_keys(epoch)
        value = self._permute_once(index, keys)
        while value >= self.num_samples:  # cycle-walk back into range; < 4 rounds expected
            value = self._permute_once(value, keys)
        return value

    def sample_ids(self, start: int, stop: int) -> list[int]:
        """Sample ids of positions ``start..stop-1``."""
        return [self.sample_id(p) for p in range(start, stop)]
