"""Self-checks of chapter 04 (KV cache): the source chapter's self-check question 2
(Llama-3-70B's KV bytes per token and per 4K request) in three steps, our own model's cache, MLA,
the work a cache saves, the learner's own cached generation loop, and the KV budget on a GPU (fp8
KV, utilisation)."""

from __future__ import annotations

import functools
from typing import Any

from llmlab.analysis import costs
from llmlab.config import get_config
from llmlab.course.check.ch01 import combine_mistakes
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    check_number,
    not_yet,
    passed,
    report,
    staged,
)
from llmlab.i18n import tr

PRESET = "llama-3-70b"  # 80 layers, hidden 8192, 64 query heads, 8 KV heads, head_dim 128
DTYPE_BYTES = 2  # BF16
REQUEST_TOKENS = 4096
PROMPT_LEN, NEW_TOKENS = 20, 100  # as in chapter 03's exercise

# the KV-calculator task: Llama-3-8B, BF16 weights on an H100, fp8 KV cache, 16K-token requests
BUDGET_MODEL, BUDGET_GPU, BUDGET_CONTEXT = "llama-3-8b", "H100-SXM", 16384
BUDGET_UTILIZATION, BUDGET_ACTIVATION_GB = 0.9, 1.0
# the utilisation question: Llama-3-8B, BF16 weights and KV, on a 24 GB L4
GAIN_GPU, GAIN_FROM, GAIN_TO = "L4", 0.90, 0.95


def _kv_mistakes(cfg, scale: float) -> list[tuple[float, str]]:
    """Typical wrong KV answers, each `scale` × (bytes per token per layer of that mistake)."""
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    from_hidden = costs.kv_bytes_per_token_from_hidden(cfg, DTYPE_BYTES) / cfg.num_hidden_layers
    return combine_mistakes(
        (
            from_hidden * scale,
            tr(
                "that uses the hidden size: with GQA only the KV heads are cached "
                "(num_kv_heads × head_dim per K or V), not hidden_size.",
                "这里用了 hidden size：有了 GQA，只缓存 KV 头（K、V 各 num_kv_heads × "
                "head_dim 个数），不是 hidden_size。",
            ),
        ),
        (
            per_layer / 2 * scale,
            tr(
                "that stores only one of K and V: the factor 2 for K and V is missing.",
                "这只存了 K、V 中的一个：少了 K 和 V 两份的那个因子 2。",
            ),
        ),
        (
            per_layer * 8 * scale,
            tr(
                "that is bits, not bytes: BF16 is 2 bytes per number.",
                "这是 bit 数，不是 byte 数：BF16 每个数占 2 个字节。",
            ),
        ),
        (
            per_layer / DTYPE_BYTES * scale,
            tr(
                "that counts numbers, not bytes: multiply by 2 bytes per BF16 number.",
                "这是数值的个数，不是字节数：每个 BF16 数值占 2 个字节，要乘上去。",
            ),
        ),
        (
            per_layer * 2 * scale,
            tr(
                "that uses 4 bytes per number (FP32); the cache here is BF16.",
                "这里每个数按 4 个字节（FP32）算了；本题的 KV cache 是 BF16。",
            ),
        ),
        (
            per_layer * cfg.num_attention_heads / cfg.num_key_value_heads * scale,
            tr(
                "that uses the query heads; K and V exist only for the KV heads (GQA).",
                "这里用的是 query 头；只有 KV 头才有 K 和 V（GQA）。",
            ),
        ),
    )


def kv_bytes_per_token_per_layer(answer: Any) -> CheckResult:
    """Llama-3-70B, BF16: KV cache bytes of one token in one layer."""
    cfg = get_config(PRESET)
    expected = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    return check_number(
        "ch04.kv_bytes_per_token_per_layer",
        answer,
        expected,
        rel=1e-3,
        mistakes=_kv_mistakes(cfg, 1),
        default_hint=tr(
            "not the bytes one token keeps in one layer; count what is "
            "cached per KV head, for both tensors, in bytes.",
            "不是一个 token 在一层里占的字节数；数一数每个 KV 头缓存了"
            "什么，两个张量都要算，单位是字节。",
        ),
        formula=tr(
            "2 (K and V) × num_kv_heads × head_dim × bytes per number.",
            "2（K 和 V）× num_kv_heads × head_dim × 每个数的字节数。",
        ),
    )


def kv_bytes_per_token(answer: Any) -> CheckResult:
    """Llama-3-70B, BF16: KV cache bytes of one token over the whole model."""
    cfg = get_config(PRESET)
    expected = costs.kv_bytes_per_token(cfg, DTYPE_BYTES)
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    mistakes = _kv_mistakes(cfg, cfg.num_hidden_layers) + [
        (
            per_layer,
            tr(
                "that is one layer; every one of the layers keeps its own K and V.",
                "这只是一层；每一层都各自存着自己的 K 和 V。",
            ),
        ),
    ]
    return check_number(
        "ch04.kv_bytes_per_token",
        answer,
        expected,
        rel=1e-3,
        mistakes=mistakes,
        default_hint=tr(
            "not the bytes of one token over the whole model; start from one layer.",
            "不是一个 token 在整个模型里占的字节数；从一层算起。",
        ),
        formula=tr(
            "bytes per token per layer × number of layers.", "每个 token 每层的字节数 × 层数。"
        ),
    )


def kv_gb_for_request(answer: Any) -> CheckResult:
    """Llama-3-70B, BF16: KV cache of one REQUEST_TOKENS-token request, in GB (1 GB = 1e9 bytes)."""
    cfg = get_config(PRESET)
    expected = costs.kv_bytes(cfg, REQUEST_TOKENS, DTYPE_BYTES) / 1e9
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    scale = REQUEST_TOKENS * cfg.num_hidden_layers / 1e9
    binary = expected * 1e9 / 2**30
    mixed = expected * 1e9 / 1024 / 1e6 / 1.024  # KB as 1024 B, then 1 GB = 1,024,000 KB
    mixed2 = expected * 1e9 / 1024 / 1e6  # KB as 1024 B, then 1 GB = 1e6 KB
    mistakes = _kv_mistakes(cfg, scale) + [
        (
            per_layer * REQUEST_TOKENS / 1e9,
            tr(
                "that is one layer; every layer keeps its own K and V.",
                "这只是一层；每一层都各自存着自己的 K 和 V。",
            ),
        ),
        (
            binary,
            tr(
                "that is GiB (2**30 bytes); the question asks for GB (1e9 bytes).",
                "这是 GiB（2**30 字节）；题目问的是 GB（1e9 字节）。",
            ),
        ),
        (
            mixed,
            tr(
                "mixed prefixes: KB taken as 1024 bytes, then GB as a thousand-fold of that; "
                "convert from bytes with 1 GB = 1e9 bytes.",
                "单位前缀混用了：KB 按 1024 字节算，再按千倍往上折算到 GB；请直接从字节换算，"
                "1 GB = 1e9 字节。",
            ),
        ),
        (
            mixed2,
            tr(
                "mixed prefixes: KB taken as 1024 bytes but GB as 1e6 KB; convert from bytes "
                "with 1 GB = 1e9 bytes.",
                "单位前缀混用了：KB 按 1024 字节算，GB 却按 1e6 KB 算；请直接从字节换算，"
                "1 GB = 1e9 字节。",
            ),
        ),
    ]
    return check_number(
        "ch04.kv_gb_for_request",
        answer,
        expected,
        rel=5e-3,
        mistakes=mistakes,
        default_hint=tr(
            "not the GB of one 4K-token request; work in bytes first, convert at the end.",
            "不是一个 4K token 请求的 GB 数；先用字节算，最后再换算。",
        ),
        formula=tr(
            "bytes per token (all layers) × tokens, then divide by 1e9.",
            "每个 token 的字节数（所有层）× token 数，再除以 1e9。",
        ),
    )


def smollm2_kv_bytes_per_token(answer: Any) -> CheckResult:
    """Our model, SmolLM2-135M, runs in float32 (4 bytes): KV cache bytes per token, all layers."""
    cfg = get_config("smollm2-135m")
    expected = costs.kv_bytes_per_token(cfg, 4)
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, 4)
    return check_number(
        "ch04.smollm2_kv_bytes_per_token",
        answer,
        expected,
        rel=1e-3,
        mistakes=combine_mistakes(
            (
                costs.kv_bytes_per_token_from_hidden(cfg, 4),
                tr(
                    "that uses the hidden size; only the KV heads are cached (GQA).",
                    "这里用了 hidden size；只有 KV 头会被缓存（GQA）。",
                ),
            ),
            (
                expected / 2,
                tr("the factor 2 for K and V is missing.", "少了 K 和 V 两份的那个因子 2。"),
            ),
            (
                costs.kv_bytes_per_token(cfg, 2),
                tr(
                    "that uses 2 bytes per number; our model runs in float32.",
                    "这里每个数按 2 个字节算了；我们的模型用 float32 运行。",
                ),
            ),
            (
                per_layer,
                tr(
                    "that is one layer; multiply by the number of layers.",
                    "这只是一层；还要乘以层数。",
                ),
            ),
            (
                expected * cfg.num_attention_heads / cfg.num_key_value_heads,
                tr(
                    "that uses the query heads; K and V exist only for the KV heads (GQA).",
                    "这里用的是 query 头；只有 KV 头才有 K 和 V（GQA）。",
                ),
            ),
        ),
        default_hint=tr(
            "read layers, KV heads and head_dim from model.config; 4 bytes per float32.",
            "从 model.config 里读出层数、KV 头数和 head_dim；每个 float32 占 4 个字节。",
        ),
        formula=tr(
            "2 × layers × KV heads × head_dim × 4 bytes.",
            "2 × 层数 × KV 头数 × head_dim × 4 字节。",
        ),
    )


def mla_kv_bytes_per_token(answer: Any) -> CheckResult:
    """DeepSeek-V3 (MLA, BF16): KV cache bytes per token, all layers. Per layer it caches one
    latent vector of kv_lora_rank numbers plus one shared RoPE key of qk_rope_head_dim numbers."""
    cfg = get_config("deepseek-v3")
    expected = costs.kv_bytes_per_token(cfg, DTYPE_BYTES)
    e = cfg.extra
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    return check_number(
        "ch04.mla_kv_bytes_per_token",
        answer,
        expected,
        rel=1e-3,
        mistakes=combine_mistakes(
            (
                2 * expected,
                tr(
                    "MLA caches one latent per token, not a separate K and V: no factor 2.",
                    "MLA 每个 token 只缓存一个 latent 向量，没有分开的 K 和 V：不用乘 2。",
                ),
            ),
            (
                e["kv_lora_rank"] * DTYPE_BYTES * cfg.num_hidden_layers,
                tr(
                    "the shared RoPE key (qk_rope_head_dim) is cached too, next to the latent.",
                    "共享的 RoPE key（qk_rope_head_dim）也要缓存，和 latent 向量放在一起。",
                ),
            ),
            (
                per_layer,
                tr(
                    "that is one layer; multiply by the number of layers.",
                    "这只是一层；还要乘以层数。",
                ),
            ),
            (
                costs.kv_variants(cfg, DTYPE_BYTES)["MHA"],
                tr(
                    "that is what plain multi-head attention "
                    "would cache; MLA caches the latent instead.",
                    "这是普通多头注意力要缓存的量；MLA 缓存的是 latent 向量。",
                ),
            ),
        ),
        default_hint=tr(
            "not what MLA caches per token; list what one layer keeps for one token.",
            "不是 MLA 每个 token 缓存的量；列出一层为一个 token 存了哪些东西。",
        ),
        formula=tr(
            "(kv_lora_rank + qk_rope_head_dim) × bytes per number × layers.",
            "(kv_lora_rank + qk_rope_head_dim) × 每个数的字节数 × 层数。",
        ),
    )


def tokens_processed_with_cache(answer: Any) -> CheckResult:
    """With a KV cache, how many token positions go through the model in total while generating
    NEW_TOKENS tokens from a PROMPT_LEN-token prompt?"""
    p, n = PROMPT_LEN, NEW_TOKENS
    expected = p + (n - 1)
    return check_number(
        "ch04.tokens_processed_with_cache",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (
                p + n,
                tr(
                    "the last generated token is never fed back in: it is sampled and the loop ends.",
                    "最后生成的那个 token 不会再喂回模型：它一被采样出来，循环就结束了。",
                ),
            ),
            (
                n,
                tr(
                    "the prompt goes through the model once too (prefill), all of its tokens.",
                    "prompt 也要过一遍模型（prefill），而且是它的全部 token。",
                ),
            ),
            (
                sum(p + i for i in range(n)),
                tr(
                    "that is without the cache: with it, each token goes through once.",
                    "这是没有 KV cache 时的数：有了它，每个 token 只过一遍。",
                ),
            ),
        ],
        default_hint=tr(
            "count the positions fed in each forward, the first one included.",
            "数一数每次前向计算喂进去几个位置，第一次也要算上。",
        ),
        formula=tr(
            "prefill feeds the prompt once; each later forward feeds only the newest token.",
            "prefill 把 prompt 喂一次；之后每次前向计算只喂最新的那个 token。",
        ),
    )


# --------------------------------------------------------------------------- the learner's cache

GEN_PROMPT = "The KV cache keeps the keys and values of earlier tokens, so"
GEN_NEW_TOKENS = 12


@functools.lru_cache(maxsize=1)
def _reference_text() -> tuple[str, tuple[str, ...]]:
    """generate_with_cache's greedy continuation of GEN_PROMPT on SmolLM2: (text, token pieces)."""
    from llmlab.generate import generate_with_cache
    from llmlab.model import load_model
    from llmlab.sampling import SamplingParams

    model, tok = load_model("smollm2-135m")
    prompt = tok.encode(GEN_PROMPT, add_special_tokens=False)
    ids = generate_with_cache(
        model,
        prompt,
        max_new_tokens=GEN_NEW_TOKENS,
        params=SamplingParams(temperature=0.0, ignore_eos=True),
    ).token_ids
    return tok.decode(ids), tuple(tok.decode(ids[: k + 1]) for k in range(len(ids)))


def generate_greedy(answer: Any) -> CheckResult:
    """The text of the GEN_NEW_TOKENS tokens the learner's own cached loop generates greedily from
    GEN_PROMPT with SmolLM2 (new tokens only, decoded). Checked against
    `llmlab.generate.generate_with_cache`: identical tokens give identical text."""
    ex = "ch04.generate_greedy"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if not isinstance(answer, str):
        return report(
            not_yet(
                ex,
                tr(
                    f"answer with the decoded text of the new tokens (a str), got "
                    f"{type(answer).__name__}.",
                    f"请用新 token 解码后的文本（一个 str）作答，你给的是 "
                    f"{type(answer).__name__}。",
                ),
            )
        )
    text, prefixes = _reference_text()
    if answer == text:
        return report(
            passed(
                ex,
                tr(
                    "the same tokens as generate_with_cache.",
                    "和 generate_with_cache 生成的 token 完全相同。",
                ),
            )
        )
    if answer.startswith(GEN_PROMPT) or GEN_PROMPT in answer:
        return report(
            not_yet(
                ex,
                tr(
                    "decode the new tokens only, without the prompt.",
                    "只解码新生成的 token，不要带上 prompt。",
                ),
            )
        )
    if not answer.startswith(prefixes[0]):
        return report(
            not_yet(
                ex,
                staged(
                    ex,
                    tr(
                        "the first token already differs: the prefill (the "
                        "whole prompt through every layer) is wrong.",
                        "第一个 token 就不一样了：prefill（整个 prompt 过每一层）有错。",
                    ),
                    tr(
                        "Check that positions start at 0, that "
                        "each query sees keys up to its own position only, and that each layer appends its "
                        "own K and V.",
                        "检查三件事：位置从 0 开始；每个 query 只看到它自己位置及之前的 key；每一层追加的是"
                        "它自己的 K 和 V。",
                    ),
                ),
            )
        )
    return report(
        not_yet(
            ex,
            staged(
                ex,
                tr(
                    "the first token is right, later ones differ: a decode "
                    "step is wrong (or the number of new tokens is).",
                    "第一个 token 对了，后面的不一样：某个 decode 步有错（或者新 token 的个数不对）。",
                ),
                tr(
                    "A decode step feeds only the newest "
                    "token, at the position equal to the number of cached tokens, and its query attends over "
                    "every cached K/V (prompt and earlier tokens).",
                    "decode 的一步只喂最新的那个 token，它的位置等于已缓存的 token 数；它的 query 要对所有"
                    "已缓存的 K/V（prompt 和之前生成的 token）做注意力。",
                ),
            ),
        )
    )


# --------------------------------------------------------------------------- the KV budget


def _budget_case(dtype: str, util: float = BUDGET_UTILIZATION) -> float:
    from llmlab.analysis.kv_budget import kv_summary

    cfg = get_config(BUDGET_MODEL)
    s = kv_summary(
        cfg.num_hidden_layers,
        cfg.num_key_value_heads,
        cfg.head_dim,
        dtype,
        BUDGET_CONTEXT,
        1,
        BUDGET_GPU,
        weight_bytes=costs.weight_bytes(cfg, 2),
        gpu_memory_utilization=util,
        activation_bytes=BUDGET_ACTIVATION_GB * 1e9,
    )
    return s.max_requests


def max_requests_fp8(answer: Any) -> CheckResult:
    """The KV-calculator task: how many BUDGET_CONTEXT-token Llama-3-8B requests fit at once on an
    H100 (BF16 weights on the card, BUDGET_ACTIVATION_GB GB of activations, utilisation
    BUDGET_UTILIZATION) with an fp8 KV cache?"""
    expected = _budget_case("fp8")
    cfg = get_config(BUDGET_MODEL)
    per_request = costs.kv_bytes(cfg, BUDGET_CONTEXT, 1)
    hbm = 80e9
    w = costs.weight_bytes(cfg, 2)
    return check_number(
        "ch04.max_requests_fp8",
        answer,
        expected,
        rel=0.005,
        mistakes=combine_mistakes(
            (
                _budget_case("bf16"),
                tr(
                    "that is with a BF16 cache (2 bytes per number); set the KV dtype to fp8.",
                    "这是 BF16 KV cache（每个数 2 个字节）的结果；把 KV 的 dtype 设成 fp8。",
                ),
            ),
            (
                int(hbm * BUDGET_UTILIZATION // per_request),
                tr(
                    "the weights are on the GPU too: tick the box that puts them there.",
                    "权重也在 GPU 上：勾选把权重放上 GPU 的那个选项。",
                ),
            ),
            (
                int((hbm * BUDGET_UTILIZATION - w) // per_request),
                tr(
                    "the activations take memory too: enter them in the activations box.",
                    "激活值也占显存：把它填进激活值那一栏。",
                ),
            ),
            (
                int((hbm - w - BUDGET_ACTIVATION_GB * 1e9) // per_request),
                tr(
                    "that uses the whole card; the engine keeps only the utilisation share.",
                    "这用了整张卡；引擎只用利用率设定的那一份。",
                ),
            ),
        ),
        default_hint=tr(
            "not the count the calculator shows for this case; check the model preset, "
            "GPU, context, KV dtype, the weights box, the activations and the utilisation.",
            "不是计算器在这种设置下显示的数；检查模型预设、GPU、上下文长度、KV dtype、"
            "权重选项、激活值和利用率。",
        ),
        formula=tr(
            "KV budget = utilisation × GPU memory − weights − activations; divide by the bytes "
            "of one request's KV cache and round down.",
            "KV 预算 = 利用率 × GPU 显存 − 权重 − 激活值；再除以一个请求的 KV cache 字节数，"
            "向下取整。",
        ),
    )


def _gain_budget(util: float) -> float:
    from llmlab.analysis.kv_budget import kv_budget_bytes

    return kv_budget_bytes(GAIN_GPU, util, costs.weight_bytes(get_config(BUDGET_MODEL), 2))


def utilization_gain(answer: Any) -> CheckResult:
    """Llama-3-8B (BF16 weights and KV) on an L4: raising the utilisation from GAIN_FROM to
    GAIN_TO multiplies the number of requests that fit by about what factor?"""
    expected = _gain_budget(GAIN_TO) / _gain_budget(GAIN_FROM)
    return check_number(
        "ch04.utilization_gain",
        answer,
        expected,
        rel=0.01,
        mistakes=[
            (
                GAIN_TO / GAIN_FROM,
                tr(
                    "that scales the whole card; the weights stay the same size, so only "
                    "what is left after them grows, and it grows by the same GB.",
                    "这是把整张卡按比例放大了；权重大小不变，所以只有扣掉权重后剩下的"
                    "部分在增长，而且增长的 GB 数和整张卡增长的一样。",
                ),
            ),
            (
                1.0,
                tr(
                    "more utilisation is more memory for the cache: the count does grow.",
                    "利用率提高，留给 KV cache 的显存就多了：能放下的请求数确实会增加。",
                ),
            ),
            (
                _gain_budget(GAIN_FROM) / _gain_budget(GAIN_TO),
                tr(
                    "upside down: the new budget over the old one.",
                    "颠倒了：应该是新预算除以旧预算。",
                ),
            ),
        ],
        default_hint=tr(
            "not the factor; compare the KV budget after the change with the one before.",
            "不是这个倍数；拿改动后的 KV 预算和改动前的比一比。",
        ),
        formula=tr(
            "(utilisation × GPU memory − weights) at the new setting ÷ the same at the old one.",
            "新设置下的 (利用率 × GPU 显存 − 权重) ÷ 旧设置下的同一个量。",
        ),
    )


EXERCISES: dict[str, ExerciseInfo] = {
    "kv_bytes_per_token_per_layer": ExerciseInfo(
        "plug-in",
        (
            "hidden size instead of KV heads",
            "K without V",
            "bits vs bytes",
            "numbers vs bytes",
            "FP32 instead of BF16",
            "query heads instead of KV heads",
        ),
        source_question=2,
    ),
    "kv_bytes_per_token": ExerciseInfo(
        "plug-in",
        ("one layer only", "hidden size instead of KV heads", "K without V", "bits vs bytes"),
        source_question=2,
    ),
    "kv_gb_for_request": ExerciseInfo(
        "plug-in",
        (
            "GiB vs GB",
            "mixed KB/GB prefixes",
            "one layer only",
            "hidden size instead of KV heads",
            "K without V",
        ),
        source_question=2,
    ),
    "smollm2_kv_bytes_per_token": ExerciseInfo(
        "plug-in",
        (
            "hidden size instead of KV heads",
            "K without V",
            "2 bytes instead of 4",
            "one layer only",
            "query heads",
        ),
    ),
    "mla_kv_bytes_per_token": ExerciseInfo(
        "plug-in", ("a factor 2 for K and V", "RoPE key forgotten", "one layer only", "MHA size")
    ),
    "tokens_processed_with_cache": ExerciseInfo(
        "reasoning", ("last token fed back", "prompt forgotten", "counted without the cache")
    ),
    "generate_greedy": ExerciseInfo(
        "reasoning",
        (
            "wrong prefill (positions, mask)",
            "wrong decode step",
            "prompt returned with the new tokens",
        ),
    ),
    "max_requests_fp8": ExerciseInfo(
        "plug-in", ("BF16 cache", "weights left out", "activations left out", "whole card used")
    ),
    "utilization_gain": ExerciseInfo("reasoning", ("scaled the whole card", "upside down")),
}
