"""Chapter 11's build exercise, the block pool (llmlab.course.build.ch11_pool, the checker
ch11.block_pool): the injection point KVCacheManager(block_pool=...) / LLM(block_pool_cls=...),
the notebook's solution agreeing with the package on the drawn cases and in the engine, and the
grader's sandbox. The planted bugs and their hints: tests/test_planted_bugs.py."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from planted import ch11 as ch11_planted

from llmlab.core.request import Request
from llmlab.course.build import ch11_pool
from llmlab.course.build.core import find_counterexample
from llmlab.course.check import ch11
from llmlab.kvcache import BlockPool, KVCacheManager
from llmlab.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
SKELETON_ID = "ch11-build-pool-code"


def solution_source() -> str:
    """The instructor's skeleton cell of notebooks/11-vllm-arrives.ipynb, solution filled in."""
    nb = nbformat.read(ROOT / "notebooks" / "11-vllm-arrives.ipynb", as_version=4)
    return next(c.source for c in nb.cells if c.id == SKELETON_ID)


def _swap(source: str, old: str, new: str) -> str:
    assert old in source, f"the solution no longer has {old!r}"
    return source.replace(old, new, 1)


# the planted bugs (tests/planted/ch11.py) that the engine and the grader's sandbox run here
POOL = next(ex for ex in ch11_planted.EXERCISES if ex.id == "ch11.block_pool")
HASH_KEPT = POOL.bug("hash_kept_on_reuse").source


def define(source: str, tmp_path: Path | None = None) -> type:
    """The class MyBlockPool that `source` defines, as a notebook would (module __main__; with
    `tmp_path`, from a file, so that its source can be read back for the sandbox)."""
    namespace = {"__name__": "__main__"}
    filename = "<pool>"
    if tmp_path is not None:
        path = tmp_path / f"pool_{abs(hash(source))}.py"
        path.write_text(source)
        filename = str(path)
    exec(compile(source, filename, "exec"), namespace)
    return namespace["MyBlockPool"]


pytestmark = pytest.mark.usefixtures("first_try")  # each test: a first try, in English


# ---------------------------------------------------------------------------- the injection point


class CountingPool(BlockPool):
    calls = 0

    def get_new_blocks(self, num_blocks):
        type(self).calls += 1
        return super().get_new_blocks(num_blocks)


def test_manager_makes_the_given_pool_class_or_uses_the_instance():
    mgr = KVCacheManager(8, 4, block_pool=CountingPool)
    assert type(mgr.block_pool) is CountingPool and mgr.block_pool.num_blocks == 8
    pool = BlockPool(8)
    assert KVCacheManager(8, 4, block_pool=pool).block_pool is pool
    assert type(KVCacheManager(8, 4).block_pool) is BlockPool
    req = Request("r", list(range(9)), SamplingParams(), arrival_time=0.0)
    CountingPool.calls = 0
    assert mgr.allocate_slots(req, 9) is not None and CountingPool.calls == 1


@pytest.mark.parametrize(
    "bad, words",
    [
        (int, "the class int has no"),
        (object(), "got object, which has no"),
        (BlockPool(7), "num_blocks=8"),
    ],
)
def test_manager_rejects_a_pool_without_the_interface_naming_block_pool(bad, words):
    with pytest.raises(ValueError, match="block_pool") as e:
        KVCacheManager(8, 4, block_pool=bad)
    assert words in str(e.value)


def test_a_pool_instance_takes_no_second_hash_fn():
    with pytest.raises(ValueError, match="block_pool is an instance"):
        KVCacheManager(8, 4, block_pool=BlockPool(8), hash_fn=hash)


def test_engine_config_wants_a_class_naming_block_pool_cls():
    from llmlab.config import EngineConfig

    with pytest.raises(ValueError, match="block_pool_cls"):
        EngineConfig(block_pool_cls=BlockPool(4))
    assert EngineConfig(block_pool_cls=CountingPool).block_pool_cls is CountingPool


def test_the_engine_runs_on_the_given_pool_with_the_same_tokens():
    from llmlab import LLM
    from llmlab.model import tiny_model

    model = tiny_model(seed=1)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 1], [5, 6, 7, 8, 9, 10, 11, 12, 2]]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    kw = dict(block_size=4, num_kv_blocks=16, max_model_len=32, attention_backend="torch")
    CountingPool.calls = 0
    llm = LLM(model, block_pool_cls=CountingPool, **kw)
    ours = llm.generate(prompts, params, use_tqdm=False)
    assert type(llm.llm_engine.kv_cache_manager.block_pool) is CountingPool
    assert CountingPool.calls > 0
    assert llm.llm_engine.stats()["prefix_cache_hits"] > 0
    theirs = LLM(model, **kw).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in ours] == [o.outputs[0].token_ids for o in theirs]


# ---------------------------------------------------------------------------- the properties


def test_the_skeleton_cell_is_a_definition_cell_and_short():
    from llmlab.course.check.cli import _is_definition_cell

    src = solution_source()
    assert _is_definition_cell(src)
    filled, inside = 0, False
    for line in src.splitlines():
        if "END SOLUTION" in line:
            inside = False
        if inside:
            filled += 1
        if "BEGIN SOLUTION" in line:
            inside = True
    assert 0 < filled <= 40, f"the student fills {filled} lines; at most 40"


def test_the_solution_agrees_with_the_package_on_every_drawn_case():
    pool = define(solution_source())
    cex = find_counterexample(
        ch11_pool.pool_cases(),
        lambda case: ch11_pool.observe_pool(pool, case),
        lambda case: ch11_pool.observe_pool(ch11_pool.REFERENCE_POOL, case),
        max_examples=ch11.POOL_MAX_EXAMPLES,
    )
    assert cex is None, cex


def test_the_same_step_case_leaves_two_blocks_under_one_hash():
    case = (4, [("together", "A", "B", "pq")])
    seen = ch11_pool.observe_pool(ch11_pool.REFERENCE_POOL, case)
    assert seen[0][0] == [[[0, 1], 0], [[2, 3], 0]]
    assert seen[0][3] == [[0, "h1"], [1, "h2"], [2, "h1"], [3, "h2"]]
    assert ch11_pool.observe_pool(define(solution_source()), case) == seen


def test_an_unfilled_skeleton_is_not_yet_without_a_crash():
    from llmlab.course.instructor.student import strip_source

    student, _ = strip_source(solution_source())
    result = ch11.block_pool(define(student))
    # the shrunk case's first step is a request arriving, whose lookup comes before its
    # allocation: the hint names the first method of the skeleton that step calls
    assert not result.passed and "find_cached_blocks returned NoneType" in result.message
    assert not ch11.block_pool(None).passed
    assert "MyBlockPool" in ch11.block_pool(3).message


# ---------------------------------------------------------------------------- plugged in (the model)


@pytest.mark.slow
@pytest.mark.model
def test_the_solution_in_the_engine_gives_the_packages_tokens_and_is_measured(record_driver):
    pool = define(solution_source())
    runs = record_driver(ch11_pool, "run_engine", pool)  # the checker's run of it, read below
    result = ch11.block_pool(pool)
    assert len(runs) == 1, result.message  # the checker stops before it on a wrong answer
    [got] = runs
    ref = ch11_pool.run_engine(BlockPool)
    assert got["tokens"] == ref["tokens"] and all(len(t) == 4 for t in got["tokens"].values())
    assert got["hit_rate"] == pytest.approx(ref["hit_rate"]) and got["hit_rate"] > 0.2
    assert got["peak_blocks"] == ref["peak_blocks"] == got["num_blocks"]
    assert result.passed
    for words in ("prefix-cache hit rate", "blocks held at peak", "No speed is compared"):
        assert words in result.message
    assert "x the package's speed" not in result.message  # one noisy run is no comparison


@pytest.mark.slow
@pytest.mark.model
def test_the_workload_evicts_and_a_kept_hash_serves_wrong_tokens():
    class Evictions(BlockPool):
        count = 0

        def _evict_cached_block(self, block):
            type(self).count += 1
            super()._evict_cached_block(block)

    ref = ch11_pool.run_engine(Evictions)
    assert Evictions.count > 0
    stale = ch11_pool.run_engine(define(HASH_KEPT))
    assert stale["tokens"] != ref["tokens"]


# ---------------------------------------------------------------------------- the grader, the CLI


def _sandboxed(pool: type):
    from llmlab.course.instructor.answers import encode
    from llmlab.course.instructor.recheck import SandboxedFunction

    return SandboxedFunction(encode(pool)["__function__"], timeout_s=120)


@pytest.mark.slow
def test_the_grader_fails_a_planted_bug_through_the_sandbox(tmp_path):
    stand_in = _sandboxed(define(HASH_KEPT, tmp_path))
    try:
        result = ch11.block_pool(stand_in)
    finally:
        stand_in.close()
    assert not result.passed and "still in your prefix cache" in result.message


@pytest.mark.slow
@pytest.mark.model
def test_the_grader_passes_the_solution_through_the_sandbox(tmp_path):
    stand_in = _sandboxed(define(solution_source(), tmp_path))
    try:
        result = ch11.block_pool(stand_in)
    finally:
        stand_in.close()
    assert result.passed, result.message
