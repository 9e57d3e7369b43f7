"""The samplers' random numbers: numpy's PCG64 stream, in plain Python.

`Pcg64(seed).random()` gives, draw for draw, the doubles of
`numpy.random.Generator(numpy.random.PCG64(seed)).random()`: the seed expanded by numpy's
SeedSequence (its hash mixing of the seed's 32-bit words into a pool of 4, then 4 64-bit words
drawn from the pool), the 128-bit LCG with the XSL-RR output, and the top 53 bits of an output as
a double in [0, 1). So a seed keeps the text it gave when the samplers used numpy's generator.

Why not numpy's: importing numpy.random costs a process ~6 MB of resident memory (its modules
and, through `secrets`, OpenSSL's libcrypto), which a server pays for one double per token. The
constants and the algorithms are those of the PCG paper (O'Neill, 2014) and numpy's published
SeedSequence; tests/test_sampling.py holds this class to numpy's generator."""

from __future__ import annotations

import os

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_M128 = (1 << 128) - 1

# SeedSequence's hash constants
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4

# the LCG's multiplier (PCG's default for 128-bit states)
_MULT = (2549297995355413924 << 64) + 4865540595714422341


def _seed_words(seed: int, n64: int) -> list[int]:
    """n64 64-bit words of numpy's SeedSequence(seed).generate_state(n64, uint64)."""
    entropy = []
    while True:  # the seed's 32-bit words, least significant first (0 is one word)
        entropy.append(seed & _M32)
        seed >>= 32
        if not seed:
            break
    h = _INIT_A

    def hashmix(v: int) -> int:
        nonlocal h
        v ^= h
        h = (h * _MULT_A) & _M32
        v = (v * h) & _M32
        return v ^ (v >> 16)

    def mix(x: int, y: int) -> int:
        r = (_MIX_L * x - _MIX_R * y) & _M32
        return r ^ (r >> 16)

    pool = [hashmix(entropy[i] if i < len(entropy) else 0) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL, len(entropy)):
        for dst in range(_POOL):
            pool[dst] = mix(pool[dst], hashmix(entropy[src]))
    hb, words = _INIT_B, []
    for i in range(2 * n64):
        v = pool[i % _POOL] ^ hb
        hb = (hb * _MULT_B) & _M32
        v = (v * hb) & _M32
        words.append(v ^ (v >> 16))
    return [words[2 * i] | words[2 * i + 1] << 32 for i in range(n64)]  # little-endian pairs


class Pcg64:
    """A PCG64 stream seeded as numpy seeds it; random() as numpy's Generator.random()."""

    __slots__ = ("_state", "_inc")

    def __init__(self, seed: int):
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        s0, s1, i0, i1 = _seed_words(seed, 4)
        self._inc = (((i0 << 64 | i1) << 1) | 1) & _M128
        self._state = self._inc  # 0 stepped once
        self._state = ((self._state + (s0 << 64 | s1)) * _MULT + self._inc) & _M128

    def next64(self) -> int:
        """The next 64-bit output: step the LCG, then XSL-RR of the new state."""
        s = self._state = (self._state * _MULT + self._inc) & _M128
        x, rot = ((s >> 64) ^ s) & _M64, s >> 122
        return ((x >> rot) | (x << (64 - rot))) & _M64

    def random(self) -> float:
        """A double in [0, 1): the top 53 bits of the next output."""
        return (self.next64() >> 11) * (1.0 / 9007199254740992.0)


def fresh_seed() -> int:
    """A seed from the operating system's entropy (128 bits, as numpy's SeedSequence() takes)."""
    return int.from_bytes(os.urandom(16), "little")
