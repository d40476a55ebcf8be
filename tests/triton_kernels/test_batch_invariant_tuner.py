"""`benchmarks/batch_invariant_matmul.py --tune-blocking`'s search, with the GEMM and the clock
replaced (the real ones need the H200): a blocking whose output differs from the base tiling's is
never picked however fast, the fastest invariant one is, equal picks at consecutive M merge into
one range, and a base tiling that differs from itself across M stops the run."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import benchmarks.batch_invariant_matmul as tuner
from benchmarks.tile_invariance import variants, verdict
from triton_kernels.batch_invariant_matmul import (TUNED, TUNED_FP32, Blocking, Tiles, base_tiles, blocking_of, hopper_tiles,
                                                   with_blocking)
from triton_kernels.batch_invariant_matmul_hopper import ping_pong_fits

BASE = Tiles(64, 128, 64, 4, 4)


class FakeGemm:
    """x @ w.T, off by a little for the `poisoned` tilings (at the call's M); `cost` gives each
    blocking's time at the call's M, cuBLAS's 1.0, times `by_split` of the tiling's split count."""

    def __init__(self, poisoned, cost, by_split=lambda split_k, m: 1.0):
        self.poisoned, self.cost, self.by_split, self.last = poisoned, cost, by_split, None

    def linear(self, x, w, tiles):
        self.last = (tiles, x.shape[0])
        out = x @ w.T
        return out + 1e-3 if self.poisoned(tiles, x.shape[0]) else out

    def bench(self, call, rep_ms=None):
        self.last = None
        call()
        if self.last is None:
            return 1.0
        tiles, m = self.last
        return self.cost(blocking_of(tiles), m) * self.by_split(tiles.split_k, m)


@pytest.fixture
def inputs():
    """Small integers: their products are exact, so the fake GEMM's rows never depend on M itself."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randint(-4, 5, (max(tuner.ROWS), 16), generator=gen).double(),
            torch.randint(-4, 5, (24, 16), generator=gen).double())


def tune(monkeypatch, inputs, poisoned, cost, base=BASE, passes=tuner.PASSES):
    gemm = FakeGemm(poisoned, cost)
    monkeypatch.setattr(tuner, "batch_invariant_linear", gemm.linear)
    monkeypatch.setattr(tuner, "bench", gemm.bench)
    return tuner.tune_blocking(*inputs, base, passes=passes)


def test_the_fastest_invariant_blocking_wins_and_a_faster_variant_one_never_does(monkeypatch, inputs):
    # BLOCK_N 256 is fastest but not invariant; among the rest, 16-row tiles with 8 warps.
    ranges, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: tiles.block_n == 256,
                         cost=lambda b, m: 0.1 if b.block_n == 256 else 0.5 if (b.block_m, b.num_warps) == (16, 8) else 1.0)
    assert ranges == ((max(tuner.ROWS), Blocking(16, 128, 8, 3)),)  # every M picked the same: one range
    assert any(e["blocking"]["block_n"] == 256 for e in tried)
    assert all(e["not_invariant"] == (e["blocking"]["block_n"] == 256) for e in tried)
    for m in tuner.ROWS:  # the base's own blocking is timed at every M, first
        assert [e["blocking"] for e in tried if e["m"] == m][0] == blocking_of(BASE)._asdict()


def test_picks_that_change_with_m_make_one_range_each(monkeypatch, inputs):
    """The row tile nearest M is fastest (ties: the first tried, 4 warps and 4 stages; the Gluon
    kernel's tiles, 256 rows among them, and the swapped ones priced out: their own tests below)."""
    ranges, _ = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False,
                     cost=lambda b, m: abs(b.block_m - m) + 10 ** 4 * (b.gluon or b.swap_ab))
    assert ranges == ((17, Blocking(16, 128, 4, 4)), (64, Blocking(64, 128, 4, 4)),
                      (max(tuner.ROWS), Blocking(128, 128, 4, 4)))


def test_a_base_tiling_that_depends_on_m_stops_the_run(monkeypatch, inputs):
    with pytest.raises(RuntimeError, match="not even the base tiling"):
        tune(monkeypatch, inputs, poisoned=lambda tiles, m: m == 17, cost=lambda b, m: 1.0)


def test_the_tma_pass_tries_the_best_blocking_with_tma_at_every_m(monkeypatch, inputs):
    ranges, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False,
                         cost=lambda b, m: 0.5 if b.tma and m > 64 else 1.0)
    assert all(any(e["m"] == m and e["blocking"]["tma"] for e in tried) for m in tuner.ROWS)
    assert ranges[-1][1].tma and not ranges[0][1].tma


def test_a_split_tiling_also_tries_its_chunks_in_one_program_and_an_unsplit_one_never(monkeypatch, inputs):
    _, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False, cost=lambda b, m: 1.0)
    assert not any(e["blocking"]["split_in_program"] for e in tried)
    ranges, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False, base=BASE._replace(split_k=2),
                         cost=lambda b, m: 0.5 if b.split_in_program and m > 1088 else 1.0)
    assert all(any(e["m"] == m and e["blocking"]["split_in_program"] for e in tried) for m in tuner.ROWS)
    assert ranges[-1][1].split_in_program and not ranges[0][1].split_in_program


@pytest.mark.parametrize("tiles", [*TUNED.values(), *TUNED_FP32.values(), Tiles(64, 128, 64, 4, 4, split_k=2, tma=True),
                                   Tiles(64, 128, 64, 4, 4, split_k=4, split_in_program=True),
                                   Tiles(128, 128, 64, 8, 3, tma=True, tail_m=16),
                                   Tiles(64, 256, 64, 4, 3, tma=True, persistent=True, warp_specialize=True),
                                   Tiles(128, 256, 64, 8, 3, tma=True, gluon=True)])
def test_the_lines_the_tuner_prints_paste_back_as_the_same_tilings(tiles):
    assert eval(tuner.tiles_line(tiles), {"Tiles": Tiles}) == tiles
    ranges = ((17, blocking_of(tiles)), (1088, blocking_of(tiles)._replace(block_m=128)))
    assert eval(tuner.ranges_line(ranges), {"Blocking": Blocking}) == ranges


def test_each_dtype_tries_its_own_candidates_the_current_tiling_first():
    """The router (float32) tries IEEE and TF32x3 tilings, never a bf16 one, and vice versa."""
    (_, n, k), = tuner.FLOAT32_SHAPES
    router = tuner.candidates(n, k, torch.float32)
    assert router[0] == base_tiles(n, k, torch.float32) and set(router[1:]) <= set(tuner.FLOAT32_CANDIDATES)
    assert {tiles.fp32_dot for tiles in router} == {"ieee", "tf32x3"}
    _, n, k = tuner.SHAPES[0]
    bf16 = tuner.candidates(n, k, torch.bfloat16)
    assert bf16[0] == base_tiles(n, k, torch.bfloat16) and not set(bf16) & set(tuner.FLOAT32_CANDIDATES)


def test_the_invariance_probe_varies_where_the_chunks_are_summed_for_split_tilings_only():
    assert not any(tiles.split_in_program for _, tiles in variants(BASE))
    split = [tiles for field, tiles in variants(BASE._replace(split_k=4)) if field == "split_in_program"]
    assert len(split) == len(tuner.LAUNCHES) and all(tiles.split_in_program for tiles in split)


def test_the_invariance_probe_covers_swapped_dots_stream_k_and_the_gluon_kernels_blockings_split_or_not():
    for base in (BASE, BASE._replace(split_k=4)):
        probed = variants(base)
        swapped = [tiles for field, tiles in probed if field == "swap_ab"]
        assert all(tiles.swap_ab for tiles in swapped)
        assert {(tiles.block_m, tiles.tail_m) for tiles in swapped} >= set(tuner.SWAP_ROWS)
        assert {(tiles.block_n, tiles.num_warps) for tiles in swapped} >= set(tuner.SWAP_COLUMNS)
        assert any(not tiles.tma for tiles in swapped) and any(tiles.persistent for tiles in swapped)
        assert any(tiles.split_in_program for tiles in swapped) == (base.split_k > 1)
        gluon = {blocking_of(tiles) for field, tiles in probed if field == "gluon"}
        assert gluon == set(tuner.gluon_blockings(base, tuner.SWAP_UP_TO_M, max(tuner.ROWS)))
        persistent = {blocking_of(tiles) for field, tiles in probed if field == "gluon_persistent"}
        assert persistent == {b._replace(persistent=True) for b in gluon if base.split_k == 1 or b.split_in_program}
        assert persistent and any(b.swap_ab for b in persistent)
        streamed = {blocking_of(tiles) for field, tiles in probed if field == "stream_k"}
        widest = max(tuner.ROWS)
        assert streamed == (set(tuner.stream_k_blockings(blocking_of(base), widest, widest)) if base.split_k > 1 else set())


def test_the_tail_pass_tries_a_second_row_tile_only_where_it_saves_padded_rows(monkeypatch, inputs):
    """Time as the rows computed, padding included, plus 8 per program: at M = 136 the row pass
    keeps 32-row tiles (160 rows, 5 programs), the tail pass finds 128 + 16 (144, one); where the
    pick fills its row tiles (1, 8, 17, 64, 4,096) no tail is tried at all."""
    def cost(b, m):
        rows = b.block_m + b.tail_m
        return tuner.padded_rows(m, rows) + 8 * tuner.padded_rows(m, rows) // rows

    ranges, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False, cost=cost)
    tails = [e for e in tried if e["blocking"]["tail_m"] and not e["blocking"]["swap_ab"]]  # the swapped pass's own
    with_tail = {e["m"] for e in tails}
    assert 136 in with_tail and not with_tail & {1, 8, 17, 64, 4096}
    picked = with_blocking(BASE, ranges, 136)
    assert (picked.block_m, picked.tail_m) == (128, 16)
    assert all(tuner.padded_rows(136, e["blocking"]["block_m"] + e["blocking"]["tail_m"]) < 160
               for e in tails if e["m"] == 136)
    assert all(e["blocking"]["block_m"] < e["m"] for e in tried if e["blocking"]["tail_m"])  # a tail holds a row


def test_the_last_pass_deepens_the_best_pipeline_at_every_m(monkeypatch, inputs):
    ranges, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False,
                         cost=lambda b, m: 0.5 if b.num_stages == 6 and m <= 64 else 1.0)
    for m in tuner.ROWS:
        assert {e["blocking"]["num_stages"] for e in tried if e["m"] == m} >= set(tuner.DEEP_STAGES)
    assert with_blocking(BASE, ranges, 17).num_stages == 6 and with_blocking(BASE, ranges, 4096).num_stages != 6


def test_the_invariance_verdict_leaves_out_pipelines_that_do_not_fit_but_not_failures():
    kept = {"identical_rows": 5, "rows": 5}
    assert verdict([kept, {"does_not_fit": "out of resource: shared memory"}]) == "identical"
    assert verdict([kept, {"error": "an illegal memory access"}]) == "incomplete"
    assert verdict([kept, {"identical_rows": 4, "rows": 5}]) == "differs"


def test_the_split_pass_keeps_the_count_whose_blocking_meets_the_goal_at_more_points(monkeypatch, inputs):
    """1.4x everywhere unsplit; 2 chunks make M <= 136 cuBLAS's time (5 goal points), 4 chunks M >=
    544 (2 points, and 4,096 is no goal point). A count that k_chunks clamps to one already searched
    is not searched again (K 16 in BLOCK_K 8: 2 blocks, so 4 chunks clamp to 2)."""
    def by_split(split_k, m):
        fast = (split_k == 2 and m <= 136) or (split_k == 4 and m >= 544)
        return 1 / 1.4 if fast else 1.0

    gemm = FakeGemm(poisoned=lambda tiles, m: False, cost=lambda b, m: 1.4, by_split=by_split)
    monkeypatch.setattr(tuner, "batch_invariant_linear", gemm.linear)
    monkeypatch.setattr(tuner, "bench", gemm.bench)
    tiles, ranges, tried, splits = tuner.tune_split(*inputs, BASE._replace(block_k=4))
    assert tiles.split_k == 2 and tiles.block_k == 4
    assert [(s["split_k"], s["met"]) for s in splits] == [(1, 0), (2, 5), (4, 2)]
    _, _, _, clamped = tuner.tune_split(*inputs, BASE._replace(block_k=8))
    assert [s["split_k"] for s in clamped] == [1, 2]
    assert {e["m"] for e in tried} == set(tuner.ROWS)
    assert any(e["blocking"]["split_in_program"] for e in tried)  # the chosen count's own blocking search
    four, _, _, told = tuner.tune_split(*inputs, BASE._replace(block_k=1), counts=(4, 8))  # --split-counts
    assert [s["split_k"] for s in told] == [4, 8] and four.split_k == 4


def test_the_goal_score_counts_points_up_to_1088_rows_then_how_far_off_they_are():
    assert tuner.goal_score({1: 1.3, 17: 1.2, 4096: 9.0}) == (1, pytest.approx(-math.log(1.2 / 1.15)))
    assert tuner.goal_score({17: 1.0, 136: 1.5}) > tuner.goal_score({17: 1.0, 136: 1.6})


def test_the_persistent_pass_tries_the_best_blocking_persistent_at_every_m(monkeypatch, inputs):
    ranges, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False,
                         cost=lambda b, m: 0.5 if b.persistent and m >= 544 else 1.0)
    for m in tuner.ROWS:
        assert sum(e["blocking"]["persistent"] and not e["blocking"]["gluon"] for e in tried if e["m"] == m) == 1
    assert with_blocking(BASE, ranges, 1088).persistent and not with_blocking(BASE, ranges, 136).persistent
    assert "persistent=True" in tuner.ranges_line(ranges)


def test_the_tuner_no_longer_tries_warp_specialized_loops(monkeypatch, inputs):
    """Triton's warp-specialized loops were never picked on the H200 (1.5-2.4x cuBLAS): the tuner
    spends no device time on them, even where they would be timed fastest."""
    for base in (BASE, BASE._replace(split_k=2)):
        ranges, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False, base=base,
                             cost=lambda b, m: 0.1 if b.warp_specialize else 1.0)
        assert tried and not any(e["blocking"]["warp_specialize"] for e in tried)
        assert "warp_specialize=True" not in tuner.ranges_line(ranges)


def test_the_gluon_pass_tries_the_hopper_kernels_tiles_last_and_a_split_tilings_both_ways(monkeypatch, inputs):
    """GLUON_TILES at BLOCK_M / 16 warps with TMA loads, no more rows than M needs, and up to
    SWAP_UP_TO_M the swapped GLUON_SWAPPED_TILES whose row tile M passes, at BLOCK_N / 16, last,
    then the fastest of them persistent, and as ping-pong the fastest whose accumulators fit two
    consumer groups (ping_pong_fits); picked where fastest; a split tiling tries each through the workspace
    and, up to 128 x 128 tiles (two accumulators in registers), with its chunks summed in the
    program, and persistent (ping-pong too) the fastest of those (no workspace)."""
    def gluon_at(tried, m, *fields):
        return {tuple(e["blocking"][f] for f in fields) for e in tried
                if e["m"] == m and e["blocking"]["gluon"] and not (e["blocking"]["swap_ab"] or e["blocking"]["persistent"])}

    def swapped_at(tried, m):
        return {tuple(e["blocking"][f] for f in ("block_m", "tail_m", "block_n", "num_stages")) for e in tried
                if e["m"] == m and e["blocking"]["gluon"] and e["blocking"]["swap_ab"] and not e["blocking"]["persistent"]}

    def persistent_at(tried, m, ping_pong=False):
        return [Blocking(**e["blocking"]) for e in tried if e["m"] == m and e["blocking"]["gluon"]
                and e["blocking"]["persistent"] and e["blocking"]["ping_pong"] == ping_pong]

    def ping_pong_of(base, tried, m, **fields):
        """The fastest gluon blocking at M (with `fields`) whose ping-pong fits, as ping-pong."""
        fitting = [(e["ratio_to_cublas"], Blocking(**e["blocking"])._replace(persistent=True, ping_pong=True))
                   for e in tried if e["m"] == m and e["blocking"]["gluon"] and not e["blocking"]["persistent"]
                   and all(e["blocking"][f] == v for f, v in fields.items())]
        fitting = [(ratio, b) for ratio, b in fitting if ping_pong_fits(hopper_tiles(base._replace(**b._asdict())),
                                                                       base.split_k if b.split_in_program else 1)]
        return [min(fitting, key=lambda pair: pair[0])[1]] if fitting else []

    ranges, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False,
                         cost=lambda b, m: 0.5 if b.gluon and b.block_m == 128 and m >= 544 else 1.0)
    below = [m for m in tuner.ROWS if m < tuner.GLUON_FROM_M]
    assert below and not any(e["blocking"]["gluon"] for e in tried if e["m"] in below)
    for m in [m for m in tuner.ROWS if m >= tuner.GLUON_FROM_M]:
        tiles = gluon_at(tried, m, "block_m", "block_n", "num_stages")
        assert tiles == {t for t in tuner.GLUON_TILES if t[0] == 64 or t[0] < 2 * m}
        swapped = swapped_at(tried, m)
        assert swapped == ({t for t in tuner.GLUON_SWAPPED_TILES if t[0] < m} if m <= tuner.SWAP_UP_TO_M else set())
        fastest = min((e for e in tried if e["m"] == m and e["blocking"]["gluon"] and not e["blocking"]["persistent"]),
                      key=lambda e: e["ratio_to_cublas"])
        assert persistent_at(tried, m) == [Blocking(**fastest["blocking"])._replace(persistent=True)]
        ping_pong = ping_pong_of(BASE, tried, m)
        assert ping_pong and persistent_at(tried, m, ping_pong=True) == ping_pong  # some tile always fits
        last = len(tiles) + len(swapped) + 2  # then the fastest of them persistent, the fastest fitting ping-pong
        assert [e["blocking"]["gluon"] for e in tried if e["m"] == m][-last:] == [True] * last
    gluon = [Blocking(**e["blocking"]) for e in tried if e["blocking"]["gluon"]]
    assert all(b.num_warps == (b.block_n if b.swap_ab else b.block_m) // 16 and b.tma for b in gluon)
    assert any(b.swap_ab and b.tail_m for b in gluon)
    assert with_blocking(BASE, ranges, 1088).gluon and not with_blocking(BASE, ranges, 136).gluon
    assert eval(tuner.ranges_line(ranges), {"Blocking": Blocking}) == ranges
    split = BASE._replace(split_k=2)
    ranges, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False, base=split,
                         cost=lambda b, m: (0.4 if b.ping_pong else 0.5) if b.gluon and b.split_in_program and m >= 544
                         else 1.0)
    assert not any(e["blocking"]["gluon"] for e in tried if e["m"] < tuner.GLUON_FROM_M)
    for m in [m for m in tuner.ROWS if m >= tuner.GLUON_FROM_M]:
        tiles = {t[:2] for t in tuner.GLUON_TILES if t[0] == 64 or t[0] < 2 * m}
        assert gluon_at(tried, m, "block_m", "block_n", "split_in_program") == (
            {(*t, False) for t in tiles} | {(*t, True) for t in tiles if t[0] * t[1] <= 128 * 128})
        in_program = min((e for e in tried if e["m"] == m and e["blocking"]["gluon"] and e["blocking"]["split_in_program"]
                          and not e["blocking"]["persistent"]), key=lambda e: e["ratio_to_cublas"])
        assert persistent_at(tried, m) == [Blocking(**in_program["blocking"])._replace(persistent=True)]
        assert persistent_at(tried, m, ping_pong=True) == ping_pong_of(split, tried, m, split_in_program=True)
    picked = with_blocking(split, ranges, 1088)
    assert picked.gluon and picked.split_in_program and picked.block_m * picked.block_n <= 128 * 128
    assert picked.persistent and picked.ping_pong  # the fastest, and a line that pastes back
    assert eval(tuner.ranges_line(ranges), {"Blocking": Blocking}) == ranges
    assert not with_blocking(split, ranges, 136).gluon


def test_the_swapped_pass_tries_the_least_padded_row_tiles_to_1088_then_its_best_with_other_stages(monkeypatch, inputs):
    """At M = 136 the first swapped tiles are 128 + 16 and 64 + 16 rows (144 and 160 computed; 16
    rows, 144 in 9 tiles, streams the weight 9 times), each at 64 weight rows on 4 warps and 128 on
    8 (and 128 on 4); at 1,088, 256 + 16 and 128 + 16 (1,088 and 1,152; 32 rows' 1,088 in 34
    tiles); none at 4,096. The fastest swapped blocking then runs at SWAP_STAGES and, split, with
    its chunks in the program; the persistent pass starts from it where it is the fastest of all."""
    fast = Blocking(128, 64, 4, 6, tma=True, tail_m=16, swap_ab=True)
    ranges, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False, base=BASE._replace(split_k=2),
                         cost=lambda b, m: 0.5 if b._replace(split_in_program=False, persistent=False) == fast
                         else 0.8 if b.swap_ab and not b.stream_k else 1.0)
    swapped = {m: [Blocking(**e["blocking"]) for e in tried
                   if e["m"] == m and e["blocking"]["swap_ab"] and not e["blocking"]["stream_k"]]  # the swapped pass's
               for m in tuner.ROWS}
    first = len(tuner.SWAP_COLUMNS) * 2
    assert {(b.block_m, b.tail_m, b.block_n, b.num_warps) for b in swapped[136][:first]} == {
        (rows, 16, block_n, warps) for rows in (128, 64) for block_n, warps in tuner.SWAP_COLUMNS}
    assert {(b.block_m, b.tail_m) for b in swapped[1088][:first]} == {(256, 16), (128, 16)}
    assert not swapped[4096] and all(swapped[m] for m in tuner.ROWS if m <= 1088)
    assert fast in swapped[136] and fast._replace(split_in_program=True) in swapped[136]
    assert fast._replace(persistent=True) in swapped[136]
    assert with_blocking(BASE, ranges, 136).swap_ab and not with_blocking(BASE, ranges, 4096).swap_ab
    assert eval(tuner.ranges_line(ranges), {"Blocking": Blocking}) == ranges


def test_the_stream_k_pass_runs_for_split_tilings_only_and_wins_where_fastest(monkeypatch, inputs):
    """The best so far as stream-K (its persistent flag and in-program split dropped, its tail
    kept), then STREAM_K_BLOCKINGS no wider than M needs, the tailed ones where M passes their row
    tile, after the persistent pass and before the Gluon one."""
    _, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False, cost=lambda b, m: 1.0)
    assert not any(e["blocking"]["stream_k"] for e in tried)
    split = BASE._replace(split_k=4)
    ranges, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False, base=split,
                         cost=lambda b, m: 0.5 if b.stream_k and b.block_m == 128 and m >= 544 else 1.0)
    for m in tuner.ROWS:
        streamed = [Blocking(**e["blocking"]) for e in tried if e["m"] == m and e["blocking"]["stream_k"]]
        assert streamed and all(not (b.persistent or b.split_in_program) for b in streamed) and not streamed[0].gluon
        widest = 1 << (m - 1).bit_length()
        assert {(b.block_m, b.tail_m) for b in streamed[1:] if not b.gluon} == {
            (t[0], t[5]) for t in tuner.STREAM_K_BLOCKINGS if (t[0] < m if t[5] else t[0] <= max(64, widest))}
        assert (m > 128) == ((128, 16) in {(b.block_m, b.tail_m) for b in streamed[1:] if not b.gluon})
        gluon = {(b.block_m, b.tail_m, b.block_n, b.num_stages, b.swap_ab) for b in streamed if b.gluon}
        assert gluon == {t for t in tuner.GLUON_STREAM_K_TILES if m >= tuner.GLUON_FROM_M
                         and (t[0] < m <= tuner.SWAP_UP_TO_M if t[1] else t[0] <= max(64, widest))}
        assert all(b.num_warps == (b.block_n if b.swap_ab else b.block_m) // 16 for b in streamed if b.gluon)
    picked = with_blocking(split, ranges, 1088)
    assert picked.stream_k and picked.block_m == 128 and not with_blocking(split, ranges, 136).stream_k
    assert eval(tuner.ranges_line(ranges), {"Blocking": Blocking}) == ranges


def test_the_named_passes_run_alone_beside_the_base_and_the_tables_blockings(monkeypatch, inputs):
    shape = tuple(inputs[1].shape)
    table = Blocking(32, 256, 8, 7)
    monkeypatch.setitem(tuner.BLOCKING_BY_M, shape, ((4096, table),))
    _, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False, cost=lambda b, m: 1.0, passes=("swap",))
    for m in tuner.ROWS:
        at_m = [Blocking(**e["blocking"]) for e in tried if e["m"] == m]
        assert at_m[:2] == [blocking_of(BASE), table]
        assert all(b.swap_ab for b in at_m[2:]) and bool(at_m[2:]) == (m <= tuner.SWAP_UP_TO_M)


def test_the_blocking_the_table_serves_today_is_timed_and_kept_where_no_pass_reaches_it(monkeypatch, inputs):
    """7 stages at 32 x 256 is in no pass's reach (DEEP_STAGES: 5, 6, 8); as the table's pick at
    M <= 64 it is timed there, and wins, and nowhere else; an in-program split sum in the table is
    not timed on an unsplit base."""
    shape = tuple(inputs[1].shape)
    table = Blocking(32, 256, 8, 7)
    monkeypatch.setitem(tuner.BLOCKING_BY_M, shape, ((64, table), (4096, Blocking(64, 128, 4, 4, split_in_program=True))))
    ranges, tried = tune(monkeypatch, inputs, poisoned=lambda tiles, m: False, cost=lambda b, m: 0.5 if b == table else 1.0)
    assert with_blocking(BASE, ranges, 64) == BASE._replace(**table._asdict())
    assert {e["m"] for e in tried if Blocking(**e["blocking"]) == table} == {m for m in tuner.ROWS if m <= 64}
    assert not any(e["blocking"]["split_in_program"] for e in tried)


@pytest.mark.parametrize("args, problem", [
    (["--passes", "swap,fast"], "no pass named 'fast'"), (["--shapes", "q_a_proj,nope"], "no shape named 'nope'"),
    (["--tune-split", "--split-counts", "2,x"], "--split-counts must be positive integers, not 2,x"),
    (["--tune-split", "--split-counts", "0,4"], "--split-counts must be positive integers, not 0"),
    (["--tune-blocking", "--split-counts", "8"], "--split-counts is --tune-split's"),
    ([], "needs a CUDA GPU")])
def test_bad_arguments_get_one_line_and_exit_2(args, problem):
    """Named before the GPU is looked for, so this machine's CPU says which argument is wrong."""
    done = subprocess.run([sys.executable, str(Path(tuner.__file__)), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("benchmarks/batch_invariant_matmul.py: ") and problem in done.stderr, done.stderr


def test_the_invariance_probes_file_says_incomplete_until_every_shape_is_done(monkeypatch, tmp_path):
    import benchmarks.tile_invariance as probe
    written = []
    monkeypatch.setattr(probe, "write_result", lambda path, result: written.append(result))
    monkeypatch.setattr(probe, "describe", lambda: {})
    same = {"changed": "num_warps", "rows": 4, "identical_rows": 4}
    shapes = [{"shape": name, "variants": [same]} for name, _, _ in probe.SHAPES]
    assert probe.write_shapes(tmp_path / "out.json", shapes[:3]) == ("incomplete", {"num_warps": "identical"})
    assert written[-1]["shapes_done"] == f"3 of {len(probe.SHAPES)}"
    assert probe.write_shapes(tmp_path / "out.json", shapes)[0] == "identical"
    shapes[-1]["variants"] = [{**same, "identical_rows": 3}]
    assert probe.write_shapes(tmp_path / "out.json", shapes) == ("differs", {"num_warps": "differs"})
