"""The OpenVINO GenAI condition probes (:mod:`conformance.engines.openvino.probes`) against a model of a paged KV pool,
without OpenVINO: they read the block size, the chunked prefill and the prefix cache's hits off the pool's usage and
the steps, and each reading fails when the pool does not do what it claims (no cache, no chunking, another block
size, a request dropped)."""
from __future__ import annotations

import math
import weakref

import pytest

from conformance.engines.openvino import adapter as ovad
from conformance.engines.openvino.probes import BlockProbe, stated_budget
from conformance.engines.conditions import condition


class _Metrics:
    def __init__(self, usage, most):
        self.cache_usage, self.max_cache_usage = usage, most


class _Handle:
    def __init__(self):
        self.status = "GenerationStatus.RUNNING"

    def get_status(self):
        return self.status


class FakePool:
    """A paged pool as OpenVINO GenAI's scheduler keeps one: ``block`` slots per block, ``pool`` blocks; a prompt is
    prefilled ``budget`` tokens per step (None: whole), then one token per step; a finished request frees its blocks;
    with ``prefix_cache`` a full prompt block whose tokens (and all before them) were computed before is served from
    the cache (shared, not allocated). A request whose handle is gone is dropped, as the engine drops it."""

    def __init__(self, block=32, pool=2048, budget=None, prefix_cache=True):
        self.block, self.pool, self.budget, self.prefix_cache = block, pool, budget, prefix_cache
        self.running, self.cached, self.most = [], set(), 0.0
        self.usage = 0.0

    def add_request(self, rid, prompt, max_new):
        handle = _Handle()
        self.running.append({"id": rid, "prompt": list(prompt), "max_new": max_new, "done": 0, "generated": 0,
                             "handle": weakref.ref(handle), "started": False})
        return handle

    def has_non_finished_requests(self):
        return bool(self.running)

    def _keys(self, r):
        kv = r["done"] + max(0, r["generated"] - 1)
        keys = set()
        for i in range(math.ceil(kv / self.block)):
            end = (i + 1) * self.block
            full_prompt_block = end <= len(r["prompt"]) and end <= r["done"]
            keys.add(tuple(r["prompt"][:end]) if self.prefix_cache and full_prompt_block else (r["id"], i))
        return keys

    def step(self):
        for r in list(self.running):
            if r["handle"]() is None:
                self.running.remove(r)
                continue
            if not r["started"]:
                r["started"] = True
                if self.prefix_cache:
                    while (r["done"] + self.block < len(r["prompt"])
                           and tuple(r["prompt"][:r["done"] + self.block]) in self.cached):
                        r["done"] += self.block
            if r["done"] < len(r["prompt"]):
                r["done"] = min(len(r["prompt"]), r["done"] + (self.budget or len(r["prompt"])))
                for end in range(self.block, r["done"] + 1, self.block):
                    self.cached.add(tuple(r["prompt"][:end]))
            if r["done"] == len(r["prompt"]):
                r["generated"] += 1
        held = set().union(*[self._keys(r) for r in self.running]) if self.running else set()
        self.usage = 100.0 * len(held) / self.pool
        self.most = max(self.most, self.usage)
        for r in list(self.running):
            if r["generated"] >= r["max_new"]:
                self.running.remove(r)
                if r["handle"]() is not None:
                    r["handle"]().status = "GenerationStatus.FINISHED"

    def get_metrics(self):
        return _Metrics(self.usage, self.most)


def _probe(pool):
    return BlockProbe(pool, pool.pool, lambda prompt, max_new: (prompt, max_new), bos=6)


@pytest.mark.parametrize("block", [16, 32])
def test_the_block_size_is_read_off_the_pool(block):
    assert _probe(FakePool(block=block)).block_size() == block


def test_chunked_prefill_is_read_off_the_steps_and_an_unchunked_prefill_states_the_prompt():
    chunked = _probe(FakePool(budget=64)).prefill_steps(100)
    assert chunked == 2 and stated_budget(64, 100, chunked) == 64
    whole = _probe(FakePool(budget=None)).prefill_steps(100)
    assert whole == 1 and stated_budget(64, 100, whole) == 100  # the engine ignored the budget: the evidence fails
    assert stated_budget(64, 68, 2) == 64 and stated_budget(64, 68, 3) == 68


def test_prefix_cache_hits_are_the_blocks_the_pool_did_not_allocate():
    assert _probe(FakePool(prefix_cache=True)).prefix_served(32) == 96
    assert _probe(FakePool(prefix_cache=False)).prefix_served(32) == 0


def test_a_probe_the_engine_does_not_finish_is_an_error_not_a_reading():
    pool = FakePool()
    step = pool.step

    def ignoring_step():  # the engine ends every request unfinished (as it drops one whose handle is gone)
        for r in pool.running:
            r["handle"]().status = "GenerationStatus.IGNORED"
        pool.running.clear()
        step()

    pool.step = ignoring_step
    with pytest.raises(RuntimeError, match="IGNORED, not finished"):
        _probe(pool).prefill_steps(40)


def test_condition_knobs_map_to_the_scheduler_and_the_rest_are_named():
    cfg = ovad.ADAPTER.config("control")
    chunked = ovad.scheduler_options(cfg, condition("chunked-prefill"))
    assert chunked["max_num_batched_tokens"] == 64 and chunked["dynamic_split_fuse"] is True
    assert chunked["enable_prefix_caching"] is False and chunked["num_kv_blocks"] == ovad.CONDITION_POOL
    assert chunked["cache_size"] == 0
    assert ovad.scheduler_options(cfg, condition("prefix-cache"))["enable_prefix_caching"] is True
    assert ovad.scheduler_options(cfg, condition("preemption"))["num_kv_blocks"] == 24
    with pytest.raises(NotImplementedError, match="context_shift"):
        ovad.scheduler_options(cfg, condition("context-shift"))
    with pytest.raises(NotImplementedError, match="128 positions"):
        ovad.scheduler_options(cfg, condition("long-prefix-cache"))
    assert set(ovad.ADAPTER.conditions) == {"block-boundary", "chunked-prefill", "prefix-cache", "distinct-prompts"}
    assert all("control-cold" in ovad.ADAPTER.conditions[c] for c in ("prefix-cache", "distinct-prompts"))
    assert "max_model_len" in ovad.ADAPTER.absent_knobs
