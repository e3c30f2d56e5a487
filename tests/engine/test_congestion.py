"""The congestion-control objects (engine/congestion.py), alone: DCQCN's reaction
point against the DCQCN paper's equations, the parameter checks, the kinds."""

from __future__ import annotations

import pytest

from softverbs.engine.congestion import (
    DCQCN_PARAMS,
    CCConfig,
    Dcqcn,
    NoControl,
    SlowRestart,
    check_params,
)

GBPS = 1e9
LINE = 10 * GBPS


def dcqcn(**params: int) -> Dcqcn:
    cfg = CCConfig("dcqcn", params, line_rate=LINE)
    cc = cfg.new(1024)
    assert isinstance(cc, Dcqcn)
    return cc


def test_defaults_are_mlx5s() -> None:
    d = {p.name: p.default for p in DCQCN_PARAMS}
    assert d["rpg_ai_rate"] == 5 and d["rpg_hai_rate"] == 50
    assert d["rpg_time_reset"] == 300 and d["rpg_byte_reset"] == 32767
    assert d["rpg_threshold"] == 1 and d["rpg_gd"] == 11
    assert d["rpg_min_dec_fac"] == 50 and d["rpg_min_rate"] == 1
    assert d["dce_tcp_g"] == 1019 and d["dce_tcp_rtt"] == 1
    assert d["initial_alpha_value"] == 1023
    assert d["min_time_between_cnps"] == 4 and d["cnp_dscp"] == 48 and d["cnp_802p_prio"] == 6
    assert d["rate_reduce_monitor_period"] == 4
    assert d["clamp_tgt_rate"] == 0 and d["clamp_tgt_rate_after_time_inc"] == 1


@pytest.mark.parametrize(
    ("kind", "params", "words"),
    [
        ("dcqcn", {"rpg_min_dec_fac": 101}, "rpg_min_dec_fac=101 is out of range: 0..100 %"),
        ("dcqcn", {"cnp_dscp": 64}, "cnp_dscp=64 is out of range: 0..63"),
        ("dcqcn", {"rpg_threshold": 0}, "rpg_threshold=0 is out of range: 1..31"),
        ("dcqcn", {"rpg_bogus": 1}, "'rpg_bogus' is not a DCQCN parameter"),
        ("dcqcn", {"rpg_ai_rate": "5"}, "rpg_ai_rate must be an integer"),
        ("cubic", {}, "choose one of slow_restart, none, dcqcn"),
        ("none", {"rpg_ai_rate": 5}, "'none' takes no parameters"),
    ],
)
def test_bad_parameters_are_refused_with_the_range(kind: str, params: dict[str, int],
                                                   words: str) -> None:  # fmt: skip
    problem = check_params(kind, params)
    assert problem is not None and words in problem, problem
    with pytest.raises(ValueError, match=words.split("(")[0][:20]):
        CCConfig(kind, params)


def test_kinds() -> None:
    assert isinstance(CCConfig().new(64), SlowRestart)
    assert isinstance(CCConfig("none").new(64), NoControl)
    assert CCConfig("dcqcn").ect == 2 and CCConfig().ect == 0
    nc = NoControl()
    nc.on_loss(0.0)
    assert nc.window(512) == 512 and nc.can_send(0.0) and not nc.on_cnp(0.0)


def test_slow_restart_halves_and_grows_back() -> None:
    sr = SlowRestart(256)
    sr.on_loss(0.0)
    assert sr.window(256) == 128
    sr.on_ack(128, 0.0)  # 128 * 16 credit / 128 = 16 packets
    assert sr.window(256) == 144
    for _ in range(10):
        sr.on_loss(0.0)
    assert sr.window(256) == 4  # never below MIN_WINDOW


def test_first_cnp_halves_the_rate_and_sets_the_target() -> None:
    cc = dcqcn()
    assert cc.rc == LINE
    assert cc.on_cnp(1e-3)
    alpha = 1023 / 1024  # initial_alpha_value
    assert cc.rt == LINE
    assert cc.rc == pytest.approx(LINE * (1 - alpha / 2))  # Rc(1 - alpha/2)


def test_cut_follows_rpg_gd_and_min_dec_fac() -> None:
    cc = dcqcn(rpg_gd=10, rpg_min_dec_fac=30)  # rc * (1 - alpha), bounded below by 30 %
    cc.on_cnp(0.0)
    assert cc.rc == pytest.approx(LINE * 0.3)
    floor = dcqcn(rpg_min_rate=9000)  # 9 Gb/s
    floor.on_cnp(0.0)
    assert floor.rc == pytest.approx(9 * GBPS)


def test_cuts_are_at_most_one_per_monitor_period() -> None:
    cc = dcqcn(rate_reduce_monitor_period=50, dce_tcp_rtt=131071)
    cc.on_cnp(0.0)
    once = cc.rc
    cc.on_cnp(10e-6)  # inside the period: the cut waits for its end
    cc.on_cnp(20e-6)  # a second CNP in the same period adds nothing
    assert cc.rc == once and cc.cuts == 1 and cc.cut_due == pytest.approx(50e-6)
    cc.can_send(49e-6)
    assert cc.rc == once
    cc.can_send(50e-6)  # the period ended: one deferred cut
    assert cc.cuts == 2 and cc.cut_at == pytest.approx(50e-6)
    assert cc.rc == pytest.approx(once * (1 - cc.alpha / 2))
    cc.can_send(1e-3)  # no CNP since: nothing more
    assert cc.cuts == 2
    cc.on_cnp(2e-3)  # long after the last cut: at once
    assert cc.cuts == 3 and cc.cut_due is None


def test_target_rate_clamping() -> None:
    # mlx5's default: a cut before any timer event keeps the target the flow had.
    cc = dcqcn(rpg_time_reset=100, dce_tcp_rtt=131071)
    cc.on_cnp(0.0)
    cc.on_cnp(50e-6)  # the timer (100 us) has not fired: rt stays the line rate
    assert cc.rt == LINE and cc.cuts == 2
    cc.can_send(150e-6)  # a timer event raises rc ...
    assert cc.timer_stage == 1
    rc = cc.rc
    cc.on_cnp(160e-6)  # ... so this cut clamps the target to the rate it cut from
    assert cc.rt == pytest.approx(rc) and cc.rc < rc
    # clamp_tgt_rate: every cut (the paper's rt = rc).
    paper = dcqcn(clamp_tgt_rate=1, rpg_time_reset=100, dce_tcp_rtt=131071)
    paper.on_cnp(0.0)
    rc = paper.rc
    paper.on_cnp(50e-6)
    assert paper.rt == pytest.approx(rc)
    # neither: the target never follows a cut.
    never = dcqcn(clamp_tgt_rate_after_time_inc=0, rpg_time_reset=100, dce_tcp_rtt=131071)
    never.on_cnp(0.0)
    never.can_send(150e-6)
    never.on_cnp(160e-6)
    assert never.rt == LINE


def test_alpha_update_equations() -> None:
    g = 1019 / 1024
    cc = dcqcn(dce_tcp_rtt=10, rate_reduce_monitor_period=1000)
    cc.on_cnp(0.0)  # alpha = initial; the period ends at 10 us with a CNP in it
    a0 = cc.alpha
    cc.can_send(10e-6)
    assert cc.alpha == pytest.approx(g * a0 + (1 - g))  # raised
    cc.can_send(50e-6)  # four more periods, no CNP
    assert cc.alpha == pytest.approx((g * a0 + (1 - g)) * g**4)  # decayed


def test_recovery_fast_then_additive_then_hyper() -> None:
    # F = 2 timer events of fast recovery; byte counter out of the way at first.
    cc = dcqcn(rpg_threshold=2, rpg_time_reset=100, rpg_byte_reset=10_000_000,
               rpg_ai_rate=40, rpg_hai_rate=400, dce_tcp_rtt=131071,
               clamp_tgt_rate=1)  # fmt: skip
    cc.on_cnp(0.0)
    cc.on_cnp(50e-6)  # a second cut: rt is now below the line rate; timer from 50 us
    rt, rc = cc.rt, cc.rc
    assert rt < LINE
    cc.can_send(150e-6)  # T=1 < F: fast recovery, rt unchanged, rc halfway to it
    rc = (rt + rc) / 2
    assert cc.rt == rt and cc.rc == pytest.approx(rc)
    cc.can_send(250e-6)  # T=2 >= F, BC=0 < F: additive increase
    rt += 40e6
    rc = (rt + rc) / 2
    assert cc.rt == pytest.approx(rt) and cc.rc == pytest.approx(rc)
    cc.byte_stage = 2  # the byte counter has reached F too: hyper increase from now on
    cc.can_send(350e-6)  # T=3, BC=2: i = min(T, BC) - F + 1 = 1
    rt += 400e6
    assert cc.rt == pytest.approx(rt) and cc.rc == pytest.approx((rt + rc) / 2)


def test_byte_counter_drives_increase_events() -> None:
    cc = dcqcn(rpg_byte_reset=8192, rpg_time_reset=131071)
    cc.on_cnp(0.0)
    events = cc.events
    for _ in range(4):
        cc.on_packet_sent(4096, 1, 1e-6)
    assert cc.events == events + 2
    assert cc.byte_stage == 2


def test_byte_reset_zero_turns_the_byte_counter_off() -> None:
    # mstflint's register description of rpg_byte_reset: bytes, "0 == disabled".
    assert check_params("dcqcn", {"rpg_byte_reset": 0}) is None
    assert "out of range: 0.." in (check_params("dcqcn", {"rpg_byte_reset": -1}) or "")
    cc = dcqcn(rpg_byte_reset=0, rpg_time_reset=100, rpg_threshold=1, dce_tcp_rtt=131071)
    cc.on_cnp(0.0)
    rc = cc.rc
    for _ in range(1000):  # 4 MB below the line rate, before the timer: no event
        cc.on_packet_sent(4096, 1, 1e-6)
    assert cc.events == 0 and cc.byte_stage == 0 and cc.rc == rc
    # The timer alone drives recovery: with F = 1 every event is additive (T >= F),
    # never hyper (that needs the byte stage at F too); rt is capped at the line.
    cc.can_send(100e-6 + 1e-9)
    assert cc.events == 1 and cc.rt == LINE and cc.rc == pytest.approx((LINE + rc) / 2)
    cc.on_cnp(150e-6)  # a timer event came since the last cut: rt = rc, then cut
    rt = cc.rt
    assert rt < LINE
    cc.can_send(350e-6 + 1e-9)  # T = 2 events since the cut at 150 us, BC = 0
    assert cc.timer_stage == 2 and cc.byte_stage == 0
    assert cc.rt == pytest.approx(rt + 2 * 5e6)  # two rpg_ai_rate steps; hyper: + 50 Mb/s


def test_pacing_spends_the_rate() -> None:
    cc = dcqcn(rpg_time_reset=131071)
    cc.on_cnp(0.0)
    rate = cc.rc
    assert cc.can_send(0.0)
    cc.on_packet_sent(4096, 1, 0.0)
    assert not cc.can_send(0.0)
    wake = cc.next_send_time()
    assert wake == pytest.approx(4096 * 8 / rate)
    assert cc.can_send(wake + 1e-12)


def test_a_flow_back_at_line_rate_stops_its_timer() -> None:
    cc = dcqcn(rpg_time_reset=10, rpg_threshold=1, rpg_hai_rate=400_000, dce_tcp_rtt=131071)
    cc.on_cnp(0.0)
    cc.can_send(1.0)
    assert cc.rc == LINE and cc.timer_at is None
