"""Linux cpulist parsing/formatting and NVML affinity bitmasks."""

from __future__ import annotations

import random

import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.hardware.cpulist import cpumask_to_list, format_cpulist, parse_cpulist


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
        ("0", [0]),
        ("5-5", [5]),
        ("", []),
        ("\n", []),
        ("0-3\n", [0, 1, 2, 3]),  # sysfs files end in a newline
        (" 8 , 0-1 ", [0, 1, 8]),
        ("8,0-3", [0, 1, 2, 3, 8]),  # sorted
        ("0-3,2-5,4", [0, 1, 2, 3, 4, 5]),  # no repeats
        ("0,,2", [0, 2]),  # empty parts are skipped
        ("224-231", list(range(224, 232))),
    ],
)
def test_parse_cpulist(text, expected):
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize("text", ["a", "0-", "-1", "1-x", "0-3,foo", "1.5"])
def test_parse_cpulist_rejects_garbage_with_the_offending_part(text):
    with pytest.raises(PycLabError, match="bad CPU list") as info:
        parse_cpulist(text)
    assert "expected e.g. '0-3,8'" in str(info.value)


def test_parse_cpulist_rejects_backwards_ranges():
    with pytest.raises(PycLabError, match="runs backwards"):
        parse_cpulist("0-3,7-4")


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [
        ([0, 1, 2, 3, 8], "0-3,8"),
        ([], ""),
        ([5], "5"),
        ([1, 3, 5], "1,3,5"),
        ([3, 2, 1, 0, 3], "0-3"),  # unsorted, repeated
        ((c for c in (10, 11, 0)), "0,10-11"),  # any iterable
        ([0, 1, 3, 4, 6], "0-1,3-4,6"),
        (range(0, 112), "0-111"),
    ],
)
def test_format_cpulist(cpus, expected):
    assert format_cpulist(cpus) == expected


def test_format_then_parse_round_trips_random_sets():
    rng = random.Random(20240601)
    for _ in range(200):
        cpus = sorted(rng.sample(range(256), rng.randint(0, 40)))
        text = format_cpulist(cpus)
        assert parse_cpulist(text) == cpus
        assert format_cpulist(parse_cpulist(text)) == text


@pytest.mark.parametrize(
    ("words", "bits", "expected"),
    [
        ([0b1011], 64, [0, 1, 3]),
        ([0xFF, 0], 64, list(range(8))),
        ([0, 0b11], 64, [64, 65]),
        ([1 << 63], 64, [63]),
        ([0x0F0F, 1], 64, [0, 1, 2, 3, 8, 9, 10, 11, 64]),
        ([0b11, 0b1], 32, [0, 1, 32]),  # 32-bit words
        ([], 64, []),
        ([0, 0], 64, []),
    ],
)
def test_cpumask_to_list(words, bits, expected):
    assert cpumask_to_list(words, bits_per_word=bits) == expected


def test_cpumask_to_list_ignores_bits_beyond_the_word_size():
    # A 32-bit word only contributes its low 32 bits.
    assert cpumask_to_list([(1 << 32) | 1], bits_per_word=32) == [0]
