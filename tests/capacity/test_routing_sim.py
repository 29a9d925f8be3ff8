"""The routing simulator (capacity/routing_sim.py, issue 29 item 1): the behaviours a line's owner relies on
when choosing a routing strategy. Small traces (1,500 requests) keep it to a few seconds; the benchmark
(scripts/bench_routing.py) runs the full 12,031."""

from __future__ import annotations

from dataclasses import replace

import pytest

from capacity import routing_sim as rs
from capacity.fit import PlanInputs
from capacity.model_specs import lookup_model
from capacity.planner import plan

REPLICAS = 4
REQUESTS = 1_500

#: rag-assistant's caches: Qwen2-7B on one L40S, 16 GiB of L1, 500 GiB of L2 deleted above 80%.
PLAN = plan(PlanInputs(model=lookup_model("Qwen2-7B"), instance_type="ml.g6e.12xlarge", tp=1, replicas=REPLICAS,
                       l1_gib_per_replica=16, l2_size_gib=500, l2_high_watermark=0.8))
SERVICE = rs.ServiceModel.from_plan(PLAN)


def small(shape: rs.TraceShape, **changes) -> rs.TraceShape:
    """``shape`` with :data:`REQUESTS` requests and its groups scaled alike."""
    return replace(shape, requests=REQUESTS, groups=round(shape.groups * REQUESTS / shape.requests), **changes)


def at_load(trace: rs.Trace, load: float = 0.7) -> rs.Trace:
    return trace.scaled_to(rs.rate_for_load(trace, SERVICE, replicas=REPLICAS, load=load))


@pytest.fixture(scope="module")
def conversation() -> rs.Trace:
    return at_load(rs.make_trace(small(rs.MOONCAKE_CONVERSATION), seed=1))


@pytest.fixture(scope="module")
def synthetic() -> rs.Trace:
    return at_load(rs.make_trace(small(rs.MOONCAKE_SYNTHETIC), seed=1))


@pytest.fixture(scope="module")
def results(conversation, synthetic) -> dict[tuple[str, str, bool], rs.SimResult]:
    return {(name, r.strategy, r.l2): r for name, trace in (("conversation", conversation), ("synthetic", synthetic))
            for r in rs.compare(trace, SERVICE, replicas=REPLICAS)}


def test_the_conversation_trace_has_the_published_figures() -> None:
    """Issue 29's figures of Mooncake's conversation trace: 12,031 requests at 3.4 req/s, bursty, input p50
    about 6.9k tokens, a 37% reuse ceiling, one first block shared by every request."""
    trace = rs.make_trace(rs.MOONCAKE_CONVERSATION, seed=0)
    assert len(trace.requests) == 12_031
    assert trace.rate_per_s == pytest.approx(3.4, rel=0.05)
    assert trace.arrival_cv > 1.5  # bursty: Poisson's is 1
    assert trace.input_p50_tokens == pytest.approx(6_900, rel=0.05)
    assert trace.reuse_ceiling == pytest.approx(0.37, abs=0.005)
    assert {r.blocks[0] for r in trace.requests} == {0}
    assert all(r.session for r in trace.requests)


def test_the_synthetic_trace_has_its_ceiling_over_its_prefix_groups() -> None:
    trace = rs.make_trace(rs.MOONCAKE_SYNTHETIC, seed=0)
    assert trace.reuse_ceiling == pytest.approx(0.64, abs=0.005)
    assert len({r.group for r in trace.requests}) == 2_211
    assert all(r.session is None for r in trace.requests)


def test_an_unreachable_ceiling_is_refused() -> None:
    with pytest.raises(ValueError, match="out of reach"):
        rs.make_trace(replace(small(rs.MOONCAKE_CONVERSATION), groups=REQUESTS, reuse_ceiling=0.5))


def test_the_service_times_are_the_planners() -> None:
    """A whole 2,500-token prompt: cold = the planner's cold TTFT, read from L2 = its warm TTFT (the
    reference run's 774 ms and 287 ms)."""
    assert SERVICE.service_ms(2_500, 0, 0) == pytest.approx(PLAN.timing.cold_ttft_ms)
    assert SERVICE.service_ms(2_500, 0, 2_500) == pytest.approx(PLAN.timing.warm_ttft_ms)
    assert SERVICE.service_ms(2_500, 2_500, 0) == pytest.approx(0.0)


def test_prefixaware_sends_all_traffic_to_one_replica_when_every_prompt_shares_a_first_block(results) -> None:
    """production-stack #957: the trie's first chunk is shared by every request and records one replica."""
    for trace in ("conversation", "synthetic"):
        for l2 in (True, False):
            hot = results[(trace, "prefixaware", l2)]
            assert hot.max_request_share > 0.99 and hot.max_work_share > 0.99, (trace, l2)
            assert hot.ttft_p99_ms > 10 * results[(trace, "leastwork", l2)].ttft_p99_ms


def test_without_a_shared_first_block_prefixaware_spreads_documents() -> None:
    """The hot spot is the shared block's doing: without it the same router spreads the prefix groups."""
    trace = at_load(rs.make_trace(small(rs.MOONCAKE_SYNTHETIC, shared_first_block=False,
                                        reuse_ceiling=0.6), seed=1))
    assert rs.simulate(trace, SERVICE, "prefixaware", replicas=REPLICAS, l2=True).max_request_share < 0.4


@pytest.mark.parametrize("trace", ["conversation", "synthetic"])
@pytest.mark.parametrize("l2", [True, False])
def test_the_load_dominant_blend_keeps_every_replica_near_its_share(results, trace, l2) -> None:
    r = results[(trace, "leastwork", l2)]
    bound = 1 / REPLICAS + 0.1
    assert r.max_request_share <= bound and r.max_work_share <= bound
    assert min(r.work_share) >= 1 / REPLICAS - 0.1


@pytest.mark.parametrize("trace", ["conversation", "synthetic"])
def test_with_l2_the_miss_ratio_does_not_depend_on_the_strategy(results, trace) -> None:
    with_l2 = [r.miss_ratio for (t, _, l2), r in results.items() if t == trace and l2]
    without = [r.miss_ratio for (t, _, l2), r in results.items() if t == trace and not l2]
    assert max(with_l2) - min(with_l2) <= 0.02
    assert max(without) - min(without) >= 0.05
    assert min(without) >= max(with_l2) - 0.02  # the L2 never loses a reuse that routing found


def test_with_l2_roundrobin_captures_the_reuse_affinity_captures_without(results) -> None:
    """With a shared L2, every reuse is captured somewhere: round robin's misses are session routing's."""
    rr, session = results[("conversation", "roundrobin", True)], results[("conversation", "session", True)]
    assert rr.miss_ratio == pytest.approx(session.miss_ratio, abs=0.01)
    assert rr.l2_hit_ratio > 0.05 and session.l2_hit_ratio < rr.l2_hit_ratio
    assert results[("conversation", "roundrobin", False)].miss_ratio > session.miss_ratio + 0.05


def test_kvaware_routes_as_if_there_were_no_l2(results) -> None:
    """It asks LMCache's controller, which sees each replica's local tiers only."""
    for trace in ("conversation", "synthetic"):
        assert (results[(trace, "kvaware", True)].assignments == results[(trace, "kvaware", False)].assignments)


def test_session_keeps_a_conversation_on_one_replica(conversation, results) -> None:
    by_session: dict[str, set[int]] = {}
    for request, replica in zip(conversation.requests, results[("conversation", "session", True)].assignments):
        by_session.setdefault(request.session, set()).add(replica)
    assert all(len(replicas) == 1 for replicas in by_session.values())
    assert len(set().union(*by_session.values())) == REPLICAS


def test_roundrobin_takes_the_replicas_in_turn(results) -> None:
    r = results[("conversation", "roundrobin", True)]
    assert r.assignments[:8] == (0, 1, 2, 3, 0, 1, 2, 3)
    assert max(r.request_share) - min(r.request_share) <= 1 / REQUESTS


def test_the_same_seed_gives_the_same_figures(conversation) -> None:
    again = at_load(rs.make_trace(small(rs.MOONCAKE_CONVERSATION), seed=1))
    assert again == conversation
    assert (rs.simulate(again, SERVICE, "prefixaware", replicas=REPLICAS, l2=True, seed=3)
            == rs.simulate(conversation, SERVICE, "prefixaware", replicas=REPLICAS, l2=True, seed=3))
    other = rs.make_trace(small(rs.MOONCAKE_CONVERSATION), seed=2)
    assert [r.tokens for r in other.requests] != [r.tokens for r in conversation.requests]


@pytest.mark.parametrize("shape", [rs.MOONCAKE_CONVERSATION, rs.MOONCAKE_SYNTHETIC], ids=lambda s: s.name)
def test_the_ceiling_is_met_with_prompts_clipped_to_a_lines_context(shape) -> None:
    """rag-assistant's --max-model-len 8192 leaves prompts of at most 16 blocks: still fitted (dithered rounding)."""
    trace = rs.make_trace(small(shape, max_input_tokens=8_192), seed=4)
    assert trace.reuse_ceiling == pytest.approx(shape.reuse_ceiling, abs=0.002)
    assert max(r.tokens for r in trace.requests) <= 8_192


def test_the_planner_notes_a_hot_spot_in_a_lines_config() -> None:
    """scripts/plan.py --business-line: prefixaware with hot prefixes is a hot spot; the example's
    roundrobin is not; kvaware on a chat endpoint falls back."""
    from capacity.fit import inputs_from_line
    from platform_config import load_project
    from tests.example_config import FIXTURE_CONFIG, USER_CONFIG

    def notes(config, name):
        project = load_project(config)
        line = project.business_line(name)
        return line, rs.line_routing_notes(line, plan(inputs_from_line(line, project.platform)))

    line, fixture_rag = notes(FIXTURE_CONFIG, "rag-assistant")
    assert line.routing_strategy == "prefixaware" and line.hot_prefixes.active
    assert any("hot spot" in n for n in fixture_rag)
    if (USER_CONFIG / "business-lines" / "rag-assistant.yaml").exists():  # a fork replaces the example lines
        line, example_rag = notes(USER_CONFIG, "rag-assistant")
        assert line.routing_strategy == "roundrobin" and example_rag == []
    _, fixture_rr = notes(FIXTURE_CONFIG, "research-reasoning")
    assert any("chat requests are not tokenized" in n for n in fixture_rr) and any("one replica" in n for n in fixture_rr)


def test_after_a_scale_out_prefixaware_gives_the_new_replicas_nothing(conversation) -> None:
    """The trie sends known prefixes where they went before; the shared first block is known to all of
    them, so replicas added by a scale-out get no request. Round robin and the blend use them at once."""
    midpoint = conversation.requests[len(conversation.requests) // 2].arrival_s
    after = [k for k, r in enumerate(conversation.requests) if r.arrival_s >= midpoint]

    def share_of_new(strategy: str) -> float:
        result = rs.simulate(conversation, SERVICE, strategy, replicas=2, l2=True, scale_out=(midpoint, 2))
        assert len(result.request_share) == 4
        return sum(result.assignments[k] >= 2 for k in after) / len(after)

    assert share_of_new("prefixaware") == 0.0
    assert share_of_new("roundrobin") == pytest.approx(0.5, abs=0.01)
    assert share_of_new("leastwork") > 0.4
