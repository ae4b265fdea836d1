"""``kernels.lt_algos`` (a kept cuBLASLt pick) and ``benchmarks/lt_space.py`` (the
listing of cuBLASLt's algorithm space the experiment measured) against a fake of
nvmath-python's cuBLASLt bindings that keeps the real record layouts (the algorithm
struct, the heuristic result) and a small table of algorithms: what is listed (every id x
tile x stages the problem takes, refused settings left out, the deadline honoured), how
the fastest are expanded (custom options, swizzles, split-K with the reduction schemes
an algorithm has, only where asked), alignments, and the stored form of a setting."""

from __future__ import annotations

import enum
import importlib.util
import sys
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.kernels import lt_algos

# the listing lives with the experiment that measured it (benchmarks/lt_space.py)
_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "lt_space.py"
_spec = importlib.util.spec_from_file_location("pyc_lab_bench_lt_space", _PATH)
lt_space = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = lt_space  # its dataclass resolves its module by name
_spec.loader.exec_module(lt_space)
LtAlgo = lt_space.LtAlgo

lt_real = pytest.importorskip("nvmath.bindings.cublasLt")

CONFIG_FIELDS = ("ID", "TILE_ID", "SPLITK_NUM", "REDUCTION_SCHEME", "CTA_SWIZZLING",
                 "CUSTOM_OPTION", "STAGES_ID")


class FakeLt:
    """cuBLASLt with two algorithms: id 6 (tiles 1, 2; stages 7; split-K with in-place and
    output-type reductions; 2 custom options; swizzling) and id 9 (tile 3, no stages list,
    nothing else). The problem refuses tile 2 and every split above 8; the setting's
    config values live in the struct's eight words as ``ID`` ... ``STAGES_ID``."""

    MatmulAlgoCapAttribute = lt_real.MatmulAlgoCapAttribute
    MatmulAlgoConfigAttribute = lt_real.MatmulAlgoConfigAttribute
    matmul_algo_dtype = lt_real.matmul_algo_dtype
    matmul_heuristic_result_dtype = lt_real.matmul_heuristic_result_dtype
    CAPS: ClassVar[dict[int, dict[str, list[int]]]] = {
        6: {"TILE_IDS": [1, 2], "STAGES_IDS": [7], "SPLITK_SUPPORT": [1],
                "REDUCTION_SCHEME_MASK": [1 | 4], "CUSTOM_OPTION_MAX": [2],
                "CTA_SWIZZLING_SUPPORT": [1], "MIN_ALIGNMENT_A_BYTES": [16],
                "MIN_ALIGNMENT_B_BYTES": [16], "MIN_ALIGNMENT_C_BYTES": [16],
                "MIN_ALIGNMENT_D_BYTES": [16]},
            9: {"TILE_IDS": [3], "STAGES_IDS": [], "SPLITK_SUPPORT": [0],
                "REDUCTION_SCHEME_MASK": [0], "CUSTOM_OPTION_MAX": [0],
                "CTA_SWIZZLING_SUPPORT": [0], "MIN_ALIGNMENT_A_BYTES": [2],
                "MIN_ALIGNMENT_B_BYTES": [2], "MIN_ALIGNMENT_C_BYTES": [2],
                "MIN_ALIGNMENT_D_BYTES": [2]}}

    def __init__(self) -> None:
        self.checked: list[dict[str, int]] = []

    @staticmethod
    def get_matmul_algo_cap_attribute_dtype(attr):
        return lt_real.get_matmul_algo_cap_attribute_dtype(attr)

    @staticmethod
    def get_matmul_algo_config_attribute_dtype(attr):
        return lt_real.get_matmul_algo_config_attribute_dtype(attr)

    def matmul_algo_get_ids(self, handle, compute, scale, ta, tb, tc, td, count):
        assert (compute, scale, ta, tb, tc, td) == (68, 0, 2, 2, 2, 2)
        return (6, 9)

    @staticmethod
    def _words(ptr: int) -> np.ndarray:
        return np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint64 * 8).from_address(ptr))

    def matmul_algo_init(self, handle, compute, scale, ta, tb, tc, td, algo_id, ptr):
        words = self._words(ptr)
        words[:] = 0
        words[0] = algo_id
        words[2] = 1  # split-K 1

    def _config(self, ptr: int) -> dict[str, int]:
        words = self._words(ptr)
        return {name: int(words[i]) for i, name in enumerate(CONFIG_FIELDS)}

    def matmul_algo_cap_get_attribute(self, ptr, attr, buf, size, written):
        algo_id = int(self._words(ptr)[0])
        name = enum.Enum.__getattribute__(attr, "name") if isinstance(attr, enum.Enum) else \
            self.MatmulAlgoCapAttribute(attr).name
        values = self.CAPS[algo_id][name]
        dt = np.dtype(self.get_matmul_algo_cap_attribute_dtype(attr))
        w = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint64 * 1).from_address(written))
        w[0] = len(values) * dt.itemsize
        if buf:
            out = np.ctypeslib.as_array(
                (np.ctypeslib.ctypes.c_byte * size).from_address(buf)).view(dt)
            out[:len(values)] = values

    def matmul_algo_config_set_attribute(self, ptr, attr, buf, size):
        name = self.MatmulAlgoConfigAttribute(attr).name
        dt = np.dtype(self.get_matmul_algo_config_attribute_dtype(attr))
        value = np.ctypeslib.as_array(
            (np.ctypeslib.ctypes.c_byte * size).from_address(buf)).view(dt)[0]
        self._words(ptr)[CONFIG_FIELDS.index(name)] = int(value)

    def matmul_algo_check(self, handle, desc, la, lb, lc, ld, ptr, result):
        cfg = self._config(ptr)
        if cfg["TILE_ID"] == 2 or cfg["SPLITK_NUM"] > 8:
            raise RuntimeError("CUBLAS_STATUS_INVALID_VALUE")
        self.checked.append(cfg)
        res = np.ctypeslib.as_array(
            (np.ctypeslib.ctypes.c_byte * self.matmul_heuristic_result_dtype.itemsize)
            .from_address(result)).view(self.matmul_heuristic_result_dtype)
        res["workspace_size"][0] = 1024 * cfg["SPLITK_NUM"]


ARGS = (0, 68, (2, 2, 2), 11, (21, 22, 23))


def test_base_settings_lists_every_id_tile_and_stages_the_problem_takes():
    lt = FakeLt()
    got = lt_space.base_settings(lt, *ARGS, max_workspace=1 << 20)
    assert [s for s, _ in got] == [LtAlgo(6, 1, 7), LtAlgo(9, 3, 0)]  # tile 2 refused
    for setting, rec in got:  # the record holds the configured algorithm and its workspace
        words = rec["algo"][0]["data_"]
        assert (int(words[0]), int(words[1]), int(words[6])) == (
            setting.algo_id, setting.tile, setting.stages)
        assert int(rec["workspace_size"][0]) == 1024


def test_base_settings_stop_at_the_deadline():
    assert lt_space.base_settings(FakeLt(), *ARGS, max_workspace=1 << 20,
                                  deadline=time.perf_counter() - 1) == []


def test_a_setting_needing_more_workspace_than_allowed_is_left_out():
    assert lt_space.base_settings(FakeLt(), *ARGS, max_workspace=100) == []


def test_expansions_cover_custom_options_swizzles_and_splits_the_algorithm_has():
    lt = FakeLt()
    base = LtAlgo(6, 1, 7)
    got = [s for s, _ in lt_space.expansions(lt, *ARGS, base, 1 << 20, split=True)]
    assert base not in got
    splits = {(s.splitk, s.reduction) for s in got}
    # reductions 1 and 4 (the mask), splits up to the problem's 8, none of scheme 2
    assert splits == {(1, 0)} | {(k, r) for k in (2, 3, 4, 6, 8) for r in (1, 4)}
    assert {s.custom for s in got} == {0, 1, 2} and {s.swizzle for s in got} == {0, 1}
    assert len(got) == 3 * 2 * 11 - 1
    no_split = [s for s, _ in lt_space.expansions(lt, *ARGS, base, 1 << 20, split=False)]
    assert {s.splitk for s in no_split} == {1} and len(no_split) == 3 * 2 - 1
    # an algorithm with nothing to vary has no expansions
    assert lt_space.expansions(lt, *ARGS, LtAlgo(9, 3, 0), 1 << 20, split=True) == []


def test_struct_sets_the_reduction_only_with_split_k():
    lt = FakeLt()
    words = lt_space.struct(lt, 0, 68, (2, 2, 2), LtAlgo(6, 1, 7, 4, 4, 1, 2))["data_"][0]
    assert [int(w) for w in words[:7]] == [6, 1, 4, 4, 1, 2, 7]
    words = lt_space.struct(lt, 0, 68, (2, 2, 2), LtAlgo(6, 1, 7, 1, 4))["data_"][0]
    assert int(words[3]) == 0


def test_aligned_reads_the_algorithms_minimum_alignments():
    lt = FakeLt()
    algo16 = lt_space.struct(lt, 0, 68, (2, 2, 2), LtAlgo(6, 1, 7))
    algo2 = lt_space.struct(lt, 0, 68, (2, 2, 2), LtAlgo(9, 3, 0))
    assert lt_algos.aligned(lt, algo16, (256, 16, 16))
    assert not lt_algos.aligned(lt, algo16, (256, 8, 16))
    assert not lt_algos.aligned(lt, algo16, (16, 16, 2))
    assert lt_algos.aligned(lt, algo2, (2, 2, 2))


def test_a_pick_keeps_the_algorithm_struct_and_round_trips_through_the_database():
    lt = FakeLt()
    lt.get_version = lambda: 130100
    lt.matmul_algo_config_get_attribute = _get_config(lt)
    algo = lt_space.struct(lt, 0, 68, (2, 2, 2), LtAlgo(6, 1, 7, 4, 4, 1, 2))
    pick = lt_algos.LtPick.of(lt, 1, algo)
    assert pick.form == 1 and pick.version == 130100
    assert (pick.algo_id, pick.tile, pick.stages, pick.splitk) == (6, 1, 7, 4)
    np.testing.assert_array_equal(pick.struct(lt).view(np.uint64), algo.view(np.uint64))
    d = pick.to_dict()
    assert d["kernel"] == "cublaslt" and lt_algos.is_lt_algo(d)
    assert all(isinstance(w, str) for w in d["words"])  # 64-bit words survive JSON
    assert lt_algos.LtPick.from_dict(d) == pick
    assert pick.id.startswith("lt6_t1_s7_k4_c0_f1_") and len(pick.id.rsplit("_", 1)[1]) == 6
    other = lt_algos.LtPick(1, (*pick.words[:7], pick.words[7] + 1), 130100, 6, 1, 7, 4)
    assert other.id != pick.id  # named by its words, not only its description
    assert not lt_algos.is_lt_algo({"kernel": "skinny"})
    with pytest.raises(PycLabError, match="not a cuBLASLt pick"):
        lt_algos.LtPick.from_dict({"kernel": "skinny"})
    with pytest.raises(PycLabError, match="incomplete"):
        lt_algos.LtPick.from_dict({"kernel": "cublaslt", "form": 0, "version": 1,
                                   "words": ["1", "2"]})


def _get_config(lt: FakeLt):
    """``matmul_algo_config_get_attribute`` of the fake: its struct's words by name."""
    def get(ptr, attr, buf, size, written):
        name = lt.MatmulAlgoConfigAttribute(attr).name
        if name not in CONFIG_FIELDS:
            raise RuntimeError("CUBLAS_STATUS_INVALID_VALUE")
        dt = np.dtype(lt.get_matmul_algo_config_attribute_dtype(attr))
        out = np.ctypeslib.as_array(
            (np.ctypeslib.ctypes.c_byte * size).from_address(buf)).view(dt)
        out[0] = int(lt._words(ptr)[CONFIG_FIELDS.index(name)])
    return get
