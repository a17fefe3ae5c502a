"""`EngineConfig` states every engine default once: the scheduler, the KV cache manager, the block
pool and `serve`'s options take theirs from its fields, never a number of their own."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest

from llmlab.config.engine import EngineConfig
from llmlab.core.scheduler import Scheduler
from llmlab.engine import EngineConfig as EngineConfigFromEngine
from llmlab.kvcache import BlockPool, KVCacheManager
from llmlab.serve.launch import engine_kwargs, parser
from llmlab.spec_decode import SpeculativeConfig

DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}

# (function, its parameter) -> the EngineConfig field whose default it takes
TAKES = {
    (KVCacheManager.__init__, "block_size"): "block_size",
    (KVCacheManager.__init__, "enable_caching"): "enable_prefix_caching",
    (BlockPool.__init__, "enable_caching"): "enable_prefix_caching",
    (Scheduler.__init__, "enable_chunked_prefill"): "enable_chunked_prefill",
    (Scheduler.__init__, "scheduling"): "scheduling",
}


def test_the_public_names_are_the_one_class():
    """`llmlab.engine.EngineConfig` and `llmlab.spec_decode.SpeculativeConfig`, as the public
    API names them, are the classes defined in `llmlab.config.engine`."""
    from llmlab.config.engine import SpeculativeConfig as defined

    assert EngineConfigFromEngine is EngineConfig
    assert SpeculativeConfig is defined


@pytest.mark.parametrize(
    ("func", "param"), list(TAKES), ids=lambda x: getattr(x, "__qualname__", x)
)
def test_a_default_is_the_engine_configs(func, param):
    field = TAKES[(func, param)]
    assert inspect.signature(func).parameters[param].default == DEFAULTS[field]


@pytest.mark.parametrize(
    ("func", "param"), list(TAKES), ids=lambda x: getattr(x, "__qualname__", x)
)
def test_a_default_is_written_as_the_field_not_as_a_value(func, param):
    """Equal today is not enough: `block_size: int = 16` would drift the day EngineConfig's
    default changes. The default must be spelled `EngineConfig.<field>`."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    args = tree.body[0].args
    positional = args.posonlyargs + args.args
    defaults = dict(
        zip(
            [a.arg for a in positional[len(positional) - len(args.defaults) :]],
            args.defaults,
            strict=True,
        )
    )
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)})
    assert ast.unparse(defaults[param]) == f"EngineConfig.{TAKES[(func, param)]}"


def test_built_without_the_arguments_they_use_the_engine_defaults():
    mgr = KVCacheManager(num_blocks=4)
    assert mgr.block_size == EngineConfig.block_size
    assert mgr.enable_caching is EngineConfig.enable_prefix_caching
    assert mgr.block_pool.enable_caching is EngineConfig.enable_prefix_caching
    sched = Scheduler(mgr, max_num_seqs=2, max_num_batched_tokens=32, max_model_len=64)
    assert sched.enable_chunked_prefill is EngineConfig.enable_chunked_prefill
    assert sched.scheduling == EngineConfig.scheduling


def test_serve_options_default_to_the_engine_config():
    kwargs = engine_kwargs(parser().parse_args([]))
    assert kwargs == {name: DEFAULTS[name] for name in kwargs}


def test_the_engine_config_defaults_are_valid():
    assert EngineConfig() == EngineConfig(**DEFAULTS)
