"""The secrets check's sieve finds exactly the needles that `in` finds, wherever they sit in the
text (any offset against its aligned blocks, overlapping, at the ends), short and long ones."""

from __future__ import annotations

import random

import pytest

from tests.support import secrets
from tests.support.needle_sieve import BLOCK, LONG, NeedleSieve


def _brute(needles: list[str], text: str) -> list[str]:
    return [n for n in needles if n in text]


# Small alphabets: many near misses that share blocks with the needles. Multi-byte characters
# (the sieve cuts UTF-8 bytes) and a space in the needles (then every byte of the text is kept).
@pytest.mark.parametrize("alphabet", ["ab", "a\u00e9", "a\ufffd\U0001f511", "a b"])
def test_every_offset_and_length_is_found_as_in_finds_it(alphabet: str) -> None:
    rng = random.Random(7)
    for _ in range(300):
        needles = list(
            dict.fromkeys(
                "".join(
                    rng.choice(alphabet) for _ in range(rng.choice([8, 12, LONG - 1, LONG, 40]))
                )
                for _ in range(rng.randint(1, 6))
            )
        )
        pieces = [rng.choice(needles)[: rng.randint(1, LONG)] for _ in range(3)]
        text = "".join(
            # Fillers with bytes of no needle: the runs the sieve cuts end there.
            rng.choice(
                [*needles, *pieces, "".join(rng.choice(alphabet + "z\n\0") for _ in range(5))]
            )
            for _ in range(rng.randint(0, 8))
        )
        assert NeedleSieve(needles).present(text) == _brute(needles, text), (needles, text)


def test_a_long_needle_at_each_offset_of_a_block_is_found() -> None:
    needle = "".join(chr(0x41 + i % 26) for i in range(LONG))
    sieve = NeedleSieve(["unrelated-secret-" + "z" * 40, needle])
    for offset in range(2 * BLOCK + 1):
        text = "." * offset + needle + "." * offset
        assert sieve.present(text) == [needle], offset
        # One character short of the needle at either end is no occurrence.
        assert sieve.present("." * offset + needle[1:]) == []
        assert sieve.present("." * offset + needle[:-1]) == []


def test_the_registry_reports_in_registration_order_and_sees_later_secrets() -> None:
    registry = secrets.SecretRegistry()
    long_key = "k" * 20 + "0123456789abcdefghijklmnopqrstuv"
    registry.register(long_key, "a long key")
    registry.register("short-pw", "a password")
    text = f"first short-pw then {long_key}"
    leaks = registry.scan(text, "out")
    assert [leak.what for leak in leaks] == ["a long key", "a password"]
    assert all("<SECRET>" in leak.context for leak in leaks)
    token = "tok-" + "9" * 40
    assert registry.scan(f"x {token} y", "out") == []
    registry.register(token, "a token registered after the first scan")
    (leak,) = registry.scan(f"x {token} y", "out")
    assert leak.what == "a token registered after the first scan"
    assert leak.context == "x <SECRET> y"


def test_needles_sharing_no_block_with_the_text_are_not_searched_for() -> None:
    # What made integration teardowns take a minute was one search of the whole text per needle:
    # 600 key lines against megabytes of log. Only needles sharing a block with it are searched.
    rng = random.Random(3)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    needles = ["".join(rng.choice(alphabet) for _ in range(64)) for _ in range(600)]
    text = ("".join(rng.choice(alphabet + " \n") for _ in range(1 << 16)) + "x" * 1000) * 16
    sieve = NeedleSieve([*needles, "short-pw"])
    assert sieve.candidates(text) == [600], "only the short needle is searched for"
    assert sieve.present(text) == []
    leaked = text[:5000] + needles[500][:40] + needles[500] + text[5000:]
    assert sieve.candidates(leaked) == [500, 600]
    assert sieve.present(leaked) == [needles[500]]
